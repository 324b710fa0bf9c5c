package graft

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/fence"
)

// pageRecords returns each page's record (head and data) as a segment holds it.
func pageRecords(t *testing.T, lsn uint64, pages []Page) [][]byte {
	t.Helper()
	b, err := EncodeSegment(lsn, pages)
	if err != nil {
		t.Fatal(err)
	}
	seg, err := DecodeSegment("records", b)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, e := range seg.index {
		out = append(out, seg.data[e.Off:e.Off+pageHeadSize+uint64(e.Len)])
	}
	return out
}

// openWrapped opens a volume on a new local store, seen through wrap.
func openWrapped(t *testing.T, wrap func(*fence.Local) fence.Store) (*Volume, *fence.Local) {
	t.Helper()
	local, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	v, err := Open(context.Background(), t.TempDir(), "vol", wrap(local))
	if err != nil {
		t.Fatal(err)
	}
	return v, local
}

// commitFilled commits pages 1 to n, one a commit, page i holding size
// bytes of byte(i).
func commitFilled(t *testing.T, v *Volume, n, size int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		if _, err := v.Commit(context.Background(), []Page{{No: uint64(i), Data: bytes.Repeat([]byte{byte(i)}, size)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func spillFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "index-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// The streaming writer lays out the very bytes EncodeSegment does, with the
// same size and SHA-256, for no page, one, and 20,000 (an index of 400 kB,
// read back from its spill file in many pieces) of every size from 0 bytes.
func TestSegmentWriter_SameBytesAsEncodeSegment(t *testing.T) {
	many := make([]Page, 20000)
	no := uint64(1000)
	for i := range many {
		no += uint64(1 + i%3) // runs of pages and gaps between them
		many[i] = Page{No: no, Data: bytes.Repeat([]byte{byte(i)}, i%97)}
	}
	for _, tc := range []struct {
		name  string
		pages []Page
	}{
		{"no page", nil},
		{"one page", []Page{{No: 7, Data: []byte("seven")}}},
		{"20000 pages", many},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := EncodeSegment(42, tc.pages)
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			w := newSegmentWriter(&got, spillFile(t), 42, uint32(len(tc.pages)))
			for i, rec := range pageRecords(t, 42, tc.pages) {
				if err := w.add(tc.pages[i].No, rec); err != nil {
					t.Fatal(err)
				}
			}
			size, sum, err := w.finish()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("streamed segment differs from EncodeSegment's (%d bytes against %d)", got.Len(), len(want))
			}
			wantSum := sha256.Sum256(want)
			if size != int64(len(want)) || sum != hex.EncodeToString(wantSum[:]) {
				t.Fatalf("finish = %d bytes, %s; want %d, %x", size, sum, len(want), wantSum)
			}
			if _, err := DecodeSegment("streamed", got.Bytes()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// What the writer refuses: pages out of order or twice, more or fewer pages
// than its header promised, a record shorter than a page head; the error
// sticks, and finish reports it.
func TestSegmentWriter_Refuses(t *testing.T) {
	pages := []Page{{No: 1, Data: []byte("a")}, {No: 2, Data: []byte("b")}, {No: 3, Data: []byte("c")}}
	recs := pageRecords(t, 5, pages)
	for _, tc := range []struct {
		name    string
		promise uint32
		add     func(w *segmentWriter) error
		want    string
	}{
		{"out of order", 3, func(w *segmentWriter) error {
			w.add(2, recs[1])
			return w.add(1, recs[0])
		}, "page 1 after page 2"},
		{"twice", 3, func(w *segmentWriter) error {
			w.add(1, recs[0])
			return w.add(1, recs[0])
		}, "page 1 after page 1"},
		{"more than promised", 1, func(w *segmentWriter) error {
			w.add(1, recs[0])
			return w.add(2, recs[1])
		}, "one more than the 1 of its header"},
		{"fewer than promised", 3, func(w *segmentWriter) error { return w.add(1, recs[0]) }, "1 pages written, its header says 3"},
		{"short record", 1, func(w *segmentWriter) error { return w.add(1, recs[0][:pageHeadSize-1]) }, "record of page 1 is 15 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newSegmentWriter(new(bytes.Buffer), spillFile(t), 5, tc.promise)
			addErr := tc.add(w)
			_, _, err := w.finish()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("finish = %v (add: %v), want an error saying %q", err, addErr, tc.want)
			}
		})
	}
}

// gets counts whole-object GETs of segments as they complete, and fails the
// one of failKey.
type gets struct {
	fence.Store
	done    atomic.Int64
	failKey string
}

func (g *gets) Get(ctx context.Context, key string, r fence.Range) ([]byte, error) {
	if key == g.failKey {
		return nil, errors.New("connection reset")
	}
	b, err := g.Store.Get(ctx, key, r)
	if strings.Contains(key, "/segments/") || strings.Contains(key, "/commits/") && !r.IsSuffix() { // a packed commit's segment

		g.done.Add(1)
	}
	return b, err
}

// A merge's sources come in run order, fetched ahead of the one being
// copied but never more than fetchAheadBytes of them (here three segments
// of 700 kB), whatever the run's length; a failed fetch ends them with its
// error after the segments before it; a consumer that stops early leaves no
// fetch behind.
func TestMerge_SourcesFetchAheadWithinTheirBudget(t *testing.T) {
	ctx := context.Background()
	st := &gets{}
	w, _ := openWrapped(t, func(l *fence.Local) fence.Store { st.Store = l; return st })
	const n, size = 24, 700 << 10
	commitFilled(t, w, n, size)
	cold, err := Open(ctx, t.TempDir(), "vol", st) // no local segment: each source is a GET
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cold.checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	run, err := cold.smallRun(ctx, CompactOptions{Target: 1 << 30, MinEntries: n}, 0)
	if err != nil || len(run) != n {
		t.Fatalf("run of %d entries, %v; want %d", len(run), err, n)
	}
	bound := int64(fetchAheadBytes/size + 1)
	st.done.Store(0)
	var most int64
	i := 0
	for seg, err := range cold.sources(ctx, run) {
		if err != nil {
			t.Fatal(err)
		}
		if seg.Header.LSN != run[i].LSN {
			t.Fatalf("source %d is the segment of LSN %d, want %d", i, seg.Header.LSN, run[i].LSN)
		}
		time.Sleep(10 * time.Millisecond) // copying: the fetches run ahead meanwhile
		most = max(most, st.done.Load()-int64(i))
		i++
	}
	if i != n || most > bound || most < 2 {
		t.Fatalf("%d sources; at most %d fetched and not yet copied, want 2 to %d", i, most, bound)
	}

	st.failKey = run[5].Segment.Key
	i = 0
	var last error
	for _, err := range cold.sources(ctx, run) {
		if last = err; err != nil {
			break
		}
		i++
	}
	if i != 5 || last == nil || !strings.Contains(last.Error(), "connection reset") {
		t.Fatalf("a failed fetch of source 5: %d sources, then %v", i, last)
	}
	st.failKey = ""
	for range cold.sources(ctx, run) {
		break // the iterator waits for its fetches before it returns
	}
}

// A merge that fails, on a corrupt source or a failed upload, commits
// nothing, leaves nothing in the tmp directory and no object under the
// merged segment's key; the next compaction, once the cause is gone,
// merges every page once.
func TestMerge_FailuresLeaveNothingBehind(t *testing.T) {
	ctx := context.Background()
	st := &failingSegments{}
	v, local := openWrapped(t, func(l *fence.Local) fence.Store { st.Store = l; return st })
	v.Unpacked = true // sources and merges are segment objects, counted below
	const n = 40
	commitFilled(t, v, n, 3000)
	opt := CompactOptions{MinEntries: 8}
	nothingLeft := func(when string) {
		t.Helper()
		if files, _ := os.ReadDir(filepath.Join(v.dir, "tmp")); len(files) > 0 {
			t.Fatalf("%s: %d files left in tmp (%s ...)", when, len(files), files[0].Name())
		}
		if s := v.Stats(); s.Entries != n {
			t.Fatalf("%s: %d entries, want the %d unmerged", when, s.Entries, n)
		}
		keys, err := local.List(ctx, "vol/segments/", "", 0)
		if err != nil || len(keys) != n {
			t.Fatalf("%s: %d segment objects (%v), want %d", when, len(keys), err, n)
		}
	}

	// A source whose local copy rotted: its SHA-256 no longer matches.
	var fifth string
	for c, err := range v.Entries(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		if c.LSN == 5 {
			fifth = v.localSegment(c.Segment.Key)
		}
	}
	good, err := os.ReadFile(fifth)
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(good)
	bad[len(bad)/2] ^= 0xff
	os.WriteFile(fifth, bad, 0o644)
	if _, err := v.Compact(ctx, opt); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("compact over a corrupt source = %v, want ErrCorrupt", err)
	}
	nothingLeft("after a corrupt source")
	os.WriteFile(fifth, good, 0o644)

	// The merged segment's upload fails.
	st.fail = true
	if _, err := v.Compact(ctx, opt); err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("compact with a failing upload = %v, want the upload's error", err)
	}
	nothingLeft("after a failed upload")
	st.fail = false

	res, err := v.Compact(ctx, opt)
	if err != nil || res.Merged != n {
		t.Fatalf("compact = %+v, %v; want all %d entries merged", res, err, n)
	}
	cold, err := Open(ctx, t.TempDir(), "vol", local)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		got, err := cold.Read(ctx, uint64(i))
		if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{byte(i)}, 3000)) {
			t.Fatalf("page %d after the merge: %d bytes, %v", i, len(got), err)
		}
	}
	if _, err := cold.VerifyRemote(ctx); err != nil {
		t.Fatal(err)
	}
}
