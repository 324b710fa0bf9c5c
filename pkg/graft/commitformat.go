package graft

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"slices"
	"strconv"
	"time"

	"github.com/silt-dev/silt/pkg/fence"
)

// Commit format versions: 1 for a commit of new pages, 2 for a compaction
// commit (Replaces set) or a prune commit (PruneBelow set), which an older
// build must refuse rather than read pages twice or read pages pruned; 3
// for a packed commit of new pages (its segment and its record in one
// object, below). commitVersion is the newest this build reads.
const (
	plainVersion      = 1
	compactionVersion = 2
	packedVersion     = 3
	commitVersion     = packedVersion
)

// A packed commit is one object at commits/<LSN>, created once with
// If-None-Match: *, so a commit costs one create-only PUT of its bytes:
//
//	preamble  {"version":3}\n   (a reader of formats 1-2 reads its first line and refuses a newer format)
//	segment   the segment file, at Segment.Offset
//	record    the commit: one JSON line, then "sha256 <hex>" of it (a format 1 object's layout)
//	footer    "packed <16 hex digits: the record's length>\n"
//
// Segment.Size and Segment.SHA256 cover the object's first bytes, the
// preamble and the segment (one SHA-256 pass that the PUT's payload hash
// then continues over the record and footer); the commit's hash, which the
// next commit chains to, is the record's, as a format 1 object's is its own.
// The record is read with one suffix GET (fence.Suffix).
const (
	packedPreamble = "{\"version\":3}\n"
	packedFooter   = len("packed 0000000000000000\n")
)

// appendPacked appends the record and footer of c, whose segment (with the
// preamble) is obj, and returns the object and the SHA-256 (hex) of it all;
// sum has hashed obj and goes on over the rest.
func appendPacked(obj []byte, c *Commit, sum hash.Hash) ([]byte, string, error) {
	rec, err := c.Encode()
	if err != nil {
		return nil, "", err
	}
	n := len(obj)
	obj = append(obj, rec...)
	obj = fmt.Appendf(obj, "packed %016x\n", len(rec))
	sum.Write(obj[n:])
	return obj, hex.EncodeToString(sum.Sum(nil)), nil
}

// packedRecord finds the record in the last bytes of a packed commit
// object: it returns the record, or, when tail holds only part of it, how
// many last bytes to read instead; ok is false when tail does not end like
// a packed commit (a format 1 or 2 object).
func packedRecord(name string, tail []byte) (rec []byte, need int64, ok bool, err error) {
	if len(tail) < packedFooter || !bytes.HasPrefix(tail[len(tail)-packedFooter:], []byte("packed ")) {
		return nil, 0, false, nil
	}
	f := tail[len(tail)-packedFooter:]
	n, perr := strconv.ParseUint(string(f[len("packed "):packedFooter-1]), 16, 63)
	if perr != nil || f[packedFooter-1] != '\n' {
		return nil, 0, true, fmt.Errorf("commit %s: %w: bad packed footer %q", name, ErrCorrupt, f)
	}
	if need := int64(n) + int64(packedFooter); need > int64(len(tail)) {
		return nil, need, true, nil
	}
	return tail[len(tail)-packedFooter-int(n) : len(tail)-packedFooter], 0, true, nil
}

// Commit is the record that makes one segment's pages visible at an LSN. It
// is written last, once, create-only, at commits/<20-digit LSN> (packed: the
// object's end, after its segment). Prev is the SHA-256 of the previous
// commit's record (a format 1 or 2 object whole), so the commits form a
// hash chain.
type Commit struct {
	Version int               `json:"version"`
	Volume  string            `json:"volume"`
	LSN     uint64            `json:"lsn"`
	Prev    string            `json:"prev"`
	Segment SegmentRef        `json:"segment"`
	Ranges  []PageRange       `json:"ranges"` // pages written: sorted, disjoint, inclusive
	Pages   uint64            `json:"pages"`
	Meta    map[string]string `json:"meta,omitempty"`
	Writer  string            `json:"writer"`
	Time    time.Time         `json:"time"`
	// Base is the LSN of the newest checkpoint the writer knew (0: none);
	// Tail holds the entries of the commits after it, up to this one.
	Base uint64  `json:"base,omitempty"`
	Tail []Entry `json:"tail,omitempty"`
	// Replaces, on a compaction commit, spans the pages of the adjacent
	// entries whose segments its own segment merges; EntryMeta is the
	// metadata of its entry (the last merged entry's), while Meta carries
	// the volume's latest metadata forward unchanged.
	Replaces  *PageRange        `json:"replaces,omitempty"`
	EntryMeta map[string]string `json:"entry_meta,omitempty"`
	// PruneBelow, on a prune commit (format 2, no segment), drops every
	// entry whose pages are all below it: where the volume's history now
	// starts. Its segments go with gc's grace.
	PruneBelow uint64 `json:"prune_below,omitempty"`

	hash string // SHA-256 of the encoded object, set by Encode and DecodeCommit
	raw  []byte // the encoded record, kept for the head commit only
}

// SegmentRef names a commit's segment and how to check it. Size and
// SHA256 cover the object's bytes up to the segment's end; Offset, in a
// packed commit (its own key), is where the segment starts in them.
type SegmentRef struct {
	Key    string `json:"key"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Offset int64  `json:"offset,omitempty"`
}

// span is the Range of the object that holds the segment: all of it, or
// a packed commit's first Size bytes.
func (r SegmentRef) span() fence.Range {
	if r.Offset > 0 {
		return fence.Range{Len: r.Size}
	}
	return fence.Range{}
}

// PageRange is an inclusive range of page numbers.
type PageRange struct {
	Lo, Hi uint64
}

// MarshalJSON writes [lo, hi].
func (r PageRange) MarshalJSON() ([]byte, error) { return json.Marshal([2]uint64{r.Lo, r.Hi}) }

// UnmarshalJSON reads [lo, hi].
func (r *PageRange) UnmarshalJSON(b []byte) error {
	var a [2]uint64
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	r.Lo, r.Hi = a[0], a[1]
	return nil
}

// Contains reports whether page no is in r.
func (r PageRange) Contains(no uint64) bool { return r.Lo <= no && no <= r.Hi }

// Hash returns the SHA-256 (hex) of the commit's encoded object.
func (c *Commit) Hash() string { return c.hash }

// Contains reports whether the commit wrote page no.
func (c *Commit) Contains(no uint64) bool {
	_, found := slices.BinarySearchFunc(c.Ranges, no, func(r PageRange, no uint64) int {
		switch {
		case r.Hi < no:
			return -1
		case r.Lo > no:
			return 1
		}
		return 0
	})
	return found
}

// Validate checks a commit's structure.
func (c *Commit) Validate() error {
	switch {
	case c.Version > commitVersion:
		return fmt.Errorf("%w: commit version %d, this build reads up to %d", ErrNewerFormat, c.Version, commitVersion)
	case c.Version < 1:
		return fmt.Errorf("%w: commit version %d", ErrCorrupt, c.Version)
	case c.LSN == 0:
		return fmt.Errorf("%w: LSN 0", ErrCorrupt)
	case (c.LSN == 1) != (c.Prev == ""):
		return fmt.Errorf("%w: LSN %d with prev %q", ErrCorrupt, c.LSN, c.Prev)
	case c.PruneBelow > 0 && (c.Version != compactionVersion || c.Segment.Key != "" || len(c.Ranges) > 0 || c.Replaces != nil):
		return fmt.Errorf("%w: prune commit with a segment, pages or a compaction", ErrCorrupt)
	case c.PruneBelow == 0 && (c.Segment.Key == "" || c.Segment.SHA256 == ""):
		return fmt.Errorf("%w: no segment", ErrCorrupt)
	case (c.Version == compactionVersion) != (c.Replaces != nil || c.PruneBelow > 0):
		return fmt.Errorf("%w: commit version %d with replaces %v", ErrCorrupt, c.Version, c.Replaces)
	case (c.Version == packedVersion) != (c.Segment.Offset > 0):
		return fmt.Errorf("%w: commit version %d with its segment at offset %d", ErrCorrupt, c.Version, c.Segment.Offset)
	case c.Segment.Offset > 0 && (c.Segment.Key != c.Volume+"/commits/"+lsnName(c.LSN) || c.Segment.Offset+headerSize+trailerSize > c.Segment.Size):
		return fmt.Errorf("%w: packed commit %d with segment %s at %d of %d bytes", ErrCorrupt, c.LSN, c.Segment.Key, c.Segment.Offset, c.Segment.Size)
	case c.Replaces != nil && (c.Replaces.Hi < c.Replaces.Lo || len(c.Ranges) == 0 || c.Ranges[0].Lo < c.Replaces.Lo || c.Ranges[len(c.Ranges)-1].Hi > c.Replaces.Hi):
		return fmt.Errorf("%w: compaction commit writes pages outside the span it replaces %v", ErrCorrupt, *c.Replaces)
	case c.Base > 0 || len(c.Tail) > 0:
		if _, err := checkTail(c); err != nil {
			return err
		}
	}
	var n uint64
	for i, r := range c.Ranges {
		if r.Hi < r.Lo || i > 0 && r.Lo <= c.Ranges[i-1].Hi {
			return fmt.Errorf("%w: page ranges not sorted and disjoint at %v", ErrCorrupt, r)
		}
		n += r.Hi - r.Lo + 1
	}
	if n != c.Pages {
		return fmt.Errorf("%w: ranges hold %d pages, commit says %d", ErrCorrupt, n, c.Pages)
	}
	return nil
}

// Encode returns the commit object: one JSON line, then "sha256 <hex>" of it.
func (c *Commit) Encode() ([]byte, error) {
	body, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	obj := fmt.Appendf(body, "\nsha256 %s\n", hex.EncodeToString(sum[:]))
	whole := sha256.Sum256(obj)
	c.hash, c.raw = hex.EncodeToString(whole[:]), obj
	return obj, nil
}

// DecodeCommit parses and checks a commit object; name is the file or object
// it came from, for errors.
func DecodeCommit(name string, obj []byte) (*Commit, error) {
	body, trailer, ok := bytes.Cut(obj, []byte("\n"))
	if !ok {
		return nil, fmt.Errorf("commit %s: %w: no checksum line", name, ErrCorrupt)
	}
	var peek struct{ Version int }
	if err := json.Unmarshal(body, &peek); err == nil && peek.Version > commitVersion {
		return nil, fmt.Errorf("commit %s: %w: version %d, this build reads up to %d", name, ErrNewerFormat, peek.Version, commitVersion)
	}
	sum := sha256.Sum256(body)
	if string(trailer) != "sha256 "+hex.EncodeToString(sum[:])+"\n" {
		return nil, fmt.Errorf("commit %s: %w: checksum mismatch", name, ErrCorrupt)
	}
	c := new(Commit)
	if err := json.Unmarshal(body, c); err != nil {
		return nil, fmt.Errorf("commit %s: %w: %v", name, ErrCorrupt, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("commit %s: %w", name, err)
	}
	whole := sha256.Sum256(obj)
	c.hash, c.raw = hex.EncodeToString(whole[:]), obj
	return c, nil
}

// rangesOf compresses sorted page numbers into inclusive ranges.
func rangesOf(pages []Page) []PageRange {
	var out []PageRange
	for _, p := range pages {
		out = addRange(out, p.No)
	}
	return out
}

// addRange adds page no, above every page in ranges, to them.
func addRange(ranges []PageRange, no uint64) []PageRange {
	if n := len(ranges); n > 0 && ranges[n-1].Hi+1 == no {
		ranges[n-1].Hi = no
		return ranges
	}
	return append(ranges, PageRange{no, no})
}
