package graft

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"
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
