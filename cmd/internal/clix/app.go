package clix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/graft"
	"github.com/silt-dev/silt/pkg/stream"
)

// Main runs a command's run function as the process: SIGINT and SIGTERM
// cancel its context (the run decides what stopping means), the process's
// arguments and standard streams are its own. It returns the exit code.
func Main(run func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, os.Args, os.Stdin, os.Stdout, os.Stderr)
}

// PrintJSON writes v to w as one JSON line: a command's result.
func PrintJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

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
		refuseArgs(cmd)
	}
	err := refuseRepeated(app, args)
	if err == nil {
		err = app.RunContext(ctx, args)
	}
	if err == nil {
		return ExitOK
	}
	code := exitCode(err)
	err = withRepair(err)
	if jsonLogs(args) { // the last line is a log line like the others
		slog.New(slog.NewJSONHandler(stderr, nil)).Error(app.Name+" failed", "error", err.Error(), "exit_code", code)
	} else {
		fmt.Fprintf(stderr, "%s: %v\n", app.Name, err)
	}
	return code
}

// refuseArgs makes a command that takes no arguments (no ArgsUsage) refuse
// stray ones as a usage error, rather than ignore them: `worker status
// [--json]` copied from a doc would otherwise print text.
func refuseArgs(cmd *cli.Command) {
	for _, sub := range cmd.Subcommands {
		sub.OnUsageError = cmd.OnUsageError
		refuseArgs(sub)
	}
	if cmd.ArgsUsage != "" || cmd.Action == nil {
		return
	}
	action := cmd.Action
	cmd.Action = func(c *cli.Context) error {
		if c.NArg() > 0 {
			return Usagef("usage", "%s takes no arguments, got %q (flags go before any argument; a handler goes after --)", c.Command.FullName(), c.Args().Slice())
		}
		return action(c)
	}
}

// withRepair adds to err the command or flag that repairs what it names,
// for the faults of an archive any command may meet when it opens one
// (packages graft and archive name the fault and the objects; the commands
// and flags are ours).
func withRepair(err error) error {
	switch {
	case errors.Is(err, graft.ErrDropped):
		return fmt.Errorf("%w (they were dropped by archiver gc --drop-old-commits)", err)
	case errors.Is(err, graft.ErrMissingCommits):
		return fmt.Errorf("%w (repair: copy the named commits back from the bucket's versioning or from a data directory "+
			"that still has them, <data-dir>/<volume>/commits/, or run archiver pull from that directory; archiver verify "+
			"shows what is left; docs/operations.md, \"The remote is behind Redis's record\")", err)
	case errors.Is(err, graft.ErrUnreachable):
		return fmt.Errorf("%w (archiver gc --drop-old-commits removes the commits below a checkpoint)", err)
	case errors.Is(err, archive.ErrNeverRecorded):
		return fmt.Errorf("%w (read it alone with --archive-only; adopt it with archiver run --adopt-remote only if it is this stream's history)", err)
	case errors.Is(err, archive.ErrRemoteBehind):
		return fmt.Errorf("%w (--remote names the remote)", err)
	}
	return err
}

// exitCode is the exit status of a command's error.
func exitCode(err error) int {
	var ue *UsageError
	if errors.As(err, &ue) {
		return ExitUsage
	}
	if errors.Is(err, ErrInterrupted) {
		return ExitInterrupted
	}
	if errors.Is(err, ErrHandlersFailed) {
		return ExitHandlersFailed
	}
	if errors.Is(err, archive.ErrKeptUnarchived) {
		return ExitKeptUnarchived
	}
	var nr *stream.NotReplicatedError
	if errors.As(err, &nr) {
		return ExitNotReplicated
	}
	if errors.Is(err, archive.ErrNotThisArchive) || errors.Is(err, archive.ErrRemoteBehind) || errors.Is(err, graft.ErrForeignRemote) {
		return ExitUnproven
	}
	// urfave/cli returns an ExitCoder only for its own usage errors, such as
	// an unknown command; our actions never do.
	var ee cli.ExitCoder
	if errors.As(err, &ee) {
		return ExitUsage
	}
	return ExitFailure
}

// jsonLogs reports whether --log-format (or its variable) asks for JSON,
// read from the arguments themselves: the final error line may come
// before or without a parsed context.
func jsonLogs(args []string) bool {
	for i, a := range args {
		if a == "--" {
			break
		}
		switch {
		case a == "--"+FlagLogFormat && i+1 < len(args):
			return args[i+1] == "json"
		case strings.HasPrefix(a, "--"+FlagLogFormat+"="):
			return strings.TrimPrefix(a, "--"+FlagLogFormat+"=") == "json"
		}
	}
	for _, name := range EnvVars("LOG_FORMAT") {
		if v, ok := os.LookupEnv(name); ok {
			return v == "json"
		}
	}
	return false
}

// refuseRepeated returns a usage error for a single-valued flag given more
// than once: urfave/cli keeps the last value silently, so `--stream a
// --stream b` would read only b and `--redis A --redis B` talk to B alone.
// Flags that take several values (StringSliceFlag) may repeat. Arguments
// after "--" are a handler's, not ours.
func refuseRepeated(app *cli.App, args []string) error {
	cmds, flags := app.Commands, app.Flags
	seen := map[string]int{}
	var order []string
	for _, a := range args[min(1, len(args)):] {
		if a == "--" {
			break
		}
		if name, ok := flagName(a); ok {
			if seen[name]++; seen[name] == 2 {
				order = append(order, name)
			}
			continue
		}
		for _, c := range cmds {
			if c.HasName(a) {
				cmds, flags = c.Subcommands, c.Flags
				break
			}
		}
	}
	for _, name := range order {
		for _, f := range flags {
			if !slices.Contains(f.Names(), name) {
				continue
			}
			if _, multi := f.(*cli.StringSliceFlag); !multi {
				hint := ""
				if name == FlagRedis {
					hint = " (several Redis URLs go in one --redis, comma-separated)"
				}
				return Usagef("--"+name, "given %d times; it takes one value%s", seen[name], hint)
			}
		}
	}
	return nil
}

// flagName returns the name of a flag argument (-x, --x, --x=v).
func flagName(arg string) (string, bool) {
	if len(arg) < 2 || arg[0] != '-' {
		return "", false
	}
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	return name, name != ""
}
