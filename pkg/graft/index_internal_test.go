package graft

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/silt-dev/silt/pkg/fence"
)

// With nodes of 4 entries and branches of 3 leaves, 150 commits make a
// deep index (13 branches); appends, compactions across leaf and branch
// edges, cold opens, verify and gc all keep every page readable once.
func TestIndex_DeepTreeWithCompaction(t *testing.T) {
	defer func(l, b int) { leafSize, branchSize = l, b }(leafSize, branchSize)
	leafSize, branchSize = 4, 3
	ctx := context.Background()
	st, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	v, err := OpenWith(ctx, t.TempDir(), "vol", st, Options{CheckpointEvery: 5})
	if err != nil {
		t.Fatal(err)
	}
	const n = 150
	for i := 1; i <= n; i++ {
		if _, err := v.Commit(ctx, []Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, map[string]string{"n": fmt.Sprintf("%04d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(label string, v *Volume) {
		t.Helper()
		next := uint64(1)
		for c, err := range v.Entries(ctx, nil) {
			if err != nil {
				t.Fatalf("%s: %v", label, err)
			}
			seg, err := v.Segment(ctx, c)
			if err != nil {
				t.Fatalf("%s: %v", label, err)
			}
			for _, no := range seg.Pages() {
				if no != next {
					t.Fatalf("%s: page %d where %d was expected", label, no, next)
				}
				next++
			}
		}
		if next != n+1 {
			t.Fatalf("%s: %d pages, want %d", label, next-1, n)
		}
		for _, no := range []uint64{1, 37, 64, 100, n} {
			b, err := v.Read(ctx, no)
			if err != nil || string(b) != fmt.Sprint("page ", no) {
				t.Fatalf("%s: page %d = %q, %v", label, no, b, err)
			}
		}
		// The search by metadata lands on the right entry.
		for c, err := range v.Entries(ctx, func(m map[string]string) bool { return m["n"] < "0077" }) {
			if err != nil || !c.Contains(77) {
				t.Fatalf("%s: search for 77 found pages %v, %v", label, c.Ranges, err)
			}
			break
		}
	}
	cold := func() *Volume {
		c, err := Open(ctx, t.TempDir(), "vol", st)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	check("writer", v)
	c := cold()
	if len(c.base.Branches) < 10 {
		t.Fatalf("%d branches: the tree is not deep", len(c.base.Branches))
	}
	check("cold", c)
	for _, min := range []int{7, 7, 30} { // runs crossing leaf and branch edges, then merged ones again
		if _, err := v.Compact(ctx, CompactOptions{MinEntries: min, MaxBytes: 1 << 30}); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprint("after compaction to runs of ", min), v)
		check("cold after compaction", cold())
	}
	if rep, err := v.VerifyRemote(ctx); err != nil || rep.Entries >= 20 {
		t.Fatalf("verify: %+v %v", rep, err)
	}
	if _, err := v.GC(ctx, 0, true); err != nil {
		t.Fatal(err)
	}
	check("cold after gc", cold())
	if _, err := v.VerifyRemote(ctx); err != nil {
		t.Fatal(err)
	}
}

// The negative control: a checkpoint that skips a commit. A cold reader
// trusts the newest checkpoint (so page 7 goes missing for it), and verify
// must catch the checkpoint.
func TestIndex_CheckpointSkippingACommitIsCaught(t *testing.T) {
	ctx := context.Background()
	st, _ := fence.OpenLocal(t.TempDir())
	v, err := OpenWith(ctx, t.TempDir(), "vol", st, Options{CheckpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 20; i++ {
		v.Commit(ctx, []Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, nil)
	}
	v.mu.Lock()
	v.tail = append(v.tail[:6:6], v.tail[7:]...) // commit 7 left out
	_, err = v.checkpoint(ctx)
	v.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(ctx, 7); err == nil {
		t.Fatal("the bad checkpoint was not used: the control controls nothing")
	}
	if _, err := c.VerifyRemote(ctx); err == nil || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "checkpoints/") {
		t.Fatalf("verify of a checkpoint that skips commit 7 = %v, want it named as corrupt", err)
	}
}

// Prune drops the entries below a page through the deep tree (whole
// branches by their refs, the boundary leaf opened): cold readers find the
// rest and not the pruned, verify passes before and after gc removes the
// pruned segments, and commits go on.
func TestIndex_PruneMovesTheStart(t *testing.T) {
	defer func(l, b int) { leafSize, branchSize = l, b }(leafSize, branchSize)
	leafSize, branchSize = 4, 3
	ctx := context.Background()
	st, _ := fence.OpenLocal(t.TempDir())
	v, err := OpenWith(ctx, t.TempDir(), "vol", st, Options{CheckpointEvery: 5})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 100; i++ {
		v.Commit(ctx, []Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, map[string]string{"n": fmt.Sprint(i)})
	}
	if _, err := v.Compact(ctx, CompactOptions{MinEntries: 6, MaxBytes: 1 << 20}); err != nil { // entries of several pages too
		t.Fatal(err)
	}
	n, err := v.Prune(ctx, 61)
	if err != nil || n == 0 {
		t.Fatalf("prune: %d %v", n, err)
	}
	if again, err := v.Prune(ctx, 61); err != nil || again != 0 {
		t.Fatalf("second prune at the same page: %d %v, want 0", again, err)
	}
	check := func(label string, r *Volume) {
		t.Helper()
		first := uint64(0)
		for c, err := range r.Entries(ctx, nil) {
			if err != nil {
				t.Fatal(err)
			}
			first = c.Ranges[0].Lo
			break
		}
		if first == 0 || first > 61 {
			t.Fatalf("%s: history starts at page %d, want at most 61", label, first)
		}
		for no := first; no <= 100; no++ {
			if b, err := r.Read(ctx, no); err != nil || string(b) != fmt.Sprint("page ", no) {
				t.Fatalf("%s: page %d = %q, %v", label, no, b, err)
			}
		}
		if first > 1 {
			if _, err := r.Read(ctx, first-1); !errors.Is(err, ErrPageNotFound) {
				t.Fatalf("%s: pruned page %d: %v, want ErrPageNotFound", label, first-1, err)
			}
		}
		if r.Latest().Meta["n"] != "100" {
			t.Fatalf("%s: latest meta %v: the prune did not carry it forward", label, r.Latest().Meta)
		}
	}
	cold, err := Open(ctx, t.TempDir(), "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	check("cold", cold)
	if _, err := cold.VerifyRemote(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := v.GC(ctx, 0, true); err != nil {
		t.Fatal(err)
	}
	if rep, err := cold.VerifyRemote(ctx); err != nil || rep.Collected == 0 {
		t.Fatalf("verify after gc: %+v %v", rep, err)
	}
	check("cold after gc", func() *Volume { c, _ := Open(ctx, t.TempDir(), "vol", st); return c }())
	if _, err := v.Commit(ctx, []Page{{No: 101, Data: []byte("page 101")}}, map[string]string{"n": "100"}); err != nil {
		t.Fatal(err)
	}
}
