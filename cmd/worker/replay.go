package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
	"github.com/silt-dev/silt/internal/telemetry"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/stream"
)

func replayCommand() *cli.Command {
	flags := append(clix.CommonFlags(), handlerFlags()...)
	flags = append(flags,
		&cli.StringFlag{Name: "name", Usage: "the replay's name: its checkpoint, and the 'replay' member of each delivery (required)"},
		&cli.StringFlag{Name: "from", Value: "-", Usage: "first id, inclusive: -, a branded id or <ms>-<seq>"},
		&cli.StringFlag{Name: "to", Value: "+", Usage: "last id, inclusive"},
		&cli.StringFlag{Name: "window", Usage: "entries minted from T0 to T1, both included (RFC 3339 or Unix ms)"},
		&cli.BoolFlag{Name: "restart", Usage: "forget the name's checkpoint and start from --from"},
		&cli.StringFlag{Name: "archive-remote", EnvVars: clix.EnvVars("ARCHIVE_REMOTE"), Usage: "include the archived history (else the live stream only)"},
		&cli.StringFlag{Name: "archive-cache", EnvVars: clix.EnvVars("ARCHIVE_CACHE"), Value: "./silt-cache", Usage: "local cache of archive pages"},
		clix.EncryptionKeyFlag(),
		&cli.StringFlag{Name: "group", EnvVars: clix.EnvVars("GROUP"), Usage: "group named in the deliveries (informational)"},
	)
	return &cli.Command{
		Name:      "replay",
		Usage:     "run the handler over a range of the whole history, in order, checkpointed under --name",
		ArgsUsage: "[-- CMD ARGS...]",
		Flags:     flags,
		Action:    replayAction,
	}
}

func replayAction(c *cli.Context) error {
	t, err := clix.ParseTarget(c)
	if err != nil {
		return err
	}
	name := c.String("name")
	if err := stream.ValidateName("replay", name); err != nil {
		return clix.Usagef("--name", "%v", err)
	}
	if _, _, err := replayBounds(c, ""); err != nil {
		return err
	}
	logger, err := clix.NewLogger(c, c.App.ErrWriter)
	if err != nil {
		return err
	}
	h, pipe, err := chooseHandler(c, logger) // usage errors before any connection
	if err != nil {
		return err
	}
	if pipe != nil {
		defer pipeProcs(os.Getenv)() // put back after the co-process is closed
		defer pipe.close(10 * time.Second)
	}
	sess, err := clix.OpenSession(c, t)
	if err != nil {
		return err
	}
	defer sess.Close()
	l := sess.Log
	from, to, err := replayBounds(c, l.Kind()) // branded bounds are checked against the stream's kind
	if err != nil {
		return err
	}
	read, err := replaySource(c, l)
	if err != nil {
		return err
	}
	hold, err := l.HoldReplay(c.Context, name, stream.DefaultLeaseTTL)
	if err != nil {
		return err
	}
	defer func() {
		if err := hold.Release(context.WithoutCancel(c.Context)); err != nil {
			logger.Warn("replay hold not released", "replay", name, "error", err.Error())
		}
	}()
	if c.Bool("restart") {
		if err := hold.Forget(c.Context); err != nil {
			return err
		}
	}
	group := c.String("group")
	tel, err := telemetry.Setup(c.Context, "silt-worker")
	if err != nil {
		return err
	}
	defer flushTelemetry(c.Context, tel, logger)
	m := newWorkerMetrics(tel, t.Keyspace.Queue, t.Stream, group)
	tagged := m.wrap(func(ctx context.Context, d stream.Delivery) error { d.Group = group; return h(ctx, d) })
	started := time.Now()
	res, runErr := archive.ReplayHeld(c.Context, hold, read, from, to, tagged)
	m.endReplay(res, runErr, time.Since(started))
	line, _ := json.Marshal(res)
	out := summaryWriter(c)
	fmt.Fprintf(out, "%s\n", line)
	return runErr
}

func replayBounds(c *cli.Context, kind brand.Kind) (from, to brand.StreamID, err error) {
	if c.IsSet("window") {
		if c.IsSet("from") || c.IsSet("to") {
			return from, to, clix.Usagef("--window", "cannot be combined with --from or --to")
		}
		return clix.ParseWindow("--window", c.String("window"))
	}
	if from, err = clix.ParseBound("--from", c.String("from"), kind); err != nil {
		return from, to, err
	}
	to, err = clix.ParseBound("--to", c.String("to"), kind)
	return from, to, err
}

// replaySource is the merged history with --archive-remote, else the live stream.
func replaySource(c *cli.Context, l *stream.Log) (archive.Source, error) {
	if c.String("archive-remote") == "" {
		return archive.LiveOnly(l), nil
	}
	a, err := openArchiveRemote(c, l)
	if err != nil {
		return nil, err
	}
	return a.Read, nil
}

// openArchiveRemote opens l's archive on --archive-remote (read only,
// pages cached under --archive-cache), proven against Redis's record.
func openArchiveRemote(c *cli.Context, l *stream.Log) (*archive.Archive, error) {
	remote := c.String("archive-remote")
	if err := clix.CheckStoreURL(remote); err != nil {
		return nil, clix.Usagef("--archive-remote", "%v", err)
	}
	store, err := clix.OpenStore(c.Context, remote, fence.ReadOnly)
	if err != nil {
		return nil, fmt.Errorf("archive remote %s: %w", clix.Redact(remote), err)
	}
	if store, err = clix.Encryption(c, store); err != nil {
		return nil, err
	}
	cache, err := filepath.Abs(c.String("archive-cache"))
	if err != nil {
		return nil, clix.Usagef("--archive-cache", "%v", err)
	}
	a, err := archive.Open(c.Context, l, cache, store)
	if err != nil {
		return nil, err
	}
	if err := a.CheckRemote(c.Context); err != nil {
		return nil, err
	}
	return a, nil
}
