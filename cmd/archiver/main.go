// Command archiver is silt's archive face: it reads a stream's history and
// folds old entries into object storage before trimming.
package main

import (
	"context"
	"io"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
)

func main() { os.Exit(clix.Main(run)) }

// run is main without the process: tests drive it with their own streams.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	app := &cli.App{
		Name:     "archiver",
		Usage:    "archive a Redis stream to object storage, trim it, and read its whole history",
		Commands: []*cli.Command{runCommand(), readCommand(), exportCommand(), statusCommand(), verifyCommand(), pullCommand(), compactCommand(), reindexCommand(), policyCommand(), gcCommand(), trimCommand()},
	}
	return clix.Run(ctx, app, args, stdin, stdout, stderr)
}
