package clix

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/urfave/cli/v2"
)

// Run runs app with args and returns the exit code: ExitUsage for flag and
// argument errors (naming the flag), ExitFailure for any other error, printed
// as one line on stderr.
func Run(ctx context.Context, app *cli.App, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	app.Reader, app.Writer, app.ErrWriter = stdin, stdout, stderr
	app.ExitErrHandler = func(*cli.Context, error) {} // we choose the exit code, not urfave
	app.OnUsageError = func(_ *cli.Context, err error, _ bool) error {
		return &UsageError{Flag: "usage", Msg: err.Error()}
	}
	for _, cmd := range app.Commands {
		cmd.OnUsageError = app.OnUsageError
	}
	err := app.RunContext(ctx, args)
	if err == nil {
		return ExitOK
	}
	fmt.Fprintf(stderr, "%s: %v\n", app.Name, err)
	var ue *UsageError
	if errors.As(err, &ue) {
		return ExitUsage
	}
	// urfave/cli returns an ExitCoder only for its own usage errors, such as
	// an unknown command; our actions never do.
	var ee cli.ExitCoder
	if errors.As(err, &ee) {
		return ExitUsage
	}
	return ExitFailure
}

// Failpoint turns a SILT_FAILPOINT value NAME:N into a hook that kills the
// process with SIGKILL the Nth time it reaches NAME; it returns nil for an
// empty or malformed value. Crash tests use it; nothing else should.
func Failpoint(spec string) func(string) {
	name, nth, ok := strings.Cut(spec, ":")
	n, err := strconv.Atoi(nth)
	if spec == "" || !ok || err != nil || n < 1 {
		return nil
	}
	var hits atomic.Int64
	return func(at string) {
		if at == name && hits.Add(1) == int64(n) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
}
