package archive_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/stream"
)

// other is a second Redis with a stream of the same name, sharing e's remote.
func (e *env) other(t *testing.T) *env { return newEnvOn(t, e.store) }

func xlen(t *testing.T, e *env) int64 {
	t.Helper()
	return e.rdb.XLen(context.Background(), e.log.Key()).Val()
}

// Two Redis (staging and prod) with the same queue and stream names share a
// bucket prefix: the second one's run refuses to trim by the first one's
// watermark, and its stream keeps every entry.
func TestArchive_SharedPrefixIsRefused(t *testing.T) {
	ctx := context.Background()
	prod := newEnv(t)
	staging := prod.other(t)
	staging.appendN(t, 20) // minted before prod's: all of them at or below prod's W
	time.Sleep(5 * time.Millisecond)
	prod.appendN(t, 20)
	if _, err := prod.open(t).Run(ctx, archive.Policy{KeepLast: 5}, nil); err != nil {
		t.Fatal(err)
	}
	staging.appendN(t, 5) // and a few above it
	a := staging.open(t)
	a.Exact = true // so that a trim, were it allowed, would show at once
	res, err := a.Run(ctx, archive.Policy{KeepLast: 5}, nil)
	if !errors.Is(err, archive.ErrNotThisArchive) || res.Trimmed != 0 || res.Archived != 0 {
		t.Fatalf("run on the second Redis: %+v, %v", res, err)
	}
	if n := xlen(t, staging); n != 25 {
		t.Fatalf("the second Redis's stream holds %d of 25", n)
	}
	// The first Redis goes on archiving.
	prod.appendN(t, 5)
	if res, err := prod.open(t).Run(ctx, archive.Policy{KeepLast: 5}, nil); err != nil || res.Archived != 5 {
		t.Fatalf("prod's next run: %+v, %v", res, err)
	}
}

// A watermark above the stream's last generated id is never trimmed by,
// even when the archive is adopted on purpose.
func TestArchive_WatermarkAboveTheStreamTopIsRefused(t *testing.T) {
	ctx := context.Background()
	prod := newEnv(t)
	prod.appendN(t, 20)
	if _, err := prod.open(t).Run(ctx, archive.Policy{KeepLast: 5}, nil); err != nil {
		t.Fatal(err)
	}
	restored := prod.other(t) // a Redis restored from an old backup: older entries only
	for i := range 10 {
		id, _ := brand.New(brand.EVT, brand.StreamID{MS: 1_600_000_000_000 + uint64(i)})
		if err := restored.log.AppendID(ctx, id, stream.Fields{"n": "old"}); err != nil {
			t.Fatal(err)
		}
	}
	a := restored.open(t)
	a.Adopt = true
	res, err := a.Run(ctx, archive.Policy{KeepLast: 1}, nil)
	if !errors.Is(err, archive.ErrNotThisArchive) || res.Trimmed != 0 {
		t.Fatalf("run with W above the top: %+v, %v", res, err)
	}
	if n := xlen(t, restored); n != 10 {
		t.Fatalf("stream holds %d of 10", n)
	}
}

// A Redis that archived to one remote refuses a run against another, empty
// one, naming where its archive is.
func TestArchive_WrongRemoteIsRefused(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.appendN(t, 20)
	a := e.open(t)
	a.RemoteName = "file:///the/right/one"
	if _, err := a.Run(ctx, archive.Policy{KeepLast: 5}, nil); err != nil {
		t.Fatal(err)
	}
	before := xlen(t, e)
	empty, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	wrong := &env{rdb: e.rdb, log: e.log, store: empty}
	_, err = wrong.open(t).Run(ctx, archive.Policy{KeepLast: 1}, nil)
	if !errors.Is(err, archive.ErrNotThisArchive) || !contains(err, "file:///the/right/one") {
		t.Fatalf("run against an empty remote: %v", err)
	}
	if n := xlen(t, e); n != before {
		t.Fatalf("stream holds %d, %d before the refused run", n, before)
	}
}

// An archive opened before another archiver's first commit is not a wrong
// remote: Redis's record is read first and the remote is looked at after
// it (CI once saw "this remote holds none" from one of four archivers
// started together, whose view of the remote predated a peer's commit).
func TestArchive_RecordNewerThanTheOpenedVolume(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.appendN(t, 30)
	reader, late := e.open(t), e.open(t)
	if _, err := e.open(t).Run(ctx, archive.Policy{KeepLast: 5}, nil); err != nil {
		t.Fatal(err)
	}
	if err := reader.CheckRemote(ctx); err != nil {
		t.Fatalf("CheckRemote on a volume opened before the first commit: %v", err)
	}
	if reader.Volume().Head() == 0 {
		t.Fatal("CheckRemote passed without seeing the commit")
	}
	e.appendN(t, 10)
	res, err := late.Run(ctx, archive.Policy{KeepLast: 5}, nil)
	if err != nil || res.Archived != 10 {
		t.Fatalf("a run opened before a peer's commits: %+v, %v", res, err)
	}
}

func contains(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }

// A Redis that loses the archive's record while a run goes on (restarted
// without persistence, flushed) stops the run at its next commit: the
// record is not written back into the emptied Redis, nothing more is
// trimmed, and the next run refuses the remote as never recorded.
func TestArchive_RecordLostDuringARunStopsIt(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.appendN(t, 50)
	a := e.open(t)
	a.SliceEntries, a.Exact = 10, true
	commits := 0
	res, err := a.Run(ctx, archive.Policy{KeepLast: 5}, func(archive.Result) {
		if commits++; commits == 1 {
			e.rdb.Del(ctx, "emq:{cm}:archive:events")
		}
	})
	if !errors.Is(err, archive.ErrNotThisArchive) || !errors.Is(err, stream.ErrRecordLost) || res.Commits != 1 || res.Trimmed != 10 {
		t.Fatalf("run: %+v, %v; want it stopped at its second commit (not counted), only the first slice trimmed", res, err)
	}
	if n := e.rdb.Exists(ctx, "emq:{cm}:archive:events").Val(); n != 0 {
		t.Fatal("the record was written back into the emptied Redis")
	}
	if _, err := e.open(t).Run(ctx, archive.Policy{KeepLast: 5}, nil); !errors.Is(err, archive.ErrNotThisArchive) {
		t.Fatalf("next run: %v", err)
	}
}
