// Command worker is silt's worker face: it appends entries to a stream and
// runs short-lived consumers over a consumer group.
package main

import (
	"context"
	"io"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == reaperArg {
		os.Exit(reaperMain(os.Stdin))
	}
	os.Exit(clix.Main(run))
}

// run is main without the process: tests drive it with their own streams.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	app := &cli.App{
		Name:     "worker",
		Usage:    "append to a Redis stream and consume it, losing nothing",
		Commands: []*cli.Command{appendCommand(), runCommand(), deadCommand(), statusCommand(), replayCommand(), kindCommand()},
	}
	return clix.Run(ctx, app, args, stdin, stdout, stderr)
}
