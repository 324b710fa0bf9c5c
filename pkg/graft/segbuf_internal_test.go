package graft

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/silt-dev/silt/pkg/fence"
)

// failingSegments fails segment uploads while fail is set.
type failingSegments struct {
	fence.Store
	fail bool
}

func (f *failingSegments) Create(ctx context.Context, key string, body []byte) error {
	if f.fail && (strings.Contains(key, "/segments/") || strings.Contains(key, "/commits/")) {
		return errors.New("connection reset")
	}
	return f.Store.Create(ctx, key, body)
}

// A commit lays its segment into the buffer of the commit before it: a
// large segment, a small one, a large one again all read back intact; a
// failed commit keeps no buffer (its upload may still be reading it).
func TestCommit_ReusesTheSegmentBuffer(t *testing.T) {
	ctx := context.Background()
	st := &failingSegments{}
	v, local := openWrapped(t, func(l *fence.Local) fence.Store { st.Store = l; return st })
	pages := func(first, n, size int) []Page {
		out := make([]Page, n)
		for i := range out {
			out[i] = Page{No: uint64(first + i), Data: bytes.Repeat([]byte{byte(first + i)}, size)}
		}
		return out
	}
	commits := [][]Page{pages(1, 64, 4096), pages(100, 3, 10), pages(200, 64, 4096)}
	var prev []byte
	for i, p := range commits {
		if _, err := v.Commit(ctx, p, nil); err != nil {
			t.Fatal(err)
		}
		if i == 1 && &v.segBuf[:1][0] != &prev[:1][0] {
			t.Fatal("the second commit did not reuse the first one's buffer")
		}
		prev = v.segBuf
	}
	st.fail = true
	if _, err := v.Commit(ctx, pages(300, 2, 10), nil); err == nil {
		t.Fatal("commit with a failing segment upload succeeded")
	}
	if v.segBuf != nil {
		t.Fatal("a failed commit kept its segment buffer")
	}
	st.fail = false
	if _, err := v.Commit(ctx, pages(300, 2, 10), nil); err != nil {
		t.Fatal(err)
	}
	commits = append(commits, pages(300, 2, 10))
	fresh, err := Open(ctx, t.TempDir(), "vol", local) // reads the remote copies
	if err != nil {
		t.Fatal(err)
	}
	for _, vol := range []*Volume{v, fresh} {
		i := 0
		for c, err := range vol.Entries(ctx, nil) {
			if err != nil {
				t.Fatal(err)
			}
			seg, err := vol.Segment(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			for j, no := range seg.Pages() {
				want := commits[i][j]
				got, err := seg.Lookup(no)
				if err != nil || no != want.No || !bytes.Equal(got, want.Data) {
					t.Fatalf("commit %d page %d: %d %q %v, want %d", i, j, no, got, err, want.No)
				}
			}
			i++
		}
		if i != len(commits) {
			t.Fatalf("%d commits read back, want %d", i, len(commits))
		}
	}
}

// Laying a segment into a buffer large enough allocates nothing, however
// many pages it holds (a page head built apart would cost one allocation
// a page), and decodes to the same pages.
func TestAppendSegment_AllocatesNothingIntoItsBuffer(t *testing.T) {
	pages := make([]Page, 2000)
	for i := range pages {
		pages[i] = Page{No: uint64(10 + i), Data: bytes.Repeat([]byte{byte(i)}, 1+i%90)}
	}
	buf := make([]byte, 0, segmentSize(pages))
	if n := testing.AllocsPerRun(20, func() {
		seg, err := appendSegment(buf, 7, pages)
		if err != nil || len(seg) != segmentSize(pages) {
			t.Fatalf("%d bytes, %v", len(seg), err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations laying %d pages into a buffer of their size", n, len(pages))
	}
	seg, err := appendSegment(buf, 7, pages)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSegment("seg", seg)
	if err != nil {
		t.Fatal(err)
	}
	if got.Header.LSN != 7 || got.Header.Pages != uint32(len(pages)) {
		t.Fatalf("header %+v", got.Header)
	}
	for _, p := range []Page{pages[0], pages[999], pages[len(pages)-1]} {
		data, err := got.Lookup(p.No)
		if err != nil || !bytes.Equal(data, p.Data) {
			t.Fatalf("page %d: %d bytes, %v", p.No, len(data), err)
		}
	}
}

// A segment's hash, taken part by part beside its layout, is the hash of
// its bytes after the head, at every size around hashBeside and laidChunk,
// whether it is laid into a buffer with room for it or into a new one;
// the parts handed on are the segment, in order, each but the last at
// least laidChunk long.
func TestSegment_HashedBesideItsLayout(t *testing.T) {
	head := []byte("head of the object\n")
	for _, n := range []int{0, 1, 200, 255, 256, 1023, 1024, 1025, 4000} {
		pages := make([]Page, n)
		for i := range pages {
			pages[i] = Page{No: uint64(i), Data: bytes.Repeat([]byte{byte(i), byte(i >> 8)}, 512+i%7)}
		}
		want, err := EncodeSegment(9, pages)
		if err != nil {
			t.Fatal(err)
		}
		for _, room := range []int{0, len(want)} {
			sum := sha256.New()
			seg, err := appendSegmentHashed(make([]byte, 0, room), 9, pages, sum, head)
			whole := sha256.Sum256(append(slices.Clone(head), want...))
			if err != nil || !bytes.Equal(seg, want) || !bytes.Equal(sum.Sum(nil), whole[:]) {
				t.Fatalf("%d pages (%d bytes), room %d: segment equal %v, hash equal %v, %v",
					n, len(want), room, bytes.Equal(seg, want), bytes.Equal(sum.Sum(nil), whole[:]), err)
			}
		}
		var parts [][]byte
		seg, err := appendSegmentTelling(nil, 9, pages, func(p []byte) { parts = append(parts, p) })
		if err != nil || !bytes.Equal(bytes.Join(parts, nil), seg) {
			t.Fatalf("%d pages: the parts handed on are not the segment (%d parts)", n, len(parts))
		}
		for i, p := range parts[:len(parts)-1] {
			if len(p) < laidChunk {
				t.Fatalf("%d pages: part %d of %d holds %d bytes", n, i, len(parts), len(p))
			}
		}
	}
	// Pages out of order: an error, and the hash's goroutine is done.
	pages := make([]Page, 3000)
	for i := range pages {
		pages[i] = Page{No: uint64(len(pages) - i), Data: make([]byte, 1024)}
	}
	if _, err := appendSegmentHashed(nil, 1, pages, sha256.New(), nil); err == nil {
		t.Fatal("pages out of order were laid out")
	}
}
