package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
	"github.com/silt-dev/silt/internal/telemetry"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/stream"
)

// groupFlags name the group and consumer; run, dead and status share them.
func groupFlags() []cli.Flag {
	host, _ := os.Hostname()
	return []cli.Flag{
		&cli.StringFlag{Name: "group", EnvVars: clix.EnvVars("GROUP"), Usage: "consumer group (required)"},
		&cli.StringFlag{Name: "consumer", EnvVars: clix.EnvVars("CONSUMER"), Value: host, DefaultText: "the host name", Usage: "consumer name"},
	}
}

// handlerFlags choose the handler; run and dead retry share them.
func handlerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "exec", Usage: "run `CMD` (through sh -c) per entry, the delivery as JSON on stdin; or give the command after --"},
		&cli.StringFlag{Name: "pipe", Usage: "start `CMD` (through sh -c) once and keep it: one delivery per line on its stdin, one result per line on its stdout (docs/pipe.md)"},
		&cli.IntFlag{Name: "pipe-restarts", Value: 3, Usage: "restarts of a --pipe co-process that exited or broke the protocol, per run; then the run stops with an error"},
		&cli.DurationFlag{Name: "pipe-start-timeout", Value: time.Minute,
			Usage: "longest a --pipe co-process may take to start: deliveries written before its first answer count --handler-timeout from that answer, or from this long after its start"},
		&cli.StringFlag{Name: "webhook", Usage: "POST each delivery as JSON to `URL`"},
		&cli.StringFlag{Name: "webhook-secret", EnvVars: clix.EnvVars("WEBHOOK_SECRET"), Usage: "sign webhook bodies with HMAC-SHA256 (header X-Silt-Signature)"},
		&cli.IntFlag{Name: "webhook-retries", Value: 3, Usage: "retries of a webhook call (connection errors, 408, 425, 429, 5xx)"},
		&cli.BoolFlag{Name: "stdout", Usage: "write each delivery as a JSON line on stdout; the summary goes to stderr"},
		&cli.DurationFlag{Name: "handler-timeout", Value: 5 * time.Minute, Usage: "longest one handler call may take; then it is left pending"},
		&cli.StringSliceFlag{Name: "handler-env", EnvVars: clix.EnvVars("HANDLER_ENV"),
			Usage: "`NAME` of a variable exec handlers get from the worker's environment (repeat, or comma-separate); they get only PATH, HOME, USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TZ, TMPDIR, TERM besides"},
	}
}

func runCommand() *cli.Command {
	flags := append(clix.CommonFlags(), groupFlags()...)
	flags = append(flags, handlerFlags()...)
	flags = append(flags,
		&cli.Int64Flag{Name: "count", Value: 0, Usage: "entries per read (0: adapt, from 100 up to 1000 while a batch takes under min-idle/100, back down when one takes over min-idle/10)"},
		&cli.DurationFlag{Name: "block", Value: stream.DefaultBlock, Usage: "how long to wait for new entries before exiting"},
		&cli.DurationFlag{Name: "min-idle", Value: stream.DefaultMinIdle, Usage: "reclaim a peer's entry idle this long (server clock)"},
		&cli.BoolFlag{Name: "fail-on-error", EnvVars: clix.EnvVars("FAIL_ON_ERROR"),
			Usage: "exit 5 when any handler attempt failed or an entry was dead-lettered in this run (the summary is printed as always), so a scheduler sees it"},
		&cli.Int64Flag{Name: "max-attempts", Value: stream.DefaultMaxAttempts, Usage: "handler starts before an entry is dead-lettered (a start is recorded before the handler runs; entries read but not started do not count)"},
		maxEntryBytesFlag(),
		&cli.DurationFlag{Name: "lease-ttl", EnvVars: clix.EnvVars("LEASE_TTL"), Value: stream.DefaultLeaseTTL,
			Usage: "catch-up lease: how long a consumer that stopped renewing it (it died) blocks the others' catch-up"},
		&cli.Int64Flag{Name: "max-entries", Usage: "stop after this many deliveries (0: no limit)"},
		&cli.DurationFlag{Name: "max-duration", Usage: "stop after this long (0: no limit)"},
		&cli.IntFlag{Name: "concurrency", Value: stream.DefaultConcurrency, Usage: "handlers run in parallel within a batch"},
		&cli.DurationFlag{Name: "dedupe-ttl", Usage: "skip entries this group handled within this time (0: off)"},
		&cli.DurationFlag{Name: "grace", Value: stream.DefaultGrace, Usage: "on SIGTERM, how long in-flight handlers may finish"},
		&cli.DurationFlag{Name: "forget-after", Value: stream.DefaultForgetAfter, Usage: "remove consumers with nothing pending idle this long (negative: never)"},
		&cli.StringFlag{Name: "archive-remote", EnvVars: clix.EnvVars("ARCHIVE_REMOTE"),
			Usage: "the archiver's remote URL: recover entries trimmed while pending, and catch up a group behind retention"},
		&cli.StringFlag{Name: "archive-cache", EnvVars: clix.EnvVars("ARCHIVE_CACHE"), Value: "./silt-cache", Usage: "local cache of archive pages"},
		clix.EncryptionKeyFlag(),
	)
	return &cli.Command{
		Name:      "run",
		Usage:     "consume the stream once: drain own pending, reclaim dead peers, handle new entries, exit when done",
		ArgsUsage: "[-- CMD ARGS...]",
		Flags:     flags,
		Action:    runAction,
	}
}

// setup is what every group command needs.
type setup struct {
	target   clix.Target
	log      *slog.Logger
	consumer *stream.Consumer
	close    func()
}

func openConsumer(c *cli.Context) (*setup, error) {
	target, err := clix.ParseTarget(c)
	if err != nil {
		return nil, err
	}
	if c.String("group") == "" {
		return nil, clix.Usagef("--group", "required (or SILT_GROUP)")
	}
	if err := stream.ValidateName("group", c.String("group")); err != nil {
		return nil, clix.Usagef("--group", "%v", err)
	}
	if err := stream.ValidateName("consumer", c.String("consumer")); err != nil {
		return nil, clix.Usagef("--consumer", "%v", err)
	}
	logger, err := clix.NewLogger(c, c.App.ErrWriter)
	if err != nil {
		return nil, err
	}
	rdb, err := clix.OpenRedis(c.Context, c)
	if err != nil {
		return nil, err
	}
	kind, err := clix.ResolveKind(c.Context, rdb, target, target.Stream, false)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	l, err := stream.NewLog(rdb, target.Keyspace, target.Stream, kind)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	cons, err := stream.NewConsumer(l, c.String("group"), c.String("consumer"))
	if err != nil {
		rdb.Close()
		return nil, err
	}
	cons.Logger = logger
	if cons.Failpoint, err = failpointFromEnv(logger); err != nil {
		rdb.Close()
		return nil, err
	}
	return &setup{target: target, log: logger, consumer: cons, close: func() { rdb.Close() }}, nil
}

// chooseHandler builds the one handler the flags ask for. With --pipe it
// also returns the co-process handler, whose stop the caller points at the
// run's cancellation and which it closes at the end.
func chooseHandler(c *cli.Context, log *slog.Logger) (stream.Handler, *pipeHandler, error) {
	var chosen []string
	for _, name := range []string{"exec", "pipe", "webhook"} {
		if c.String(name) != "" {
			chosen = append(chosen, "--"+name)
		}
	}
	if c.Bool("stdout") {
		chosen = append(chosen, "--stdout")
	}
	if c.NArg() > 0 {
		chosen = append(chosen, "-- CMD")
	}
	if len(chosen) != 1 {
		return nil, nil, clix.Usagef("--exec", "choose exactly one handler of --exec, -- CMD, --pipe, --webhook, --stdout (got %s)", describe(chosen))
	}
	if c.Int("pipe-restarts") < 0 {
		return nil, nil, clix.Usagef("--pipe-restarts", "must be 0 or more, got %d", c.Int("pipe-restarts"))
	}
	if c.Duration("pipe-start-timeout") < 0 {
		return nil, nil, clix.Usagef("--pipe-start-timeout", "must be 0 or more, got %s", c.Duration("pipe-start-timeout"))
	}
	timeout := c.Duration("handler-timeout")
	env, secrets := handlerEnv(c.StringSlice("handler-env")), masker(secretsOf(c))
	switch {
	case c.String("exec") != "":
		return execHandler([]string{"sh", "-c", c.String("exec")}, timeout, env, secrets, log), nil, nil
	case c.String("pipe") != "":
		p := newPipeHandler([]string{"sh", "-c", c.String("pipe")}, timeout, c.Int("pipe-restarts"), env, secrets, log, func(error) {})
		p.inFlight, p.startTimeout = c.Int("concurrency"), c.Duration("pipe-start-timeout")
		return p.handle, p, nil
	case c.NArg() > 0:
		return execHandler(c.Args().Slice(), timeout, env, secrets, log), nil, nil
	case c.String("webhook") != "":
		u := c.String("webhook")
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return nil, nil, clix.Usagef("--webhook", "%s is not an http:// or https:// URL", clix.Redact(u))
		}
		return webhookHandler(u, []byte(c.String("webhook-secret")), timeout, c.Int("webhook-retries")), nil, nil
	}
	return stdoutHandler(c.App.Writer), nil, nil
}

// execHandlerChosen reports whether the handler is a process per entry
// (--exec or -- CMD): it says when it begins (execHandler), once its
// process exists.
func execHandlerChosen(c *cli.Context) bool { return c.String("exec") != "" || c.NArg() > 0 }

func describe(chosen []string) string {
	if len(chosen) == 0 {
		return "none"
	}
	return strings.Join(chosen, " and ")
}

func runAction(c *cli.Context) error {
	if err := configure(c, &stream.Consumer{}); err != nil { // flags first, before any connection
		return err
	}
	if c.String("pipe") != "" {
		defer pipeProcs(os.Getenv)()
	}
	s, err := openConsumer(c)
	if err != nil {
		return err
	}
	defer s.close()
	h, pipe, err := chooseHandler(c, s.log)
	if err != nil {
		return err
	}
	if err := configure(c, s.consumer); err != nil {
		return err
	}
	s.consumer.HandlerBegins = execHandlerChosen(c)
	ctx, cancel := context.WithCancelCause(c.Context)
	defer cancel(nil)
	if pipe != nil {
		pipe.stop = cancel
		s.consumer.Admit = pipe.admit
		defer pipe.close(c.Duration("grace"))
	}
	if err := attachArchive(c, s); err != nil {
		return err
	}
	tel, err := telemetry.Setup(c.Context, "silt-worker")
	if err != nil {
		return err
	}
	defer flushTelemetry(c.Context, tel, s.log)
	m := newWorkerMetrics(tel, s.target.Keyspace.Queue, s.target.Stream, s.consumer.Group())
	s.consumer.Progress = m.progress
	sum, runErr := s.consumer.Run(ctx, m.wrap(h))
	m.end(sum)
	brokenPipe := runErr == nil && errors.Is(context.Cause(ctx), ErrPipe)
	if brokenPipe { // not a signal: the co-process could not be kept running
		sum.ExitReason = exitHandlerBroken
	}
	out := summaryWriter(c)
	if err := printSummary(out, s, sum); err != nil {
		return err
	}
	if brokenPipe {
		return fmt.Errorf("%w: %d acked, %d left pending", context.Cause(ctx), sum.Acked, sum.Abandoned+sum.Failed)
	}
	if runErr == nil && sum.ExitReason == stream.ExitSignal {
		// A scheduler must not take a stopped run for a finished one.
		return fmt.Errorf("%w by a signal: %d handled, %d left pending unstarted or unfinished (abandoned)",
			clix.ErrInterrupted, sum.Handled(), sum.Abandoned)
	}
	if failed := sum.Failed + sum.DeadLettered; runErr == nil && failed > 0 && c.Bool("fail-on-error") {
		return fmt.Errorf("%w: %d failed attempts (left pending), %d dead-lettered; the WARN lines above say why",
			clix.ErrHandlersFailed, sum.Failed, sum.DeadLettered)
	}
	return runErr
}

// exitHandlerBroken is the summary's exit_reason when the run stopped
// because its co-process could not be kept running (--pipe-restarts).
const exitHandlerBroken = "handler_broken"

// flushTelemetry pushes what the run measured before the process exits; a
// collector that cannot be reached is reported, not fatal.
func flushTelemetry(ctx context.Context, tel *telemetry.Telemetry, log *slog.Logger) {
	if err := tel.Shutdown(ctx); err != nil {
		log.Warn("metrics and traces not delivered", "error", err.Error())
	}
}

func configure(c *cli.Context, k *stream.Consumer) error {
	if c.Int64("count") < 0 {
		return clix.Usagef("--count", "must be 0 (adaptive) or more, got %d", c.Int64("count"))
	}
	for _, name := range []string{"max-attempts"} {
		if c.Int64(name) < 1 {
			return clix.Usagef("--"+name, "must be at least 1, got %d", c.Int64(name))
		}
	}
	for _, name := range []string{"block", "min-idle", "lease-ttl"} {
		if c.Duration(name) < time.Millisecond {
			return clix.Usagef("--"+name, "must be at least 1ms, got %s", c.Duration(name))
		}
	}
	if c.Int("concurrency") < 1 {
		return clix.Usagef("--concurrency", "must be at least 1, got %d", c.Int("concurrency"))
	}
	if c.Int("max-entry-bytes") < 0 {
		return clix.Usagef("--max-entry-bytes", "must be 0 (no limit) or more, got %d", c.Int("max-entry-bytes"))
	}
	k.Count, k.Block, k.MinIdle = c.Int64("count"), c.Duration("block"), c.Duration("min-idle")
	k.ClaimEvery = 0 // the default: MinIdle/10
	k.MaxAttempts, k.MaxEntries, k.MaxDuration = c.Int64("max-attempts"), c.Int64("max-entries"), c.Duration("max-duration")
	k.MaxEntryBytes, k.LeaseTTL = c.Int("max-entry-bytes"), c.Duration("lease-ttl")
	k.Concurrency, k.DedupeTTL = c.Int("concurrency"), c.Duration("dedupe-ttl")
	k.Grace, k.ForgetAfter = c.Duration("grace"), c.Duration("forget-after")
	return nil
}

// summaryLine is the JSON line `worker run` prints at exit.
type summaryLine struct {
	Stream   string `json:"stream"`
	Group    string `json:"group"`
	Consumer string `json:"consumer"`
	stream.Summary
}

func printSummary(w io.Writer, s *setup, sum stream.Summary) error {
	line, err := json.Marshal(summaryLine{Stream: s.target.Stream, Group: s.consumer.Group(), Consumer: s.consumer.Name(), Summary: sum})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", line)
	return err
}

// failpointFromEnv reads SILT_FAILPOINT=NAME:N in a build with the
// silt_failpoints tag (crash tests only); release builds ignore it.
func failpointFromEnv(log *slog.Logger) (failpoint.Func, error) {
	fp, err := clix.FailpointFromEnv()
	if fp != nil {
		log.Warn("failpoint armed (a silt_failpoints build)", "spec", os.Getenv("SILT_FAILPOINT"))
	}
	return fp, err
}

// attachArchive makes the archive the consumer's PayloadSource and History
// when --archive-remote is set.
func attachArchive(c *cli.Context, s *setup) error {
	remote := c.String("archive-remote")
	if remote == "" {
		if rec, ok, err := s.consumer.Log().ArchiveRecord(c.Context); err == nil && ok && rec.LSN > 0 {
			s.log.Warn("the stream is archived (to " + rec.Remote + "); without --archive-remote, entries trimmed while pending are dead-lettered instead of recovered, and a group behind retention is not caught up")
		}
		return nil
	}
	if err := clix.CheckStoreURL(remote); err != nil {
		return clix.Usagef("--archive-remote", "%v", err)
	}
	store, err := clix.OpenStore(c.Context, remote, fence.ReadOnly)
	if err != nil {
		return fmt.Errorf("archive remote %s: %w", clix.Redact(remote), err)
	}
	if store, err = clix.Encryption(c, store); err != nil {
		return err
	}
	cache, err := filepath.Abs(c.String("archive-cache"))
	if err != nil {
		return clix.Usagef("--archive-cache", "%v", err)
	}
	clix.LocalPlainNotice(s.log, store, cache)
	a, err := archive.OpenWith(c.Context, s.consumer.Log(), cache, store, archive.OpenOptions{Warn: func(msg string) { s.log.Warn(msg) }})
	if err != nil {
		return err
	}
	if err := a.CheckRemote(c.Context); err != nil {
		return err
	}
	s.consumer.Payloads = a
	return nil
}

// maxEntryBytesFlag is --max-entry-bytes of append and run.
func maxEntryBytesFlag() cli.Flag {
	return &cli.IntFlag{Name: "max-entry-bytes", EnvVars: clix.EnvVars("MAX_ENTRY_BYTES"), Value: 1 << 20,
		Usage: "largest entry (field names and values) appended or handled; run dead-letters larger ones unhandled (0: no limit)"}
}
