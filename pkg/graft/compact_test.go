package graft_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/graft"
)

// pagesOf reads the volume through its entries, in order, and returns the
// page numbers it finds: a gap or a duplicate shows.
func pagesOf(t *testing.T, v *graft.Volume) []uint64 {
	t.Helper()
	var out []uint64
	for c, err := range v.Entries(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		seg, err := v.Segment(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		for _, no := range seg.Pages() {
			data, err := seg.Lookup(no)
			if err != nil || string(data) != fmt.Sprint("page ", no) {
				t.Fatalf("page %d = %q, %v", no, data, err)
			}
			out = append(out, no)
		}
	}
	return out
}

func wantPages(t *testing.T, got []uint64, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("%d pages through the entries, want %d", len(got), n)
	}
	for i, no := range got {
		if no != uint64(i+1) {
			t.Fatalf("page %d at position %d: a gap or a duplicate", no, i)
		}
	}
}

// Compaction merges runs of small entries; readers before and after it,
// warm and cold, see every page once; verify passes before and after gc
// removes the replaced segments.
func TestCompact_MergesAndReadersSeeEveryPageOnce(t *testing.T) {
	st := deep(t, 300, 0)
	ctx := context.Background()
	before, _ := graft.Open(ctx, t.TempDir(), "vol", st) // a reader that opened before
	v, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	res, err := v.Compact(ctx, graft.CompactOptions{MinEntries: 64})
	if err != nil || res.Segments != 4 || res.Merged != 256 || res.Entries != 300-256+4 {
		t.Fatalf("compact: %+v %v; want 4 merged segments of 64 entries each, 48 entries left", res, err)
	}
	wantPages(t, pagesOf(t, before), 300) // still on the old state
	if err := before.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	wantPages(t, pagesOf(t, before), 300) // the compaction commits in its tail
	cold, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	if s := cold.Stats(); s.Entries != 48 {
		t.Fatalf("cold reader sees %d entries, want 48", s.Entries)
	}
	wantPages(t, pagesOf(t, cold), 300)
	if rep, err := cold.VerifyRemote(ctx); err != nil || rep.Entries != 48 || rep.Collected != 0 {
		t.Fatalf("verify after compaction: %+v %v", rep, err)
	}
	n, err := v.GC(ctx, 0, true)
	if err != nil || n < 256 {
		t.Fatalf("gc after compaction deleted %d, %v; want the 256 replaced segments at least", n, err)
	}
	rep, err := cold.VerifyRemote(ctx)
	if err != nil || rep.Collected != 256 {
		t.Fatalf("verify after gc: %+v %v; want 256 collected", rep, err)
	}
	wantPages(t, pagesOf(t, cold), 300)
	again, _ := graft.Open(ctx, t.TempDir(), "vol", st)
	wantPages(t, pagesOf(t, again), 300)
	// A second pass merges the merged ones with the rest once they reach MinEntries.
	if res, err := v.Compact(ctx, graft.CompactOptions{MinEntries: 48}); err != nil || res.Segments != 1 || res.Entries != 1 {
		t.Fatalf("second compact: %+v %v; want everything in one", res, err)
	}
	wantPages(t, pagesOf(t, v), 300)
}

// A compactor racing a writer: conflicts drop a compaction, never a page;
// the end state verifies and every reader sees every page once.
func TestCompact_RacingAWriter(t *testing.T) {
	st := deep(t, 50, 0)
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		w, _ := graft.Open(ctx, t.TempDir(), "vol", st)
		for i := 51; i <= 250; {
			time.Sleep(20 * time.Millisecond) // an archiver commits every few seconds; compaction must still race it
			_, err := w.Commit(ctx, []graft.Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, nil)
			if err == nil {
				i++
			} else if !graft.IsConflict(err) {
				t.Error(err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		c, _ := graft.Open(ctx, t.TempDir(), "vol", st)
		for range 40 {
			if _, err := c.Compact(ctx, graft.CompactOptions{MinEntries: 8}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	v, _ := graft.Open(ctx, t.TempDir(), "vol", st)
	if _, err := v.VerifyRemote(ctx); err != nil {
		t.Fatal(err)
	}
	wantPages(t, pagesOf(t, v), 250)
	// How many compactions won the race depends on the machine's load (a
	// compactor slower than the writer loses them all, which is safe); with
	// the writer done, one must go through.
	before := v.Stats().Entries
	if res, err := v.Compact(ctx, graft.CompactOptions{MinEntries: 8}); err != nil || res.Segments == 0 || res.Entries >= before {
		t.Fatalf("compaction after the race: %+v %v (from %d entries)", res, err, before)
	}
	wantPages(t, pagesOf(t, v), 250)
	if _, err := v.VerifyRemote(ctx); err != nil {
		t.Fatal(err)
	}
}

// With Current, Compact trusts the volume's view (an archive run's, which
// refreshed it and committed since): with nothing due it sends no request;
// when another writer committed past the view, the compaction loses its
// race for the LSN and is dropped, the other writer's commit standing and
// every page read once.
func TestCompact_CurrentView(t *testing.T) {
	ctx := context.Background()
	st := deep(t, 50, 0)
	v, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	requests := func() int64 { return st.Creates.Load() + st.Gets.Load() + st.Lists.Load() }
	before := requests()
	if res, err := v.Compact(ctx, graft.CompactOptions{MinEntries: 1000, Current: true}); err != nil || res.Segments != 0 {
		t.Fatalf("compaction with nothing due: %+v, %v", res, err)
	}
	if n := requests() - before; n != 0 {
		t.Fatalf("a current view with nothing due sent %d requests", n)
	}
	w, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Commit(ctx, []graft.Page{{No: 51, Data: []byte("page 51")}}, nil); err != nil {
		t.Fatal(err)
	}
	if res, err := v.Compact(ctx, graft.CompactOptions{MinEntries: 8, Current: true}); err != nil || res.Segments != 0 {
		t.Fatalf("compaction from a view another writer moved past: %+v, %v; want its race lost", res, err)
	}
	fresh, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	wantPages(t, pagesOf(t, fresh), 51)
	if _, err := fresh.VerifyRemote(ctx); err != nil {
		t.Fatal(err)
	}
}

// A compacting process killed at each step leaves a volume that opens,
// verifies and reads every page once; the next compaction goes on.
func TestCompact_CrashAtEachStep(t *testing.T) {
	for _, step := range []string{"segment-written", "segment-uploaded", "commit-put", "compaction-committed", "checkpoint-leaves", "checkpoint-put"} {
		t.Run(step, func(t *testing.T) {
			data, remote := t.TempDir(), t.TempDir()
			st, _ := fence.OpenLocal(remote)
			v, _ := graft.Open(context.Background(), data, "vol", st)
			for i := 1; i <= 40; i++ {
				v.Commit(context.Background(), []graft.Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, nil)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "GRAFT_CRASH_STEP="+step, "GRAFT_CRASH_DATA="+data, "GRAFT_CRASH_REMOTE="+remote, "GRAFT_CRASH_COMPACT=1")
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child not killed at %s: %v\n%s", step, err, out)
			}
			for _, dir := range []string{data, t.TempDir()} {
				r, err := graft.Open(context.Background(), dir, "vol", st)
				if err != nil {
					t.Fatalf("open after a kill at %s: %v", step, err)
				}
				wantPages(t, pagesOf(t, r), 40)
			}
			if _, err := v.VerifyRemote(context.Background()); err != nil {
				t.Fatal(err)
			}
			r, _ := graft.Open(context.Background(), data, "vol", st)
			if _, err := r.Compact(context.Background(), graft.CompactOptions{MinEntries: 8}); err != nil {
				t.Fatalf("compact after a kill at %s: %v", step, err)
			}
			if s := r.Stats(); s.Entries > 5 {
				t.Fatalf("after a kill at %s and a new compaction: %d entries", step, s.Entries)
			}
			wantPages(t, pagesOf(t, r), 40)
			if _, err := r.VerifyRemote(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPacked_DropKeepsLiveCommits: packed commits (the default) are one
// object each, so no segment object is written; an older build reading one
// whole refuses a newer format instead of calling it corrupt. A packed
// commit holds live data: gc --drop-old-commits keeps it until compaction
// replaced its segment, then deletes it, and readers, warm and cold, still
// see every page once while verify passes.
func TestPacked_DropKeepsLiveCommits(t *testing.T) {
	remote, st, v := packedOnLocal(t)
	ctx := context.Background()
	for i := 1; i <= 300; i++ {
		if _, err := v.Commit(ctx, []graft.Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if segs, err := st.List(ctx, "vol/segments/", "", 0); err != nil || len(segs) != 0 {
		t.Fatalf("%d segment objects (%v), want none: a packed commit holds its segment", len(segs), err)
	}
	whole, err := st.Get(ctx, "vol/commits/00000000000000000001", fence.Range{})
	if err != nil {
		t.Fatal(err)
	}
	// Builds of formats 1-2 read an object's first line for its version
	// before its checksum, and refuse one above 2 as newer.
	first, _, _ := bytes.Cut(whole, []byte("\n"))
	var peek struct{ Version int }
	if err := json.Unmarshal(first, &peek); err != nil || peek.Version != 3 {
		t.Fatalf("a packed object's first line %q: version %d, %v; want 3", first, peek.Version, err)
	}
	if _, err := graft.DecodeCommit("vol/commits/00000000000000000001", whole); !errors.Is(err, graft.ErrCorrupt) {
		t.Fatalf("a packed object read whole as a format 1 object: %v, want ErrCorrupt", err)
	}
	if n, err := v.DropOldCommits(ctx, 0, true, 0); err != nil || n != 0 {
		t.Fatalf("drop before compaction: %d, %v; want none (every commit holds a live segment)", n, err)
	}
	cold, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	wantPages(t, pagesOf(t, cold), 300)
	if res, err := v.Compact(ctx, graft.CompactOptions{MinEntries: 64}); err != nil || res.Merged != 256 {
		t.Fatalf("compact: %+v %v", res, err)
	}
	n, err := v.DropOldCommits(ctx, 0, true, 0)
	if err != nil || n < 256 {
		t.Fatalf("drop after compaction: %d, %v; want the 256 replaced commits at least", n, err)
	}
	for _, r := range []*graft.Volume{v, cold} {
		if err := r.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		wantPages(t, pagesOf(t, r), 300)
	}
	again, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	wantPages(t, pagesOf(t, again), 300)
	rep, err := again.VerifyRemote(ctx)
	if err != nil || rep.Entries != 48 || rep.ChainStart == 0 || rep.Unchained != 44 || rep.Segments < 48 {
		t.Fatalf("verify after the drop: %+v %v; want the 44 packed commits left below the chain's start, their segments checked", rep, err)
	}
	// Their segments are checked though no commit of the chain names them.
	obj := filepath.Join(remote, "vol", "commits", fmt.Sprintf("%020d", 280))
	flip(t, obj, 100) // a page record of its segment
	if _, err := again.VerifyRemote(ctx); !errors.Is(err, graft.ErrCorrupt) || !strings.Contains(err.Error(), "vol/commits/00000000000000000280") {
		t.Fatalf("verify with a live packed segment below the chain's start corrupt: %v", err)
	}
	flip(t, obj, 100)
	if err := os.Rename(obj, obj+".aside"); err != nil {
		t.Fatal(err)
	}
	if _, err := again.VerifyRemote(ctx); !errors.Is(err, fence.ErrNotFound) || !strings.Contains(err.Error(), "00000000000000000280") {
		t.Fatalf("verify with a live packed commit below the chain's start gone: %v", err)
	}
	if err := os.Rename(obj+".aside", obj); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Commit(ctx, []graft.Page{{No: 301, Data: []byte("page 301")}}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestPacked_AfterUnpackedHistory: a volume written by an older build (two
// objects a commit) goes on with packed commits after an upgrade: warm and
// cold readers see every page, compaction merges both kinds, verify passes
// before and after, and an encrypted store keeps writing two objects.
func TestPacked_AfterUnpackedHistory(t *testing.T) {
	st := &counting{Store: newStore(t)}
	ctx := context.Background()
	dir := t.TempDir()
	old, err := graft.OpenWith(ctx, dir, "vol", st, graft.Options{Unpacked: true})
	if err != nil {
		t.Fatal(err)
	}
	commit := func(v *graft.Volume, from, to int) {
		t.Helper()
		for i := from; i <= to; i++ {
			if _, err := v.Commit(ctx, []graft.Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	commit(old, 1, 40)
	upgraded, err := graft.Open(ctx, dir, "vol", st) // the same data directory
	if err != nil {
		t.Fatal(err)
	}
	commit(upgraded, 41, 80)
	segs, _ := st.List(ctx, "vol/segments/", "", 0)
	if len(segs) != 40 {
		t.Fatalf("%d segment objects, want the 40 of the unpacked commits", len(segs))
	}
	cold, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	wantPages(t, pagesOf(t, cold), 80)
	wantPages(t, pagesOf(t, old), 40) // not refreshed yet
	if err := old.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	wantPages(t, pagesOf(t, old), 80)
	if rep, err := cold.VerifyRemote(ctx); err != nil || rep.Commits != 80 || rep.Segments != 80 {
		t.Fatalf("verify of the mixed chain: %+v %v", rep, err)
	}
	if res, err := upgraded.Compact(ctx, graft.CompactOptions{MinEntries: 16}); err != nil || res.Merged != 80 {
		t.Fatalf("compact across both kinds: %+v %v", res, err)
	}
	again, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	wantPages(t, pagesOf(t, again), 80)
	if _, err := again.VerifyRemote(ctx); err != nil {
		t.Fatalf("verify after compaction: %v", err)
	}
	// On an encrypted store a commit stays two objects: a suffix read there
	// costs the whole object.
	key := make([]byte, 32)
	enc, err := fence.Encrypt(newStore(t), key)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := graft.Open(ctx, t.TempDir(), "vol", enc)
	if err != nil {
		t.Fatal(err)
	}
	commit(ev, 1, 3)
	if segs, err := enc.List(ctx, "vol/segments/", "", 0); err != nil || len(segs) != 3 {
		t.Fatalf("encrypted store: %d segment objects (%v), want 3", len(segs), err)
	}
}

// packedOnLocal opens volume "vol" (packed commits) on a local directory
// remote (returned, for tests that damage its files) through a counting store.
func packedOnLocal(t *testing.T) (string, *counting, *graft.Volume) {
	t.Helper()
	remote := t.TempDir()
	local, err := fence.OpenLocal(remote)
	if err != nil {
		t.Fatal(err)
	}
	st := &counting{Store: local}
	v, err := graft.Open(context.Background(), t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	return remote, st, v
}

// droppedChain writes 300 packed commits of a page each, compacts the
// first 256, drops the old commits, and commits 100 more past a newer
// checkpoint: a chain that starts at a checkpoint with live packed commits
// below it. It returns what packedOnLocal does and verify's report.
func droppedChain(t *testing.T) (string, *counting, *graft.Volume, graft.VerifyReport) {
	t.Helper()
	remote, st, v := packedOnLocal(t)
	ctx := context.Background()
	commit := func(from, to int) {
		t.Helper()
		for i := from; i <= to; i++ {
			if _, err := v.Commit(ctx, []graft.Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	commit(1, 300)
	if res, err := v.Compact(ctx, graft.CompactOptions{MinEntries: 64}); err != nil || res.Merged != 256 {
		t.Fatalf("compact: %+v %v", res, err)
	}
	if n, err := v.DropOldCommits(ctx, 0, true, 0); err != nil || n < 256 {
		t.Fatalf("drop: %d, %v", n, err)
	}
	commit(301, 400)
	rep, err := v.VerifyRemote(ctx)
	if err != nil || rep.ChainStart == 0 || rep.Unchained == 0 {
		t.Fatalf("verify: %+v %v; want a chain starting after a drop", rep, err)
	}
	return remote, st, v, rep
}

// TestRebuildIndex_AfterDrop: reindex of a chain that starts at a
// checkpoint (old commits dropped) keeps that checkpoint's nodes, checked,
// and writes the rest anew: a bad node of a later checkpoint is repaired;
// a bad node of the start's own is an error naming it (the commits that
// made it are gone).
func TestRebuildIndex_AfterDrop(t *testing.T) {
	remote, st, v, rep := droppedChain(t)
	ctx := context.Background()
	// The newest branch node, written by a checkpoint above the start
	// (node keys start with the LSN of the checkpoint that wrote them).
	branches, err := st.List(ctx, "vol/branches/", "", 0)
	if err != nil || len(branches) == 0 {
		t.Fatal(branches, err)
	}
	bad := branches[len(branches)-1]
	if lsn, _ := strconv.ParseUint(strings.SplitN(path.Base(bad), "-", 2)[0], 10, 64); lsn <= rep.ChainStart {
		t.Fatalf("the newest branch node %s is not above the chain's start %d", bad, rep.ChainStart)
	}
	flip(t, filepath.Join(remote, filepath.FromSlash(bad)), 10)
	cold, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cold.VerifyRemote(ctx); !errors.Is(err, graft.ErrCorrupt) || !strings.Contains(err.Error(), bad) {
		t.Fatalf("verify with the newest branch node corrupt: %v", err)
	}
	if lsn, err := cold.RebuildIndex(ctx); err != nil || lsn != v.Head() {
		t.Fatalf("rebuild after a drop: %d, %v; want a checkpoint at the head %d", lsn, err, v.Head())
	}
	again, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	wantPages(t, pagesOf(t, again), 400)
	if after, err := again.VerifyRemote(ctx); err != nil || after.ChainStart != rep.ChainStart {
		t.Fatalf("verify after the rebuild: %+v %v", after, err)
	}

	// A branch node the start's root names.
	root, err := st.Get(ctx, fmt.Sprintf("vol/checkpoints/%020d", uint64(math.MaxUint64)-rep.ChainStart), fence.Range{})
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := bytes.Cut(root, []byte("\n"))
	var named struct{ Branches []struct{ Key string } }
	if err := json.Unmarshal(line, &named); err != nil || len(named.Branches) == 0 {
		t.Fatalf("the start's root %q: %v", line, err)
	}
	start := named.Branches[0].Key
	flip(t, filepath.Join(remote, filepath.FromSlash(start)), 10)
	q, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.RebuildIndex(ctx); !errors.Is(err, graft.ErrCorrupt) || !strings.Contains(err.Error(), start) || !strings.Contains(err.Error(), "cannot be rebuilt") {
		t.Fatalf("rebuild with a node of the start's checkpoint corrupt: %v", err)
	}
}

// TestPull_AfterDrop: a chain whose old commits were dropped (packed ones
// below its start still holding live segments) is pulled from the
// checkpoint the drop left, as verify walks it: every page is then read
// from local files alone and the local copy verifies; a newest checkpoint
// with a bad node is not the base; a corrupt live segment below the start
// stops the pull naming it.
func TestPull_AfterDrop(t *testing.T) {
	remote, st, v, want := droppedChain(t)
	ctx := context.Background()

	p, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := p.Pull(ctx)
	if err != nil {
		t.Fatalf("pull of a dropped chain: %v", err)
	}
	if rep.ChainStart != want.ChainStart || rep.Unchained != want.Unchained || rep.Commits != want.Commits || rep.Segments != want.Segments {
		t.Fatalf("pull %+v, verify %+v: want the same chain and segments", rep, want)
	}
	gets := st.Gets.Load()
	wantPages(t, pagesOf(t, p), 400)
	if n := st.Gets.Load() - gets; n != 0 {
		t.Fatalf("reading the pulled copy took %d GETs, want none", n)
	}
	if _, err := p.VerifyLocal(ctx); err != nil {
		t.Fatalf("verify of the pulled copy: %v", err)
	}
	dir := t.TempDir()
	again, err := graft.Open(ctx, dir, "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Pull(ctx); err != nil {
		t.Fatal(err)
	}
	reopened, err := graft.Open(ctx, dir, "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	if reopened.Head() != v.Head() {
		t.Fatalf("the pulled copy reopened at head %d, want %d", reopened.Head(), v.Head())
	}
	wantPages(t, pagesOf(t, reopened), 400)

	// The newest checkpoint's own branch node, corrupt: not a base; the
	// pull falls back to the start's, and the pages are all there.
	branches, err := st.List(ctx, "vol/branches/", "", 0)
	if err != nil || len(branches) == 0 {
		t.Fatalf("branch nodes: %v %v", branches, err)
	}
	node := filepath.Join(remote, filepath.FromSlash(branches[len(branches)-1]))
	flip(t, node, 10)
	b, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Pull(ctx); err != nil {
		t.Fatalf("pull with the newest checkpoint's node corrupt: %v", err)
	}
	wantPages(t, pagesOf(t, b), 400)
	flip(t, node, 10)

	// A live packed commit below the chain's start, corrupt.
	obj := filepath.Join(remote, "vol", "commits", fmt.Sprintf("%020d", 280))
	flip(t, obj, 100)
	q, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Pull(ctx); !errors.Is(err, graft.ErrCorrupt) || !strings.Contains(err.Error(), "vol/commits/00000000000000000280") {
		t.Fatalf("pull with a live packed segment below the chain's start corrupt: %v", err)
	}
}

// TestPull_EveryCommitDropped: two-object commits, all covered by the
// newest checkpoint and dropped: pull starts and ends at that checkpoint.
func TestPull_EveryCommitDropped(t *testing.T) {
	st := &counting{Store: newStore(t)}
	ctx := context.Background()
	v, err := graft.OpenWith(ctx, t.TempDir(), "vol", st, graft.Options{Unpacked: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 150; i++ {
		if _, err := v.Commit(ctx, []graft.Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v.Compact(ctx, graft.CompactOptions{MinEntries: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Checkpoint(ctx, true); err != nil {
		t.Fatal(err)
	}
	if _, err := v.DropOldCommits(ctx, 0, true, 0); err != nil {
		t.Fatal(err)
	}
	if left, err := st.List(ctx, "vol/commits/", "", 0); err != nil || len(left) != 0 {
		t.Fatalf("%d commit objects left (%v), want none", len(left), err)
	}
	p, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := p.Pull(ctx)
	if err != nil || rep.ChainStart != v.Head() || rep.Commits != 0 || rep.Segments == 0 {
		t.Fatalf("pull: %+v %v; want it to start at the head's checkpoint %d", rep, err, v.Head())
	}
	gets := st.Gets.Load()
	wantPages(t, pagesOf(t, p), 150)
	if n := st.Gets.Load() - gets; n != 0 {
		t.Fatalf("reading the pulled copy took %d GETs, want none", n)
	}
	if p.Head() != v.Head() {
		t.Fatalf("pulled head %d, want %d", p.Head(), v.Head())
	}
}
