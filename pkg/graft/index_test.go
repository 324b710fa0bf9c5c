package graft_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/graft"
)

// indexed is a volume with KeepMeta, so it keeps a commit index, and n commits.
type indexed struct {
	dir   string
	store fence.Store
	want  []*graft.Commit // as the writing handle holds them
}

func newIndexed(t *testing.T, n int) *indexed {
	t.Helper()
	ix := &indexed{dir: t.TempDir(), store: newStore(t)}
	v := ix.open(t, ix.store)
	for i := range n {
		page := graft.Page{No: archiveBase + uint64(i), Data: []byte(fmt.Sprint("rec ", i))}
		if _, err := v.Commit(context.Background(), []graft.Page{page}, map[string]string{"w": fmt.Sprint(i), "other": "dropped when slim"}); err != nil {
			t.Fatal(err)
		}
	}
	ix.want = v.Commits(1)
	return ix
}

func (ix *indexed) open(t *testing.T, st fence.Store) *graft.Volume {
	t.Helper()
	v, err := graft.Open(context.Background(), ix.dir, "vol", st, "w")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (ix *indexed) path(name string) string { return filepath.Join(ix.dir, "vol", name) }

func (ix *indexed) commitFile(lsn int) string {
	return ix.path(filepath.Join("commits", fmt.Sprintf("%020d", lsn)))
}

// check opens the volume and requires the commits the writer held.
func (ix *indexed) check(t *testing.T) *counting {
	t.Helper()
	st := &counting{Store: ix.store}
	got := ix.open(t, st).Commits(1)
	if len(got) != len(ix.want) {
		t.Fatalf("reopened with %d commits, want %d", len(got), len(ix.want))
	}
	for i := range got {
		if !reflect.DeepEqual(got[i], ix.want[i]) {
			t.Fatalf("commit %d reopened as\n%+v\nwant\n%+v", i+1, got[i], ix.want[i])
		}
	}
	return st
}

// The index, not the commit files, is what a reopen reads: with every commit
// file but the latest gone, the volume still opens whole, without a LIST.
func TestCommitIndex_ReopenReadsTheIndex(t *testing.T) {
	ix := newIndexed(t, 20)
	ix.check(t)
	for lsn := 1; lsn < 20; lsn++ {
		if err := os.Remove(ix.commitFile(lsn)); err != nil {
			t.Fatal(err)
		}
	}
	st := ix.check(t)
	if st.lists.Load() != 0 || st.gets.Load() != 2 {
		t.Fatalf("open made %d LISTs and %d GETs, want 0 and 2 (head check, probe)", st.lists.Load(), st.gets.Load())
	}
}

// A damaged, stale or foreign index costs a slower open, never a wrong one,
// and the next open finds it rebuilt byte for byte.
func TestCommitIndex_DamageFallsBackToTheFiles(t *testing.T) {
	other := newIndexed(t, 20) // another history of a volume of the same name
	foreign, err := os.ReadFile(other.path("commit-index"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, ix *indexed, good []byte) []byte
	}{
		{"flipped byte", func(t *testing.T, ix *indexed, good []byte) []byte {
			b := append([]byte(nil), good...)
			b[len(b)/2] ^= 0x10
			return b
		}},
		{"torn tail", func(t *testing.T, ix *indexed, good []byte) []byte { return good[:len(good)-7] }},
		{"bad magic", func(t *testing.T, ix *indexed, good []byte) []byte { return append([]byte("SILTIDX\x09"), good[8:]...) }},
		{"empty", func(t *testing.T, ix *indexed, good []byte) []byte { return nil }},
		{"foreign", func(t *testing.T, ix *indexed, good []byte) []byte { return foreign }},
		{"behind", func(t *testing.T, ix *indexed, good []byte) []byte { return good[:len(good)/3] }},
		{"duplicated records", func(t *testing.T, ix *indexed, good []byte) []byte {
			return append(append([]byte(nil), good...), good[8:]...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndexed(t, 20)
			good, err := os.ReadFile(ix.path("commit-index"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(ix.path("commit-index"), tc.damage(t, ix, good), 0o644); err != nil {
				t.Fatal(err)
			}
			ix.check(t)
			if again, _ := os.ReadFile(ix.path("commit-index")); string(again) != string(good) {
				t.Fatalf("index after the open: %d bytes, not the %d of the undamaged one", len(again), len(good))
			}
			ix.check(t)
		})
	}
}

// Local commit files lost at the end: the index runs ahead of them, the open
// falls back to the files and adopts the rest from the remote.
func TestCommitIndex_AheadOfTheFiles(t *testing.T) {
	ix := newIndexed(t, 20)
	for _, lsn := range []int{19, 20} {
		if err := os.Remove(ix.commitFile(lsn)); err != nil {
			t.Fatal(err)
		}
	}
	ix.check(t)
	if _, err := os.Stat(ix.commitFile(20)); err != nil {
		t.Fatalf("commit 20 not adopted back from the remote: %v", err)
	}
}
