package archive_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
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

// remoteDir is an env whose local remote's directory the test can copy,
// restore and edit, as an operator (or a fault) would the bucket.
func remoteDir(t *testing.T) (*env, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := fence.OpenLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	return newEnvOn(t, st), dir
}

// run archives with the settings of the reproductions: exact trims
// in slices of 10, a short wait for a remote behind, a fresh data dir (a
// cold host) unless a is given.
func (e *env) run(t *testing.T, keep int64) (archive.Result, error) {
	t.Helper()
	a := e.open(t)
	a.SliceEntries, a.Exact, a.ConsistencyWait = 10, true, 300*time.Millisecond
	return a.Run(context.Background(), archive.Policy{KeepLast: keep}, nil)
}

func record(t *testing.T, e *env) stream.ArchiveRecord {
	t.Helper()
	rec, ok, err := e.log.ArchiveRecord(context.Background())
	if err != nil || !ok {
		t.Fatalf("archive record: %v, %v", ok, err)
	}
	return rec
}

// copyDir replaces dst's contents with src's.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.RemoveAll(dst); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
}

// refused checks that err is the refusal want and that neither the stream
// nor Redis's record moved.
func refused(t *testing.T, e *env, res archive.Result, err, want error, xlenBefore int64, recBefore stream.ArchiveRecord) {
	t.Helper()
	if !errors.Is(err, want) || res.Commits != 0 || res.Trimmed != 0 {
		t.Fatalf("got %+v, %v; want %v with nothing committed or trimmed", res, err, want)
	}
	if n := xlen(t, e); n != xlenBefore {
		t.Fatalf("stream holds %d, %d before the refusal", n, xlenBefore)
	}
	if rec := record(t, e); rec != recBefore {
		t.Fatalf("record moved from %+v to %+v", recBefore, rec)
	}
}

// A bucket restored from an older copy (or a region that has not seen the
// newest writes) is behind Redis's record: a run from a fresh data dir
// refuses it, commits nothing over the hole, trims nothing and leaves the
// record where it was; a reader refuses it too, naming both LSNs.
func TestProof_RolledBackRemoteIsRefused(t *testing.T) {
	ctx := context.Background()
	e, dir := remoteDir(t)
	e.appendN(t, 100)
	if _, err := e.run(t, 10); err != nil {
		t.Fatal(err)
	}
	backup := t.TempDir()
	copyDir(t, dir, backup)
	time.Sleep(2 * time.Millisecond)
	e.appendN(t, 100)
	if _, err := e.run(t, 10); err != nil {
		t.Fatal(err)
	}
	copyDir(t, backup, dir)
	e.appendN(t, 30)
	rec, n := record(t, e), xlen(t, e)
	res, err := e.run(t, 10)
	refused(t, e, res, err, archive.ErrRemoteBehind, n, rec)
	if !contains(err, fmt.Sprintf("commit %d", rec.LSN)) || !contains(err, "restored") {
		t.Errorf("the refusal names neither the recorded LSN nor the likely cause: %v", err)
	}
	if err := e.open(t).CheckRemote(ctx); !errors.Is(err, archive.ErrRemoteBehind) {
		t.Fatalf("a reader of the rolled-back remote: %v", err)
	}
}

// Deleting only the newest commit object is a remote behind the record.
func TestProof_NewestCommitDeletedIsRefused(t *testing.T) {
	e, dir := remoteDir(t)
	e.appendN(t, 100)
	if _, err := e.run(t, 10); err != nil {
		t.Fatal(err)
	}
	rec := record(t, e)
	newest := filepath.Join(dir, rec.Volume, "commits", fmt.Sprintf("%020d", rec.LSN))
	if err := os.Remove(newest); err != nil {
		t.Fatal(err)
	}
	e.appendN(t, 20)
	n := xlen(t, e)
	res, err := e.run(t, 10)
	refused(t, e, res, err, archive.ErrRemoteBehind, n, rec)
}

// forgeW rewrites the watermark of commit lsn on the remote to w, with its
// checksum line recomputed, as a forger with write access would.
func forgeW(t *testing.T, dir string, rec stream.ArchiveRecord, lsn uint64, w string) {
	t.Helper()
	path := filepath.Join(dir, rec.Volume, "commits", fmt.Sprintf("%020d", lsn))
	obj, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	forged, ok := testserver.ForgeWatermark(obj, w)
	if !ok {
		t.Fatalf("commit %d is not a packed commit with a W", lsn)
	}
	if err := os.WriteFile(path, forged, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A forged watermark (the newest commit's W raised, its checksum line
// recomputed) trims nothing: the commit's hash is not the one Redis
// recorded. Above the record (a crash between a commit and its record), the
// forged W is not the last record of its segment.
func TestProof_ForgedWatermarkIsRefused(t *testing.T) {
	for _, aboveRecord := range []bool{false, true} {
		t.Run(fmt.Sprintf("above_record=%v", aboveRecord), func(t *testing.T) {
			ctx := context.Background()
			e, dir := remoteDir(t)
			e.appendN(t, 100)
			if _, err := e.run(t, 50); err != nil {
				t.Fatal(err)
			}
			rec := record(t, e)
			if aboveRecord { // as if the run died between its last commit and its record
				prev, err := e.open(t).Volume().CommitAt(ctx, rec.LSN-1)
				if err != nil {
					t.Fatal(err)
				}
				e.rdb.HSet(ctx, "emq:{cm}:archive:events", "lsn", rec.LSN-1, "w", prev.Meta["w"], "hash", prev.Hash())
				rec = record(t, e)
			}
			live, _, _ := xrangeIDs(t, e)
			forgeW(t, dir, rec, e.open(t).Volume().Head(), live[25]) // 25 more than archived
			n := xlen(t, e)
			res, err := e.run(t, 50)
			refused(t, e, res, err, archive.ErrNotThisArchive, n, rec)
			if err := e.open(t).CheckRemote(ctx); !errors.Is(err, archive.ErrNotThisArchive) {
				t.Fatalf("a reader of the forged commit: %v", err)
			}
		})
	}
}

func xrangeIDs(t *testing.T, e *env) (ids []string, first, last string) {
	t.Helper()
	for _, m := range e.rdb.XRange(context.Background(), e.log.Key(), "-", "+").Val() {
		ids = append(ids, m.ID)
	}
	return ids, ids[0], ids[len(ids)-1]
}

// A second Redis with the same queue and stream names, reading the first
// one's remote, gets a refusal, not a merge of another system's history;
// so does the first Redis once restarted empty. --archive-only reads the
// archive alone.
func TestProof_ReadersRefuseAnArchiveNeverRecorded(t *testing.T) {
	ctx := context.Background()
	first := newEnv(t)
	first.appendN(t, 50)
	if _, err := first.run(t, 10); err != nil {
		t.Fatal(err)
	}
	second := first.other(t)
	second.appendN(t, 10)
	if err := second.open(t).CheckRemote(ctx); !errors.Is(err, archive.ErrNotThisArchive) || !errors.Is(err, archive.ErrNeverRecorded) {
		t.Fatalf("a second Redis reading the first one's remote: %v", err)
	}
	first.rdb.FlushAll(ctx)
	if err := first.open(t).CheckRemote(ctx); !errors.Is(err, archive.ErrNotThisArchive) {
		t.Fatalf("a Redis restarted empty reading its remote: %v", err)
	}
	a := second.open(t)
	a.ArchiveOnly = true
	if err := a.CheckRemote(ctx); err != nil {
		t.Fatal(err)
	}
	ids, fromArchive := history(t, a, stream.First, stream.Last)
	if len(ids) != 40 || fromArchive != 40 {
		t.Fatalf("archive-only read: %d entries, %d from the archive; want the 40 archived alone", len(ids), fromArchive)
	}
}

// An adoption mints a new identity: once the adopter commits, the previous
// owner's next run is refused, naming both identities, and trims nothing.
func TestProof_AdoptionFencesThePreviousOwner(t *testing.T) {
	ctx := context.Background()
	owner := newEnv(t)
	owner.appendN(t, 30)
	if _, err := owner.run(t, 5); err != nil {
		t.Fatal(err)
	}
	old := record(t, owner).Identity
	adopter := owner.other(t)
	time.Sleep(2 * time.Millisecond)
	adopter.appendN(t, 20)
	var warned []string
	a, err := archive.OpenWith(ctx, adopter.log, t.TempDir(), adopter.store, archive.OpenOptions{Warn: func(m string) { warned = append(warned, m) }})
	if err != nil {
		t.Fatal(err)
	}
	a.Adopt = true
	if res, err := a.Run(ctx, archive.Policy{KeepLast: 5}, nil); err != nil || res.Archived != 15 {
		t.Fatalf("adopting run: %+v, %v", res, err)
	}
	adopted := record(t, adopter)
	if adopted.Identity == old || adopted.AdoptedFrom != old {
		t.Fatalf("adopted record %+v: want a new identity, adopted from %s", adopted, old)
	}
	if len(warned) == 0 || !strings.Contains(warned[0], old) || !strings.Contains(warned[0], adopted.Identity) {
		t.Fatalf("the adoption was not logged with both identities: %q", warned)
	}
	owner.appendN(t, 5)
	n, rec := xlen(t, owner), record(t, owner)
	res, err := owner.run(t, 1)
	refused(t, owner, res, err, archive.ErrNotThisArchive, n, rec)
	if !contains(err, adopted.Identity) || !contains(err, old) {
		t.Fatalf("the refusal does not name both identities: %v", err)
	}
}

// The record moves only forward: a record of an older commit (a slow peer,
// a crash between commit and record) leaves the newer one in place.
func TestProof_RecordOnlyMovesForward(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.appendN(t, 50)
	if _, err := e.run(t, 10); err != nil {
		t.Fatal(err)
	}
	rec := record(t, e)
	older := rec
	older.LSN, older.W, older.Hash = rec.LSN-1, "1-1", "x"
	newer, err := e.log.RecordArchive(ctx, older)
	if err != nil || !newer {
		t.Fatalf("recording an older commit: newer %v, %v", newer, err)
	}
	if got := record(t, e); got != rec {
		t.Fatalf("record moved back from %+v to %+v", rec, got)
	}
}

// stalledReadBack is a remote whose reads of one commit fail, after
// waiting (up to a second) for the commit above it to be created: the run
// goes on creating while a slice is proven, and this shows it.
type stalledReadBack struct {
	fence.Store
	stall, next string // commit keys
	created     chan struct{}
	once        sync.Once
}

func (s *stalledReadBack) Create(ctx context.Context, key string, body []byte) error {
	err := s.Store.Create(ctx, key, body)
	if err == nil && key == s.next {
		s.once.Do(func() { close(s.created) })
	}
	return err
}

func (s *stalledReadBack) Get(ctx context.Context, key string, r fence.Range) ([]byte, error) {
	if key == s.stall {
		select {
		case <-s.created:
		case <-time.After(time.Second):
		}
		return nil, errors.New("injected: the remote times out")
	}
	return s.Store.Get(ctx, key, r)
}

// A slice is proven (read back, recorded) while the next one is created:
// when the proof fails, the run stops with nothing trimmed above the last
// proven slice, though the slice after it was created, and the next run
// proves both and trims them.
func TestRun_UnprovenSliceIsNeverTrimmed(t *testing.T) {
	ctx := context.Background()
	local, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	vol := "emq.cm.events" // what archive.VolumeName gives for this env
	faulty := &stalledReadBack{Store: local, stall: vol + "/commits/00000000000000000002",
		next: vol + "/commits/00000000000000000003", created: make(chan struct{})}
	e := newEnvOn(t, faulty)
	ids := e.appendN(t, 50)
	a := e.open(t)
	if a.Volume().Name() != vol {
		t.Fatalf("volume %q, the test expects %q", a.Volume().Name(), vol)
	}
	a.SliceEntries, a.Exact = 10, true
	res, err := a.Run(ctx, archive.Policy{KeepLast: 5}, nil)
	if err == nil || !strings.Contains(err.Error(), "commit 2 was created but does not read back") {
		t.Fatalf("run: %+v, %v; want commit 2's read back refused", res, err)
	}
	if res.Commits != 1 || res.Trimmed != 10 || xlen(t, e) != 40 {
		t.Fatalf("run: %+v, stream holds %d; want the first slice alone counted and trimmed", res, xlen(t, e))
	}
	if rec := record(t, e); rec.LSN != 1 {
		t.Fatalf("record at %d, want 1", rec.LSN)
	}
	if _, err := local.Get(ctx, faulty.next, fence.Range{}); err != nil {
		t.Fatalf("commit 3 was not created while commit 2 was proven: %v", err)
	}
	healthy := &env{rdb: e.rdb, log: e.log, store: local}
	res, err = healthy.run(t, 5)
	if err != nil || xlen(t, e) != 5 || res.Archived != 15 || res.Trimmed != 35 {
		t.Fatalf("next run: %+v, %v, stream holds %d; want commits 2 and 3 proven and trimmed, the last 15 archived, 5 live", res, err, xlen(t, e))
	}
	got, _ := history(t, healthy.open(t), brand.StreamID{}, brand.StreamID{MS: 1 << 60})
	if !slices.Equal(got, ids) {
		t.Fatalf("history holds %d entries, want the %d appended, in order, once each", len(got), len(ids))
	}
}
