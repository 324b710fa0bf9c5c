package graft

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/silt-dev/silt/internal/testing/benchratio"
)

// BenchmarkSegmentWrite_Ratio compares encoding a segment and writing it
// durably (tmp, fsync, rename, fsync dir) with a raw sequential write and
// fsync of the same number of bytes.
//
//	go test -run '^$' -bench SegmentWrite_Ratio -benchtime 15x ./pkg/graft
func BenchmarkSegmentWrite_Ratio(b *testing.B) {
	dir := b.TempDir()
	os.MkdirAll(filepath.Join(dir, "tmp"), 0o755)
	pages := make([]Page, 4096)
	for i := range pages {
		pages[i] = Page{No: 1<<63 + uint64(i), Data: bytes.Repeat([]byte{byte(i)}, 1024)}
	}
	seg, _ := EncodeSegment(1, pages)
	v := &Volume{dir: dir}
	size := len(seg)
	silt := func(tb testing.TB) int {
		s, err := EncodeSegment(1, pages)
		if err != nil {
			tb.Fatal(err)
		}
		if err := v.writeFile(filepath.Join(dir, "seg"), s); err != nil {
			tb.Fatal(err)
		}
		return size
	}
	raw := func(tb testing.TB) int {
		f, err := os.Create(filepath.Join(dir, "raw"))
		if err != nil {
			tb.Fatal(err)
		}
		f.Write(seg)
		f.Sync()
		f.Close()
		return size
	}
	benchratio.Compare(b, silt, raw)
}
