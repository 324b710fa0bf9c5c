package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/export"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/stream"
)

// archiveFlags locate the archive: local pages and the remote.
func archiveFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "data-dir", EnvVars: clix.EnvVars("DATA_DIR"), Value: "./silt-data", Usage: "local page files"},
		&cli.StringFlag{Name: "remote", EnvVars: clix.EnvVars("ARCHIVE_REMOTE"),
			Usage: "object store URL: file:///abs/dir or s3://bucket/prefix?endpoint=...&region=...&path-style=true (default: <data-dir>/remote)"},
		clix.EncryptionKeyFlag(),
		&cli.StringFlag{Name: "dead-letters", Usage: "work on the dead-letter stream of consumer group `GROUP` instead of the stream: dead letters archive, read and export as any stream"},
		&cli.DurationFlag{Name: "consistency-wait", EnvVars: clix.EnvVars("CONSISTENCY_WAIT"), Value: archive.DefaultConsistencyWait,
			Usage: "how long a remote behind Redis's record of the archive is re-read before the command refuses it (exit 4): an eventually consistent store catches up"},
	}
}

// archiveOnlyFlag reads an archive without Redis (read, export).
func archiveOnlyFlag() cli.Flag {
	return &cli.BoolFlag{Name: "archive-only",
		Usage: "read the archive alone: no live entries merged, Redis not asked (nothing proves the archive complete or this stream's); for a system whose Redis is gone. The stream's kind is --kind (EVT when not given)"}
}

// env is what an archiver command works with.
type env struct {
	target  clix.Target
	log     *slog.Logger
	rdb     redis.UniversalClient
	store   fence.Store
	dataDir string
	remote  string // the remote's URL without secrets
	// archiveOnly: read or export the archive without Redis (--archive-only);
	// rdb is then a client that is never used.
	archiveOnly     bool
	consistencyWait time.Duration
	deadGroup       string // --dead-letters: the group whose dead letters are the stream

	exportTo     fence.Store // archiver run --export-to
	exportFormat export.Format
	metrics      *archiverMetrics // archiver run
	cleanup      func()           // removes a read's temporary data directory
}

func (e *env) close() {
	e.rdb.Close()
	if e.cleanup != nil {
		e.cleanup()
	}
}

// openEnv validates flags, connects to Redis and opens the remote (probing
// it when write is set).
func openEnv(c *cli.Context, needStream, write bool) (*env, error) {
	var (
		t   clix.Target
		err error
	)
	if needStream {
		t, err = clix.ParseTarget(c)
	} else {
		t, err = clix.ParsePrefix(c) // archiver run --all may span every queue
	}
	if err != nil {
		return nil, err
	}
	deadGroup := c.String("dead-letters")
	if deadGroup != "" {
		if err := stream.ValidateName("group", deadGroup); err != nil {
			return nil, clix.Usagef("--dead-letters", "%v", err)
		}
	}
	logger, err := clix.NewLogger(c, c.App.ErrWriter)
	if err != nil {
		return nil, err
	}
	dataDir, err := filepath.Abs(c.String("data-dir"))
	if err != nil {
		return nil, clix.Usagef("--data-dir", "%v", err)
	}
	remote := c.String("remote")
	if remote != "" {
		if err := clix.CheckStoreURL(remote); err != nil {
			return nil, clix.Usagef("--remote", "%v", err)
		}
	}
	archiveOnly := c.Bool("archive-only")
	var rdb redis.UniversalClient
	if archiveOnly {
		// Nothing in an archive-only read talks to Redis; a client that
		// was never given an address fails at once if something did.
		rdb = redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	} else if rdb, err = clix.OpenRedis(c.Context, c); err != nil {
		return nil, err
	}
	if remote == "" && !write && needStream && !archiveOnly {
		// A reader goes where Redis recorded the stream's archive, from
		// whatever directory it runs in.
		remote = recordedRemote(c.Context, rdb, t, deadGroup)
		if remote != "" {
			logger.Info("no --remote given: reading the remote Redis recorded for the stream", "remote", clix.Redact(remote))
		}
	}
	if remote == "" {
		remote = "file://" + filepath.Join(dataDir, "remote")
	}
	mode := fence.ReadOnly
	if write {
		mode = fence.ReadWrite
	}
	store, err := clix.OpenStore(c.Context, remote, mode)
	if err != nil {
		rdb.Close()
		return nil, fmt.Errorf("remote %s: %w", clix.Redact(remote), err)
	}
	if store, err = clix.Encryption(c, store); err != nil {
		rdb.Close()
		return nil, err
	}
	clix.LocalPlainNotice(logger, store, dataDir)
	var cleanup func()
	if _, err := os.Stat(dataDir); lookOnly[c.Command.Name] && errors.Is(err, fs.ErrNotExist) {
		// A command that only looks keeps its page cache in a temporary
		// directory rather than create the data directory: looking leaves
		// nothing behind. (pull is there to fill the data directory.)
		tmp, err := os.MkdirTemp("", "silt-read-")
		if err != nil {
			rdb.Close()
			return nil, err
		}
		dataDir, cleanup = tmp, func() { os.RemoveAll(tmp) }
	}
	return &env{target: t, deadGroup: deadGroup, log: logger, rdb: rdb, store: store, dataDir: dataDir, remote: clix.Redact(remote), cleanup: cleanup,
		archiveOnly: archiveOnly, consistencyWait: c.Duration("consistency-wait")}, nil
}

// recordedRemote is the remote Redis recorded for t's stream ("" when none
// is, or when it was recorded redacted and cannot be opened as it is).
func recordedRemote(ctx context.Context, rdb redis.UniversalClient, t clix.Target, deadGroup string) string {
	kind := cmp.Or(t.Kind, brand.EVT) // the record does not depend on the kind
	l, err := stream.NewLog(rdb, t.Keyspace, t.Stream, kind)
	if err == nil && deadGroup != "" {
		l, err = l.DeadLetters(deadGroup)
	}
	if err != nil {
		return ""
	}
	rec, ok, err := l.ArchiveRecord(ctx)
	if err != nil || !ok || rec.Remote == "" || strings.Contains(rec.Remote, "xxxxx") || clix.CheckStoreURL(rec.Remote) != nil {
		return ""
	}
	return rec.Remote
}

// lookOnly are the commands that read and never need the data directory
// after they exit.
var lookOnly = map[string]bool{"read": true, "status": true, "export": true, "verify": true, "trim": true}

// openArchive opens the archive of one stream (or of a group's dead letters)
// of the --queue.
func (e *env) openArchive(ctx context.Context, name, deadGroup string) (*archive.Archive, error) {
	a, err := e.openArchiveIn(ctx, e.target.Keyspace, name, deadGroup)
	if err != nil {
		return nil, err
	}
	return a, a.CheckRemote(ctx)
}

// openArchiveIn opens an archive in keyspace ks.
func (e *env) openArchiveIn(ctx context.Context, ks stream.Keyspace, name, deadGroup string) (*archive.Archive, error) {
	kind := cmp.Or(e.target.Kind, brand.EVT)
	if !e.archiveOnly {
		var err error
		if kind, err = clix.ResolveKind(ctx, e.rdb, clix.Target{Keyspace: ks, Kind: e.target.Kind}, name, false); err != nil {
			return nil, err
		}
	}
	l, err := stream.NewLog(e.rdb, ks, name, kind)
	if err != nil {
		return nil, err
	}
	if deadGroup != "" {
		if l, err = l.DeadLetters(deadGroup); err != nil {
			return nil, err
		}
	}
	a, err := archive.OpenWith(ctx, l, e.dataDir, e.store, archive.OpenOptions{Warn: func(msg string) { e.log.Warn(msg) }})
	if err != nil {
		return nil, err
	}
	a.ConsistencyWait, a.ArchiveOnly = e.consistencyWait, e.archiveOnly
	if e.archiveOnly {
		e.log.Warn("archive only: the live stream is not merged and Redis is not asked, so nothing proves this archive complete or this stream's",
			"volume", a.Volume().Name(), "remote", e.remote)
	}
	return a, nil
}
