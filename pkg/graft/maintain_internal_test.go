package graft

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

	"github.com/silt-dev/silt/pkg/fence"
)

// listLimits records the limit of every List of segments.
type listLimits struct {
	fence.Store
	limits []int
}

func (s *listLimits) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	if strings.HasSuffix(prefix, "/segments/") {
		s.limits = append(s.limits, limit)
	}
	return s.Store.List(ctx, prefix, after, limit)
}

// TestGC_InPagesNeverAboveHead: gc lists the remote a page at a time;
// orphans on every page are deleted, remote and local; live segments and
// checkpoint nodes stay (a cold open reads every page once, verify
// passes); and a segment made for a commit above the head gc read stays,
// old and forced as it is (a commit in flight, or one made meanwhile).
func TestGC_InPagesNeverAboveHead(t *testing.T) {
	defer func(p int) { gcPage = p }(gcPage)
	gcPage = 3
	ctx := context.Background()
	st, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ls := &listLimits{Store: st}
	v, err := OpenWith(ctx, t.TempDir(), "vol", ls, Options{CheckpointEvery: 4, Unpacked: true})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := 1; i <= n; i++ {
		if _, err := v.Commit(ctx, []Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Orphans of lost races and crashed uploads, written long ago, spread
	// over the listing's pages; and the segment of a commit in flight.
	old := func(lsn uint64, writer string) string {
		return fmt.Sprintf("vol/segments/%s-%013d-%s", lsnName(lsn), 1000, writer)
	}
	var orphans []string
	for _, lsn := range []uint64{1, 7, 8, 13, n} {
		orphans = append(orphans, old(lsn, "lost"))
	}
	inFlight := old(n+1, "slow")
	for _, k := range append(orphans, inFlight) {
		if err := st.Create(ctx, k, []byte("not committed")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(v.dir, "segments", filepath.Base(k)), []byte("not committed"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ls.limits = nil
	deleted, err := v.GC(ctx, 0, true)
	if err != nil || deleted < len(orphans) {
		t.Fatalf("gc deleted %d, %v; want at least the %d orphans", deleted, err, len(orphans))
	}
	for _, k := range orphans {
		if _, err := st.Get(ctx, k, fence.Range{}); !errors.Is(err, fence.ErrNotFound) {
			t.Errorf("orphan %s left: %v", k, err)
		}
		if _, err := os.Stat(filepath.Join(v.dir, "segments", filepath.Base(k))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("local orphan %s left: %v", k, err)
		}
	}
	if _, err := st.Get(ctx, inFlight, fence.Range{}); err != nil {
		t.Errorf("the segment of commit %d, above the head, was deleted: %v", n+1, err)
	}
	if _, err := os.Stat(filepath.Join(v.dir, "segments", filepath.Base(inFlight))); err != nil {
		t.Errorf("the local segment of commit %d was deleted: %v", n+1, err)
	}
	pages := 0
	for _, l := range ls.limits {
		if l != gcPage {
			t.Errorf("gc listed with limit %d, want pages of %d", l, gcPage)
		}
		pages++
	}
	if min := (n + len(orphans) + 1) / gcPage; pages < min {
		t.Errorf("%d lists, want at least %d pages of segments", pages, min)
	}

	cold, err := OpenWith(ctx, t.TempDir(), "vol", st, Options{})
	if err != nil {
		t.Fatal(err)
	}
	next := uint64(1)
	for c, err := range cold.Entries(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		seg, err := cold.Segment(ctx, c)
		if err != nil {
			t.Fatalf("after gc: %v", err)
		}
		for _, no := range seg.Pages() {
			data, err := seg.Lookup(no)
			if err != nil || no != next || string(data) != fmt.Sprintf("page %d", no) {
				t.Fatalf("after gc: page %d = %q, %v; want page %d", no, data, err, next)
			}
			next++
		}
	}
	if next != n+1 {
		t.Fatalf("after gc: %d pages read, want %d", next-1, n)
	}
	if _, err := cold.VerifyRemote(ctx); err != nil {
		t.Fatalf("after gc: %v", err)
	}
}

// slowDeletes makes each delete take a while and records how many were in
// flight at once.
type slowDeletes struct {
	fence.Store
	mu        sync.Mutex
	now, most int
	fail      string // a key whose delete is refused
	budget    int    // > 0: deletes refused once this many started (a kill)
	started   int
}

var errRefused = errors.New("delete refused")

func (s *slowDeletes) Delete(ctx context.Context, key string) error {
	s.mu.Lock()
	s.started++
	if key == s.fail || s.budget > 0 && s.started > s.budget {
		s.mu.Unlock()
		return errRefused
	}
	s.now++
	s.most = max(s.most, s.now)
	s.mu.Unlock()
	time.Sleep(5 * time.Millisecond) // an object store's round trip
	defer func() { s.mu.Lock(); s.now--; s.mu.Unlock() }()
	return s.Store.Delete(ctx, key)
}

// TestGC_DeletesInParallel: gc keeps gcDeletes deletes in flight (a first
// gc of a year of compacted commits is a million of them), and a failing
// delete is gc's error.
func TestGC_DeletesInParallel(t *testing.T) {
	ctx := context.Background()
	st, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	slow := &slowDeletes{Store: st}
	v, err := OpenWith(ctx, t.TempDir(), "vol", slow, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Commit(ctx, []Page{{No: 1, Data: []byte("live")}}, nil); err != nil {
		t.Fatal(err)
	}
	const orphans = 4 * gcDeletes
	for i := range orphans {
		if err := st.Create(ctx, fmt.Sprintf("vol/segments/%s-%013d-lost%d", lsnName(1), 1000, i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	n, err := v.GC(ctx, 0, true)
	if err != nil || n != orphans {
		t.Fatalf("gc deleted %d, %v; want %d", n, err, orphans)
	}
	if slow.most != gcDeletes {
		t.Fatalf("at most %d deletes in flight, want %d", slow.most, gcDeletes)
	}
	// A refused delete early in the listing: gc stops with its error, not
	// with the cancelled listing's.
	defer func(p int) { gcPage = p }(gcPage)
	gcPage = 4
	broken := fmt.Sprintf("vol/segments/%s-%013d-a-refused", lsnName(1), 1000)
	for i := range 4 * gcPage {
		if err := st.Create(ctx, fmt.Sprintf("%s-%02d", broken, i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	slow.fail = broken + "-00"
	if _, err := v.GC(ctx, 0, true); !errors.Is(err, errRefused) {
		t.Fatalf("gc with a failing delete: %v; want the delete's error", err)
	}
}

// TestDropOldCommits_EndedAnywhere: a drop deletes gcDeletes commits at
// once, and wherever it ends (its limit, a refused delete, a kill after
// any number of deletes) the volume verifies, from the oldest checkpoint
// above the commits it left, and the next drop finishes the job. Commits
// missing above what a drop marked are still named; a prefix dropped by a
// build that left no mark is forgiven only up to a checkpoint.
func TestDropOldCommits_EndedAnywhere(t *testing.T) {
	defer func(p int) { gcPage = p }(gcPage)
	gcPage = 7
	ctx := context.Background()
	build := func(t *testing.T) (*slowDeletes, *Volume) {
		var slow *slowDeletes
		_, v := pagesVolumeOn(t, func(st fence.Store) fence.Store { slow = &slowDeletes{Store: st}; return slow }, 100, 8)
		return slow, v
	}
	verified := func(t *testing.T, v *Volume, what string) VerifyReport {
		t.Helper()
		rep, err := v.VerifyRemote(ctx)
		if err != nil || rep.ChainStart == 0 || rep.ChainStart%8 != 0 || rep.Commits != 100-int(rep.ChainStart) || rep.Entries != 100 {
			t.Fatalf("verify %s: %+v, %v", what, rep, err)
		}
		return rep
	}
	finish := func(t *testing.T, slow *slowDeletes, v *Volume) {
		t.Helper()
		slow.fail, slow.budget = "", 0
		if _, err := v.DropOldCommits(ctx, 0, true, 0); err != nil {
			t.Fatal(err)
		}
		if rep := verified(t, v, "after the drop finished"); rep.ChainStart != 96 || rep.Unchained != 0 {
			t.Fatalf("after the drop finished: %+v; want the chain from checkpoint 96, nothing unchained", rep)
		}
	}
	t.Run("in parallel", func(t *testing.T) {
		slow, v := build(t)
		n, err := v.DropOldCommits(ctx, 0, true, 0)
		if err != nil || n != 96 || slow.most != gcDeletes {
			t.Fatalf("dropped %d, %v, %d deletes at most in flight; want 96, %d", n, err, slow.most, gcDeletes)
		}
		verified(t, v, "after a whole drop")
	})
	t.Run("limit", func(t *testing.T) {
		slow, v := build(t)
		if n, err := v.DropOldCommits(ctx, 0, true, 30); err != nil || n != 30 {
			t.Fatalf("dropped %d, %v; want 30", n, err)
		}
		if rep := verified(t, v, "after 30 of 96"); rep.ChainStart != 32 || rep.Unchained != 2 {
			t.Fatalf("after 30 of 96 dropped: %+v; want the chain from checkpoint 32, commits 31 and 32 unchained", rep)
		}
		finish(t, slow, v)
	})
	for _, kill := range []int{1, 9, 40, 95} {
		t.Run(fmt.Sprint("killed after ", kill), func(t *testing.T) {
			slow, v := build(t)
			slow.budget = kill
			if _, err := v.DropOldCommits(ctx, 0, true, 0); !errors.Is(err, errRefused) {
				t.Fatalf("drop killed after %d deletes: %v", kill, err)
			}
			verified(t, v, fmt.Sprint("after a drop killed after ", kill))
			finish(t, slow, v)
		})
	}
	t.Run("refused in the middle", func(t *testing.T) {
		slow, v := build(t)
		slow.fail = v.commitKey(37)
		gcPage = 1000 // one page: a failed delete must stop the deletes, not the listing
		defer func() { gcPage = 7 }()
		if _, err := v.DropOldCommits(ctx, 0, true, 0); !errors.Is(err, errRefused) {
			t.Fatalf("drop with commit 37's delete refused: %v", err)
		}
		if slow.started > 37+gcDeletes {
			t.Fatalf("%d deletes issued; after commit 37's was refused, at most the %d in flight should follow", slow.started, gcDeletes)
		}
		if rep := verified(t, v, "with commit 37 left"); rep.ChainStart < 40 || rep.Unchained == 0 {
			t.Fatalf("with commit 37 left: %+v; want the chain from a checkpoint above 37", rep)
		}
		// A commit missing above the mark is never forgiven.
		if err := slow.Store.Delete(ctx, v.commitKey(99)); err != nil {
			t.Fatal(err)
		}
		if _, err := v.VerifyRemote(ctx); !errors.Is(err, ErrMissingCommits) || !strings.Contains(err.Error(), "vol/commits/"+lsnName(99)) ||
			strings.Contains(err.Error(), lsnName(36)) {
			t.Fatalf("verify with commit 99 gone: %v; want it named, and only it", err)
		}
	})
	t.Run("no mark", func(t *testing.T) {
		slow, v := build(t)
		for lsn := uint64(1); lsn <= 20; lsn++ {
			if err := slow.Store.Delete(ctx, v.commitKey(lsn)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := v.VerifyRemote(ctx); !errors.Is(err, ErrMissingCommits) || !strings.Contains(err.Error(), lsnName(1)+".."+lsnName(20)) {
			t.Fatalf("verify with commits 1-20 gone, no mark: %v", err)
		}
		for lsn := uint64(21); lsn <= 24; lsn++ {
			slow.Store.Delete(ctx, v.commitKey(lsn))
		}
		if rep := verified(t, v, "with commits 1-24 gone, no mark"); rep.ChainStart != 24 {
			t.Fatalf("commits 1-24 gone, no mark: %+v; want the chain from checkpoint 24", rep)
		}
	})
}

// TestGC_KeepsNodesOfACheckpointInFlight: a checkpoint writes its nodes
// before its root, and a node's key carries its writer's clock. gc never
// deletes a node made for a checkpoint above the newest root (one in
// flight), however old its key says it is; an unnamed node at or below it
// (a checkpoint that lost or crashed) goes once past the grace.
func TestGC_KeepsNodesOfACheckpointInFlight(t *testing.T) {
	ctx := context.Background()
	st, v := pagesVolume(t, 20, 4)
	node := func(dir string, lsn uint64) string { // written "in 1970": a clock far behind
		return fmt.Sprintf("vol/%s/%s-%013d-%064d", dir, lsnName(lsn), 1000, lsn)
	}
	inFlight := []string{node("index", 21), node("branches", 21)}
	orphans := []string{node("index", 20), node("branches", 12)}
	for _, k := range append(slices.Clone(inFlight), orphans...) {
		if err := st.Create(ctx, k, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v.GC(ctx, time.Minute, false); err != nil {
		t.Fatal(err)
	}
	for _, k := range inFlight {
		if _, err := st.Get(ctx, k, fence.Range{}); err != nil {
			t.Errorf("node %s of the checkpoint in flight: %v", k, err)
		}
	}
	for _, k := range orphans {
		if _, err := st.Get(ctx, k, fence.Range{}); !errors.Is(err, fence.ErrNotFound) {
			t.Errorf("unnamed node %s left: %v", k, err)
		}
	}
	if _, err := v.VerifyRemote(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestVerify_InPages: verify reads the commit listing a page at a time
// (twice: holes first) and gives the same verdicts as with one page: a
// whole chain with compacted and collected segments passes, a hole is
// named, a chain whose old commits were dropped starts at its checkpoint,
// and a live segment gone is named by its key.
func TestVerify_InPages(t *testing.T) {
	defer func(p int) { gcPage = p }(gcPage)
	gcPage = 3
	ctx := context.Background()
	build := func(t *testing.T) (*fence.Local, *Volume) {
		st, err := fence.OpenLocal(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		v, err := OpenWith(ctx, t.TempDir(), "vol", st, Options{CheckpointEvery: 4, Unpacked: true}) // segments collected, a segment object gone
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i <= 20; i++ {
			if _, err := v.Commit(ctx, []Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, nil); err != nil {
				t.Fatal(err)
			}
		}
		return st, v
	}
	t.Run("compacted and collected", func(t *testing.T) {
		_, v := build(t)
		if _, err := v.Compact(ctx, CompactOptions{MinEntries: 8}); err != nil {
			t.Fatal(err)
		}
		if _, err := v.GC(ctx, 0, true); err != nil {
			t.Fatal(err)
		}
		rep, err := v.VerifyRemote(ctx)
		if err != nil || rep.Commits < 21 || rep.Collected == 0 || rep.Pages == 0 {
			t.Fatalf("verify: %+v, %v; want every commit, some segments collected", rep, err)
		}
	})
	t.Run("hole", func(t *testing.T) {
		st, v := build(t)
		for _, lsn := range []uint64{7, 8, 14} {
			if err := st.Delete(ctx, v.commitKey(lsn)); err != nil {
				t.Fatal(err)
			}
		}
		_, err := v.VerifyRemote(ctx)
		if !errors.Is(err, ErrMissingCommits) || !strings.Contains(err.Error(), "vol/commits/"+lsnName(7)+".."+lsnName(8)) ||
			!strings.Contains(err.Error(), "vol/commits/"+lsnName(14)) {
			t.Fatalf("verify with commits 7, 8 and 14 gone: %v", err)
		}
	})
	t.Run("old commits dropped", func(t *testing.T) {
		_, v := build(t)
		if _, err := v.DropOldCommits(ctx, 0, true, 0); err != nil {
			t.Fatal(err)
		}
		rep, err := v.VerifyRemote(ctx)
		if err != nil || rep.ChainStart == 0 || rep.Commits != 20-int(rep.ChainStart) {
			t.Fatalf("verify after drop-old-commits: %+v, %v", rep, err)
		}
	})
	t.Run("live segment gone", func(t *testing.T) {
		st, v := build(t)
		var key string
		for e, err := range v.Entries(ctx, nil) {
			if err != nil {
				t.Fatal(err)
			}
			if e.LSN == 5 {
				key = e.Segment.Key
			}
		}
		if err := st.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		_, err := v.VerifyRemote(ctx)
		if !errors.Is(err, fence.ErrNotFound) || !strings.Contains(err.Error(), key) {
			t.Fatalf("verify with the segment of commit 5 gone: %v; want it named", err)
		}
	})
}
