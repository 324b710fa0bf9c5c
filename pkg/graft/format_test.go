package graft_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/graft"
)

func samplePages() []graft.Page {
	return []graft.Page{{No: 1, Data: []byte("one")}, {No: 2, Data: nil}, {No: 1 << 63, Data: bytes.Repeat([]byte("x"), 1000)}}
}

func TestSegment_RoundTrip(t *testing.T) {
	b, err := graft.EncodeSegment(7, samplePages())
	if err != nil {
		t.Fatal(err)
	}
	seg, err := graft.DecodeSegment("seg-7", b)
	if err != nil {
		t.Fatal(err)
	}
	if seg.Header.LSN != 7 || seg.Header.Pages != 3 {
		t.Fatalf("header %+v", seg.Header)
	}
	for _, p := range samplePages() {
		got, ok := seg.Get(p.No)
		if !ok || !bytes.Equal(got, p.Data) {
			t.Fatalf("page %d = %q, %v", p.No, got, ok)
		}
	}
	if _, ok := seg.Get(3); ok {
		t.Fatal("page 3 found")
	}
}

func TestSegment_EveryFlippedByteIsDetected(t *testing.T) {
	b, _ := graft.EncodeSegment(7, samplePages())
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x40
		_, err := graft.DecodeSegment("segments/x", c)
		if err == nil {
			t.Fatalf("flipping byte %d went unnoticed", i)
		}
		if !strings.Contains(err.Error(), "segments/x") {
			t.Fatalf("error %v does not name the segment", err)
		}
	}
	if _, err := graft.DecodeSegment("s", b[:len(b)-1]); !errors.Is(err, graft.ErrCorrupt) {
		t.Fatalf("truncated: %v", err)
	}
}

func TestSegment_NewerVersionRefused(t *testing.T) {
	b, _ := graft.EncodeSegment(7, samplePages())
	b[9] = 9 // version 9
	if _, err := graft.DecodeSegment("s", b); !errors.Is(err, graft.ErrNewerFormat) {
		t.Fatalf("version 9: %v, want ErrNewerFormat", err)
	}
}

func sampleCommit() *graft.Commit {
	return &graft.Commit{Version: 1, Volume: "v", LSN: 2, Prev: "abc", Segment: graft.SegmentRef{Key: "v/segments/x", Size: 10, SHA256: "00"},
		Ranges: []graft.PageRange{{Lo: 1, Hi: 3}, {Lo: 10, Hi: 10}}, Pages: 4, Meta: map[string]string{"w": "1-2"}, Writer: "me",
		Time: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
}

func TestCommit_RoundTrip(t *testing.T) {
	c := sampleCommit()
	b, err := c.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := graft.DecodeCommit("commits/2", b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Hash() != c.Hash() || got.Meta["w"] != "1-2" || !got.Contains(2) || got.Contains(4) || !got.Contains(10) {
		t.Fatalf("decoded %+v", got)
	}
	c2 := bytes.Replace(b, []byte(`"lsn":2`), []byte(`"lsn":3`), 1)
	if _, err := graft.DecodeCommit("commits/2", c2); !errors.Is(err, graft.ErrCorrupt) || !strings.Contains(err.Error(), "commits/2") {
		t.Fatalf("edited commit: %v", err)
	}
}

func TestCommit_NewerVersionRefused(t *testing.T) {
	c := sampleCommit()
	c.Version = 4
	b, _ := c.Encode()
	if _, err := graft.DecodeCommit("commits/2", b); !errors.Is(err, graft.ErrNewerFormat) {
		t.Fatalf("version 4: %v", err)
	}
	// Version 3 is a packed commit: a segment elsewhere than in its own object is corrupt.
	c.Version = 3
	b, _ = c.Encode()
	if _, err := graft.DecodeCommit("commits/2", b); !errors.Is(err, graft.ErrCorrupt) {
		t.Fatalf("version 3 with its segment apart: %v", err)
	}
	// Version 2 is a compaction commit: without the span it replaces it is corrupt.
	c.Version = 2
	b, _ = c.Encode()
	if _, err := graft.DecodeCommit("commits/2", b); !errors.Is(err, graft.ErrCorrupt) {
		t.Fatalf("version 2 without replaces: %v", err)
	}
}

func TestCommit_Validate(t *testing.T) {
	for _, mut := range []func(*graft.Commit){
		func(c *graft.Commit) { c.Pages = 5 },
		func(c *graft.Commit) { c.Ranges = []graft.PageRange{{Lo: 3, Hi: 1}} },
		func(c *graft.Commit) { c.Ranges = []graft.PageRange{{Lo: 1, Hi: 3}, {Lo: 3, Hi: 3}} },
		func(c *graft.Commit) { c.LSN = 1 },
		func(c *graft.Commit) { c.Segment.Key = "" },
	} {
		c := sampleCommit()
		mut(c)
		if err := c.Validate(); !errors.Is(err, graft.ErrCorrupt) {
			t.Errorf("Validate(%+v) = %v", c, err)
		}
	}
}

func FuzzDecodeSegment(f *testing.F) {
	b, _ := graft.EncodeSegment(7, []graft.Page{{No: 1, Data: []byte("one")}, {No: 5, Data: []byte("five")}})
	f.Add(b)
	f.Add([]byte("SILTSEG\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		seg, err := graft.DecodeSegment("fuzz", b)
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz") {
				t.Fatalf("error %v does not name the input", err)
			}
			return
		}
		for _, no := range seg.Pages() {
			if _, ok := seg.Get(no); !ok {
				t.Fatalf("listed page %d missing", no)
			}
		}
	})
}

func FuzzDecodeCommit(f *testing.F) {
	b, _ := sampleCommit().Encode()
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := graft.DecodeCommit("fuzz", b)
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz") {
				t.Fatalf("error %v does not name the input", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted an invalid commit: %v", err)
		}
	})
}
