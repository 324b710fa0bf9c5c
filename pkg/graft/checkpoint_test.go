package graft_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/graft"
)

// deep commits n single-page commits (page i+1 holds "page i+1") through a
// volume with the given checkpoint interval and returns the store.
func deep(t *testing.T, n, every int) *counting {
	t.Helper()
	st := &counting{Store: newStore(t)}
	v, err := graft.OpenWith(context.Background(), t.TempDir(), "vol", st, graft.Options{CheckpointEvery: every, Unpacked: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		if _, err := v.Commit(context.Background(), []graft.Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, map[string]string{"n": fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// A cold open (empty data directory) costs the same few requests whatever
// the history's length: one LIST for the newest checkpoint key, its root,
// and four to six GETs that find the newest commit after it (its tail
// names the others); no LIST of the commits. Reading a page
// then costs a branch, a leaf and a segment.
func TestCheckpoint_ColdOpenIsFlat(t *testing.T) {
	for _, n := range []int{40, 400, 1500} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			st := deep(t, n, 0)
			st.Reset()
			v, err := graft.Open(context.Background(), t.TempDir(), "vol", st)
			if err != nil {
				t.Fatal(err)
			}
			open := st.Requests()
			if v.Head() != uint64(n) || open > 8 || st.FullLists.Load() > 0 {
				t.Fatalf("cold open of %d commits: head %d, %d requests (%d gets, %d lists, %d of a whole prefix); want %d and <= 8, no whole list",
					n, v.Head(), open, st.Gets.Load(), st.Lists.Load(), st.FullLists.Load(), n)
			}
			for _, no := range []uint64{1, uint64(n) / 2, uint64(n)} {
				st.Reset()
				if got := read(t, v, v.Head(), no); got != fmt.Sprint("page ", no) {
					t.Fatalf("page %d = %q", no, got)
				}
				if st.Requests() > 3 {
					t.Fatalf("cold read of page %d: %d requests, want <= 3 (a branch, a leaf, a segment)", no, st.Requests())
				}
			}
			if got := v.Latest().Meta["n"]; got != fmt.Sprint(n) {
				t.Fatalf("latest commit meta n = %q", got)
			}
		})
	}
}

// Deleting the oldest commit objects (a lifecycle rule did it) no longer
// stops a cold open or a read: the checkpoint covers them. Verify names
// every missing object.
func TestCheckpoint_MissingOldCommitsStillOpen(t *testing.T) {
	st := deep(t, 100, 0)
	for _, lsn := range []int{1, 2, 3, 50} {
		if err := st.Delete(context.Background(), fmt.Sprintf("vol/commits/%020d", lsn)); err != nil {
			t.Fatal(err)
		}
	}
	v, err := graft.Open(context.Background(), t.TempDir(), "vol", st)
	if err != nil {
		t.Fatalf("cold open with old commits deleted: %v", err)
	}
	for no := uint64(1); no <= 100; no++ {
		if got := read(t, v, 100, no); got != fmt.Sprint("page ", no) {
			t.Fatalf("page %d = %q", no, got)
		}
	}
	_, err = v.VerifyRemote(context.Background())
	if !errors.Is(err, graft.ErrMissingCommits) || !strings.Contains(err.Error(), "vol/commits/00000000000000000001..00000000000000000003 (3 objects)") ||
		!strings.Contains(err.Error(), "vol/commits/00000000000000000050") {
		t.Fatalf("verify = %v, want the missing commits named", err)
	}
	if _, err := v.Commit(context.Background(), []graft.Page{{No: 101, Data: []byte("page 101")}}, nil); err != nil {
		t.Fatalf("commit on a checkpointed chain with old commits gone: %v", err)
	}
}

// A corrupt newest checkpoint is named in a warning and the open starts
// from the one before it; with every checkpoint corrupt it reads the chain
// instead; with the chain broken as well, the error names what is missing
// and the repair.
func TestCheckpoint_CorruptFallsBackToOlderThenChain(t *testing.T) {
	st := deep(t, 40, 0)
	keys, err := st.List(context.Background(), "vol/checkpoints/", "", 0)
	if err != nil || len(keys) != 2 {
		t.Fatal(keys, err)
	}
	root := func(key string) string { return filepath.Join(st.Store.(*fence.Local).Root(), filepath.FromSlash(key)) }
	open := func(what string, wantWarnings ...string) *graft.Volume {
		t.Helper()
		var warnings []string
		v, err := graft.OpenWith(context.Background(), t.TempDir(), "vol", st, graft.Options{Warn: func(m string) { warnings = append(warnings, m) }})
		if err != nil || v.Head() != 40 {
			t.Fatalf("open with %s: %v", what, err)
		}
		if len(warnings) != len(wantWarnings) {
			t.Fatalf("open with %s: warnings %q, want %q", what, warnings, wantWarnings)
		}
		for i, w := range wantWarnings {
			if !strings.Contains(warnings[i], w) || !strings.Contains(warnings[i], "corrupt") {
				t.Fatalf("open with %s: warning %q, want %q", what, warnings[i], w)
			}
		}
		if got := read(t, v, 40, 7); got != "page 7" {
			t.Fatalf("page 7 = %q", got)
		}
		return v
	}
	flip(t, root(keys[0]), 30)
	v := open("the newest checkpoint corrupt", "checkpoint 32 unusable, trying the one before it")
	if _, err := v.VerifyRemote(context.Background()); !errors.Is(err, graft.ErrCorrupt) || !strings.Contains(err.Error(), keys[0]) {
		t.Fatalf("verify = %v, want the corrupt checkpoint named", err)
	}
	flip(t, root(keys[1]), 30)
	open("every checkpoint corrupt", "checkpoint 32 unusable, trying the one before it", "checkpoint 16 unusable, reading the commit chain instead")
	st.Delete(context.Background(), "vol/commits/00000000000000000005")
	_, err = graft.Open(context.Background(), t.TempDir(), "vol", st)
	if !errors.Is(err, graft.ErrMissingCommits) || !strings.Contains(err.Error(), "vol/commits/00000000000000000005") {
		t.Fatalf("open with a corrupt checkpoint and a hole in the chain = %v", err)
	}
}

// Once old commits were dropped, a corrupt newest checkpoint is passed over
// for the one the drop kept, but never for one below the commits dropped:
// its newest commit would be looked for in the hole above it, and the
// volume would open at that checkpoint, silently behind.
func TestCheckpoint_CorruptAfterDropNeverOpensBehind(t *testing.T) {
	st := deep(t, 80, 0)
	ctx := context.Background()
	v, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // checkpoint 80 older than the grace
	for i := uint64(81); i <= 100; i++ {
		if _, err := v.Commit(ctx, []graft.Page{{No: i, Data: fmt.Appendf(nil, "page %d", i)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := v.DropOldCommits(ctx, time.Second, true, 0); err != nil || n != 80 {
		t.Fatalf("dropped %d, %v; want the 80 up to checkpoint 80, the oldest kept", n, err)
	}
	root := func(lsn int) string {
		return filepath.Join(st.Store.(*fence.Local).Root(), "vol", "checkpoints", fmt.Sprintf("%020d", uint64(math.MaxUint64)-uint64(lsn)))
	}
	flip(t, root(96), 30)
	var warnings []string
	cold, err := graft.OpenWith(ctx, t.TempDir(), "vol", st, graft.Options{Warn: func(m string) { warnings = append(warnings, m) }})
	if err != nil || cold.Head() != 100 || len(warnings) != 1 || !strings.Contains(warnings[0], "checkpoint 96 unusable, trying the one before it") {
		t.Fatalf("open with checkpoint 96 corrupt: head %d, %v, warnings %q; want head 100 from checkpoint 80", cold.Head(), err, warnings)
	}
	for no := uint64(1); no <= 100; no++ {
		if got := read(t, cold, 100, no); got != fmt.Sprint("page ", no) {
			t.Fatalf("page %d = %q", no, got)
		}
	}
	flip(t, root(80), 30)
	behind, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if !errors.Is(err, graft.ErrMissingCommits) || !strings.Contains(err.Error(), "the commits up to 80 were dropped") {
		head := uint64(0)
		if behind != nil {
			head = behind.Head()
		}
		t.Fatalf("open with checkpoints 96 and 80 corrupt: head %d, %v; want the missing commits named, not checkpoint 64's head", head, err)
	}
}

// A warm reader that falls far behind (here 300 commits, many checkpoints)
// reopens through the newest checkpoint instead of probing every commit,
// and a long-lived handle moves its base as it refreshes, holding at most
// about CheckpointEvery commits.
func TestCheckpoint_WarmReaderJumpsAndRebases(t *testing.T) {
	st := &counting{Store: newStore(t)}
	ctx := context.Background()
	w, _ := graft.Open(ctx, t.TempDir(), "vol", st)
	rdir := t.TempDir()
	r, _ := graft.Open(ctx, rdir, "vol", st)
	for i := 1; i <= 300; i++ {
		if _, err := w.Commit(ctx, []graft.Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, nil); err != nil {
			t.Fatal(err)
		}
		if i%50 == 0 {
			if err := r.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			if s := r.Stats(); r.Head()-s.Base > 2*graft.CheckpointEvery {
				t.Fatalf("after %d commits the reader holds %d commits above its base %d", i, r.Head()-s.Base, s.Base)
			}
		}
	}
	for i := 301; i <= 600; i++ {
		w.Commit(ctx, []graft.Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, nil)
	}
	st.Reset()
	r2, err := graft.Open(ctx, rdir, "vol", st)
	if err != nil || r2.Head() != 600 {
		t.Fatalf("warm reopen 300 commits behind: head %d, %v", r2.Head(), err)
	}
	// The open reads the local head's commit, the checkpoints and the
	// commit after the head at once: that last GET goes unused when a
	// checkpoint moves the head.
	if st.Requests() > 10 || st.FullLists.Load() > 0 {
		t.Fatalf("warm reopen 300 commits behind: %d requests (%d whole lists), want <= 10 (a cold open's, one GET checking the local head and one probing after it)", st.Requests(), st.FullLists.Load())
	}
	if got := read(t, r2, 600, 333); got != "page 333" {
		t.Fatalf("page 333 = %q", got)
	}
}

// Two writers racing, both checkpointing, beside gc with a grace longer
// than a commit takes (1 s, forced): every commit and checkpoint verifies,
// and a cold reader sees every page. (With no grace at all gc can delete
// a segment uploaded but not yet committed: the grace is what protects it.)
func TestCheckpoint_RacingWritersAndGC(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := graft.OpenWith(ctx, t.TempDir(), "vol", st, graft.Options{CheckpointEvery: 4})
			if err != nil {
				t.Error(err)
				return
			}
			for range 60 {
				time.Sleep(40 * time.Millisecond)
				no := v.Head() + 1
				if _, err := v.Commit(ctx, []graft.Page{{No: no, Data: fmt.Appendf(nil, "page %d", no)}}, nil); err != nil && !graft.IsConflict(err) {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		}()
	}
	gcDone := make(chan error, 1)
	go func() {
		g, err := graft.Open(ctx, t.TempDir(), "vol", st)
		for err == nil {
			select {
			case <-stop:
				gcDone <- nil
				return
			default:
			}
			_, err = g.GC(ctx, time.Second, true)
		}
		gcDone <- err
	}()
	wg.Wait()
	close(stop)
	if err := <-gcDone; err != nil {
		t.Fatalf("gc beside writers: %v", err)
	}
	v, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := v.VerifyRemote(ctx)
	if err != nil || rep.Checkpoints == 0 {
		t.Fatalf("verify after racing writers and gc: %+v %v", rep, err)
	}
	for no := uint64(1); no <= v.Head(); no++ {
		if got := read(t, v, v.Head(), no); got != fmt.Sprint("page ", no) {
			t.Fatalf("page %d = %q", no, got)
		}
	}
}

// gc refuses a grace under a minute unless forced.
func TestCheckpoint_GCRefusesShortGrace(t *testing.T) {
	st := deep(t, 3, 0)
	v, _ := graft.Open(context.Background(), t.TempDir(), "vol", st)
	if _, err := v.GC(context.Background(), 10*time.Second, false); !errors.Is(err, graft.ErrGraceTooShort) {
		t.Fatalf("gc --grace 10s = %v, want ErrGraceTooShort", err)
	}
}

// Superseded checkpoint roots and the leaves only they named go once the
// checkpoint after them is older than the grace; the newest stays.
func TestCheckpoint_GCRemovesSupersededCheckpoints(t *testing.T) {
	st := deep(t, 100, 0)
	count := func(prefix string) int {
		keys, _ := st.List(context.Background(), prefix, "", 0)
		return len(keys)
	}
	if count("vol/checkpoints/") != 6 {
		t.Fatalf("%d checkpoints after 100 commits, want 6", count("vol/checkpoints/"))
	}
	v, _ := graft.Open(context.Background(), t.TempDir(), "vol", st)
	if _, err := v.GC(context.Background(), time.Hour, false); err != nil || count("vol/checkpoints/") != 6 {
		t.Fatalf("gc with an hour's grace removed checkpoints: %d left, %v", count("vol/checkpoints/"), err)
	}
	if _, err := v.GC(context.Background(), 0, true); err != nil {
		t.Fatal(err)
	}
	if count("vol/checkpoints/") != 1 || count("vol/index/") != 1 {
		t.Fatalf("after gc: %d checkpoints, %d leaves; want 1 and 1", count("vol/checkpoints/"), count("vol/index/"))
	}
	cold, err := graft.Open(context.Background(), t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, cold, 100, 50); got != "page 50" {
		t.Fatalf("page 50 = %q", got)
	}
	if _, err := cold.VerifyRemote(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove
}

// Dropping the commits before the oldest checkpoint a reader may hold
// leaves a volume that opens cold, reads every page, takes new commits, and
// verifies from that checkpoint; a hole anywhere else is still an error.
func TestCheckpoint_DropOldCommits(t *testing.T) {
	st := deep(t, 100, 0)
	ctx := context.Background()
	v, _ := graft.Open(ctx, t.TempDir(), "vol", st)
	if _, err := v.DropOldCommits(ctx, time.Second, false, 0); !errors.Is(err, graft.ErrGraceTooShort) {
		t.Fatalf("drop with a 1s grace = %v, want ErrGraceTooShort", err)
	}
	n, err := v.DropOldCommits(ctx, 0, true, 0)
	if err != nil || n != 96 {
		t.Fatalf("dropped %d commits, %v; want the 96 before checkpoint 96", n, err)
	}
	cold, err := graft.OpenWith(ctx, t.TempDir(), "vol", st, graft.Options{Unpacked: true}) // its commits are dropped below
	if err != nil {
		t.Fatal(err)
	}
	for no := uint64(1); no <= 100; no++ {
		if got := read(t, cold, 100, no); got != fmt.Sprint("page ", no) {
			t.Fatalf("page %d = %q", no, got)
		}
	}
	if _, err := cold.Commit(ctx, []graft.Page{{No: 101, Data: []byte("page 101")}}, nil); err != nil {
		t.Fatal(err)
	}
	rep, err := cold.VerifyRemote(ctx)
	if err != nil || rep.ChainStart != 96 || rep.Commits != 5 || rep.Entries != 101 {
		t.Fatalf("verify from the checkpoint: %+v %v", rep, err)
	}
	// A warm data directory whose head commit was dropped since opens from
	// the checkpoint, with a warning, instead of calling the remote foreign.
	staleDir := t.TempDir()
	graft.Open(ctx, staleDir, "vol", st)
	for i := uint64(102); i <= 140; i++ {
		cold.Commit(ctx, []graft.Page{{No: i, Data: fmt.Appendf(nil, "page %d", i)}}, nil)
	}
	if _, err := cold.DropOldCommits(ctx, 0, true, 0); err != nil {
		t.Fatal(err)
	}
	var warned []string
	stale, err := graft.OpenWith(ctx, staleDir, "vol", st, graft.Options{Warn: func(m string) { warned = append(warned, m) }})
	if err != nil || stale.Head() != 140 || len(warned) != 1 || !strings.Contains(warned[0], "dropped local head commit 101") {
		t.Fatalf("warm open after its head was dropped: head %d, %v, warnings %q", stale.Head(), err, warned)
	}
	if got := read(t, stale, 140, 120); got != "page 120" {
		t.Fatalf("page 120 = %q", got)
	}
	st.Delete(ctx, "vol/commits/00000000000000000139")
	if _, err := cold.VerifyRemote(ctx); !errors.Is(err, graft.ErrMissingCommits) || !strings.Contains(err.Error(), "commits/00000000000000000139") {
		t.Fatalf("verify with a hole after the chain start = %v", err)
	}
}

// A corrupt index node (shared by every later checkpoint) is named by a
// cold read and by verify; RebuildIndex writes the index anew from the
// chain, and then cold reads and verify pass.
func TestCheckpoint_RebuildIndexRepairsACorruptNode(t *testing.T) {
	st := deep(t, 300, 0)
	ctx := context.Background()
	leaves, err := st.List(ctx, "vol/index/", "", 0)
	if err != nil || len(leaves) == 0 {
		t.Fatal(leaves, err)
	}
	for _, l := range leaves { // among them the full first leaf, shared by every root since
		flip(t, filepath.Join(st.Store.(*fence.Local).Root(), filepath.FromSlash(l)), 40)
	}
	bad := "vol/index/"
	cold, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cold.Read(ctx, 5); !errors.Is(err, graft.ErrCorrupt) || !strings.Contains(err.Error(), bad) {
		t.Fatalf("cold read through a corrupt leaf = %v, want it named", err)
	}
	if _, err := cold.VerifyRemote(ctx); !errors.Is(err, graft.ErrCorrupt) {
		t.Fatalf("verify with a corrupt leaf = %v", err)
	}
	lsn, err := cold.RebuildIndex(ctx)
	if err != nil || lsn != 300 {
		t.Fatalf("rebuild: %d %v", lsn, err)
	}
	again, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	for no := uint64(1); no <= 300; no++ {
		if got := read(t, again, 300, no); got != fmt.Sprint("page ", no) {
			t.Fatalf("page %d after the rebuild = %q", no, got)
		}
	}
	if _, err := again.VerifyRemote(ctx); err != nil {
		t.Fatalf("verify after the rebuild: %v", err)
	}
	if _, err := again.Commit(ctx, []graft.Page{{No: 301, Data: []byte("page 301")}}, nil); err != nil {
		t.Fatal(err)
	}
}

// A volume written before checkpoints existed (here: a writer that wrote
// none) is read through its whole chain until a writer checkpoints it;
// Checkpoint does that on its first call (an archive run calls it), and
// cold opens are then flat.
func TestCheckpoint_VolumeFromBeforeCheckpoints(t *testing.T) {
	st := deep(t, 60, -1)
	ctx := context.Background()
	if keys, _ := st.List(ctx, "vol/checkpoints/", "", 0); len(keys) != 0 {
		t.Fatalf("%d checkpoints written by a writer told to write none", len(keys))
	}
	st.Reset()
	legacy, err := graft.Open(ctx, t.TempDir(), "vol", st)
	// The chain read: its listing twice (holes named first), every commit.
	if err != nil || legacy.Head() != 60 || st.FullLists.Load() != 2 || st.Gets.Load() < 60 {
		t.Fatalf("open without a checkpoint: head %d, %v, %d whole lists, %d gets; want the chain read", legacy.Head(), err, st.FullLists.Load(), st.Gets.Load())
	}
	if lsn, err := legacy.Checkpoint(ctx, false); err != nil || lsn != 60 {
		t.Fatalf("first checkpoint of an old volume: %d %v", lsn, err)
	}
	st.Reset()
	cold, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil || cold.Head() != 60 || st.Requests() > 8 || st.FullLists.Load() != 0 {
		t.Fatalf("cold open after the first checkpoint: head %d, %v, %d requests", cold.Head(), err, st.Requests())
	}
	if got := read(t, cold, 60, 33); got != "page 33" {
		t.Fatalf("page 33 = %q", got)
	}
}

// A writer that writes no checkpoints stops carrying a tail past maxTail
// (256 entries): commit objects stay small, and a cold open after a late
// checkpoint still finds every commit.
func TestCheckpoint_TailIsBounded(t *testing.T) {
	st := deep(t, 270, -1)
	ctx := context.Background()
	obj, err := st.Get(ctx, "vol/commits/00000000000000000270", fence.Range{})
	if err != nil {
		t.Fatal(err)
	}
	if len(obj) > 4096 {
		t.Fatalf("commit 270 of a writer without checkpoints is %d bytes: its tail was not bounded", len(obj))
	}
	w, _ := graft.Open(ctx, t.TempDir(), "vol", st)
	if _, err := w.Checkpoint(ctx, true); err != nil {
		t.Fatal(err)
	}
	for i := uint64(271); i <= 290; i++ {
		w.Commit(ctx, []graft.Page{{No: i, Data: fmt.Appendf(nil, "page %d", i)}}, nil)
	}
	cold, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil || cold.Head() != 290 {
		t.Fatalf("cold open: head %d, %v", cold.Head(), err)
	}
	if got := read(t, cold, 290, 150); got != "page 150" {
		t.Fatalf("page 150 = %q", got)
	}
}

// A missing root of the checkpoint the newest commit builds on is named by
// verify, not only fallen back from by readers.
func TestVerify_MissingNewestCheckpointRootIsNamed(t *testing.T) {
	ctx := context.Background()
	st := deep(t, 40, 16) // checkpoints at 16 and 32; commits 33-40 build on 32
	keys, err := st.List(ctx, "vol/checkpoints/", "", 1)
	if err != nil || len(keys) != 1 {
		t.Fatalf("newest checkpoint: %v %v", keys, err)
	}
	if err := st.Delete(ctx, keys[0]); err != nil {
		t.Fatal(err)
	}
	v, err := graft.Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.VerifyRemote(ctx)
	if !errors.Is(err, graft.ErrCorrupt) || !strings.Contains(err.Error(), keys[0]) || !errors.Is(err, graft.ErrBadIndex) {
		t.Fatalf("verify without the newest checkpoint root: %v; want it named", err)
	}
	if _, err := v.RebuildIndex(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := v.VerifyRemote(ctx); err != nil {
		t.Fatalf("verify after reindex: %v", err)
	}
}
