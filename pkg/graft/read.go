package graft

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"os"
	"slices"
	"sort"
	"sync"

	"github.com/silt-dev/silt/pkg/fence"
)

// Read returns page no as of the latest commit.
func (v *Volume) Read(ctx context.Context, no uint64) ([]byte, error) {
	return v.ReadAt(ctx, v.Head(), no)
}

// ReadAt returns page no as of commit lsn (a snapshot): the data written by
// the newest commit at or below lsn that wrote the page.
func (v *Volume) ReadAt(ctx context.Context, lsn, no uint64) ([]byte, error) {
	c, err := v.find(ctx, lsn, no)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, fmt.Errorf("volume %s: page %d at LSN %d: %w", v.name, no, lsn, ErrPageNotFound)
	}
	seg, err := v.segment(ctx, c)
	if err != nil {
		return nil, err
	}
	data, err := seg.Lookup(no)
	if err != nil {
		return nil, err
	}
	if data == nil {
		return nil, fmt.Errorf("segment %s: %w: commit %d says it holds page %d, it does not", c.Segment.Key, ErrCorrupt, c.LSN, no)
	}
	return data, nil
}

// state is a consistent view of a volume's entries: the base checkpoint
// and the commits after it.
type state struct {
	base *checkpoint
	tail []*Commit
}

func (v *Volume) state() state {
	v.mu.Lock()
	defer v.mu.Unlock()
	return state{v.base, slices.Clone(v.tail)}
}

// commitAt returns the commit at lsn if it is the base commit or after it.
func (v *Volume) commitAt(lsn uint64) *Commit {
	b := v.baseLSN()
	switch {
	case lsn == b && v.base != nil:
		return v.base.commit
	case lsn > b && lsn <= v.headLSN():
		return v.tail[lsn-b-1]
	}
	return nil
}

// find returns the newest commit at or below lsn that wrote page no: in
// the commits after the base, then in the base's leaves (by binary search
// on their page spans when the volume is monotonic, else newest first).
func (v *Volume) find(ctx context.Context, lsn, no uint64) (*Commit, error) {
	st := v.state()
	for i := len(st.tail) - 1; i >= 0; i-- {
		if c := st.tail[i]; c.LSN <= lsn && c.Contains(no) {
			return c, nil
		}
	}
	if st.base == nil {
		return nil, nil
	}
	var found *Commit
	var skip func(nodeRef) bool
	if st.base.Monotonic { // pages in order: the one leaf whose span holds no
		skip = func(r nodeRef) bool { return r.Hi < no }
	}
	for ref, err := range v.leafRefs(ctx, st.base, skip) {
		if err != nil {
			return nil, err
		}
		if ref.Lo > no && st.base.Monotonic {
			break
		}
		entries, err := v.leaf(ctx, ref)
		if err != nil {
			return nil, err
		}
		for _, e := range entries { // in LSN order unless compacted (then pages are written once)
			if e.LSN <= lsn {
				if c := e.commit(v.name); c.Contains(no) {
					found = c
				}
			}
		}
		if st.base.Monotonic && found != nil {
			break
		}
	}
	return found, nil
}

// Entries yields the volume's live entries in order (page order for a
// monotonic volume), as slim commits, starting at the first one for which
// before is false; before must be false from some entry on (nil: from the
// first). It finds that entry by binary search over the checkpoint's leaf
// summaries, then within one leaf: a read of a window fetches one leaf.
func (v *Volume) Entries(ctx context.Context, before func(meta map[string]string) bool) iter.Seq2[*Commit, error] {
	if before == nil {
		before = func(map[string]string) bool { return false }
	}
	return func(yield func(*Commit, error) bool) {
		st := v.state()
		if st.base != nil {
			first := true
			for ref, err := range v.leafRefs(ctx, st.base, func(r nodeRef) bool { return before(r.Last) }) {
				if err != nil {
					yield(nil, err)
					return
				}
				entries, err := v.leaf(ctx, ref)
				if err != nil {
					yield(nil, err)
					return
				}
				j := 0
				if first {
					j, first = sort.Search(len(entries), func(j int) bool { return !before(entries[j].Meta) }), false
				}
				for _, e := range entries[j:] {
					if !yield(e.commit(v.name), nil) {
						return
					}
				}
			}
		}
		for _, c := range st.tail {
			// A compaction not yet in a checkpoint: the entries it replaces
			// are still in the leaves (and their segments kept by gc).
			if c.Replaces != nil || c.PruneBelow > 0 || before(c.Meta) {
				continue
			}
			if !yield(c, nil) {
				return
			}
		}
	}
}

// Stats summarises the live state.
type Stats struct {
	Entries int64 // live segments
	Bytes   int64 // their sizes
	Base    uint64
}

// Stats returns the live state's size without fetching any leaf.
func (v *Volume) Stats() Stats {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.stats()
}

// stats is Stats with v.mu held.
func (v *Volume) stats() Stats {
	st := state{v.base, v.tail}
	var s Stats
	if st.base != nil {
		s.Entries, s.Bytes, s.Base = int64(st.base.Entries), st.base.Bytes, st.base.LSN
	}
	for _, c := range st.tail {
		if c.Replaces == nil && c.PruneBelow == 0 { // approximate until the next checkpoint applies them
			s.Entries, s.Bytes = s.Entries+1, s.Bytes+c.Segment.Size
		}
	}
	return s
}

// Segment returns commit c's decoded segment, for callers that read many of
// its pages (such as the archive's range reads).
func (v *Volume) Segment(ctx context.Context, c *Commit) (*Segment, error) { return v.segment(ctx, c) }

// Walked is one live entry and its segment.
type Walked struct {
	Entry   *Commit
	Segment *Segment
}

// Walk is Entries with each entry's segment (Segment's rules: whole when
// small, by range when large), fetched ahead of the caller once it walks
// on: nothing ahead while it reads its first entry (a window that ends
// there costs nothing more), then 2, 4 and at most walkAhead segments in
// flight, and at most walkAheadBytes of small ones. A reader walking a
// year from a fresh machine then waits on a GET only when it outruns them.
// The segments are for use within the walk.
func (v *Volume) Walk(ctx context.Context, before func(meta map[string]string) bool) iter.Seq2[Walked, error] {
	size := func(c *Commit) int64 { // a large segment is its index until read
		if c.Segment.Size > v.CacheWholeBelow {
			return 0
		}
		return c.Segment.Size
	}
	return fetchAhead(ctx, v.Entries(ctx, before), ahead{n: walkAhead, bytes: walkAheadBytes, ramp: true}, size,
		func(ctx context.Context, c *Commit) (Walked, error) {
			seg, err := v.segment(ctx, c)
			return Walked{Entry: c, Segment: seg}, err
		})
}

// How far Walk fetches ahead at most.
const (
	walkAhead      = 8
	walkAheadBytes = 32 << 20
)

// segment returns c's segment: from the memory cache, the local file, or the
// remote (fetched whole and cached locally when small enough). Every byte is
// checked against the commit's SHA-256 before use.
func (v *Volume) segment(ctx context.Context, c *Commit) (*Segment, error) {
	return v.segmentOf(ctx, c, false)
}

// segmentOf is segment; whole, for compaction, fetches a large remote
// segment in one GET instead of page by page, and caches nothing (the
// segment is about to be replaced).
func (v *Volume) segmentOf(ctx context.Context, c *Commit, whole bool) (*Segment, error) {
	v.cacheMu.Lock()
	seg := v.cache[c.Segment.Key]
	v.cacheMu.Unlock()
	if seg != nil && (!whole || seg.fetch == nil) {
		return seg, nil
	}
	path := v.localSegment(c.Segment.Key)
	b, err := os.ReadFile(path)
	name := path
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if c.Segment.Size > v.CacheWholeBelow && !whole {
			return v.remoteSegment(ctx, c)
		}
		if b, err = v.store.Get(ctx, c.Segment.Key, c.Segment.span()); err != nil {
			return nil, fmt.Errorf("volume %s: fetch segment: %w", v.name, err)
		}
		name = c.Segment.Key
	case err != nil:
		return nil, fmt.Errorf("volume %s: %w", v.name, err)
	}
	if seg, err = checkSegment(name, b, c); err != nil {
		return nil, err
	}
	if whole { // compaction: the segment is about to be replaced, cache nothing
		return seg, nil
	}
	if name != path {
		if err := v.writeFile(path, b); err != nil {
			return nil, err
		}
	}
	v.cacheMu.Lock()
	if len(v.cache) > 64 { // a small bound: segments are re-read from disk cheaply
		clear(v.cache)
	}
	v.cache[c.Segment.Key] = seg
	v.cacheMu.Unlock()
	return seg, nil
}

// checkSegment verifies b against the commit's size and hash, then decodes it.
func checkSegment(name string, b []byte, c *Commit) (*Segment, error) {
	sum := sha256.Sum256(b)
	if int64(len(b)) != c.Segment.Size || hex.EncodeToString(sum[:]) != c.Segment.SHA256 {
		return nil, fmt.Errorf("segment %s: %w: size or SHA-256 differs from commit %d", name, ErrCorrupt, c.LSN)
	}
	seg, err := DecodeSegment(name, b[c.Segment.Offset:])
	if err != nil {
		return nil, err
	}
	if seg.Header.LSN != c.LSN {
		return nil, fmt.Errorf("segment %s: %w: written for LSN %d, committed as %d", name, ErrCorrupt, seg.Header.LSN, c.LSN)
	}
	return seg, nil
}

// remoteSegment returns a Segment of a large remote segment: its index
// (remoteIndex: read by range once, then kept), and pages fetched by range
// on demand.
func (v *Volume) remoteSegment(ctx context.Context, c *Commit) (*Segment, error) {
	key := c.Segment.Key
	index, err := v.remoteIndex(ctx, c)
	if err != nil {
		return nil, err
	}
	off := c.Segment.Size - trailerSize - int64(len(index))*indexItemSize // where the records end
	ra := &readAhead{v: v, key: key, base: c.Segment.Offset, end: off}
	return &Segment{Header: SegmentHeader{Version: segVersion, LSN: c.LSN, Pages: uint32(len(index))}, index: index,
		fetch: func(e indexEntry) ([]byte, error) {
			rec, err := ra.record(ctx, e)
			if err != nil {
				return nil, err
			}
			data, err := checkPage(rec, e)
			if err != nil {
				return nil, fmt.Errorf("segment %s: %w", key, err)
			}
			return bytes.Clone(data), nil
		}}, nil
}

// remoteIndexMax bounds the indexes of large remote segments a volume
// keeps (24 bytes an entry: 24 MB), so a worker recovering payload after
// payload from one merged segment reads its index once, not each time.
const remoteIndexMax = 1 << 20

// remoteIndex returns the index of c's large remote segment, read with
// range GETs (trailer, then index) the first time.
func (v *Volume) remoteIndex(ctx context.Context, c *Commit) ([]indexEntry, error) {
	key := c.Segment.Key
	v.cacheMu.Lock()
	index, ok := v.indexes[key]
	v.cacheMu.Unlock()
	if ok {
		return index, nil
	}
	tail, err := v.store.Get(ctx, key, fence.Range{Off: c.Segment.Size - trailerSize, Len: trailerSize})
	if err != nil {
		return nil, fmt.Errorf("volume %s: segment trailer: %w", v.name, err)
	}
	if len(tail) != trailerSize || string(tail[20:]) != trailerMagic {
		return nil, fmt.Errorf("segment %s: %w: bad trailer", key, ErrCorrupt)
	}
	off, n := binary.BigEndian.Uint64(tail), binary.BigEndian.Uint64(tail[8:]) // from the segment's start
	base := c.Segment.Offset
	if base+int64(off+n) != c.Segment.Size-trailerSize || n%indexItemSize != 0 {
		return nil, fmt.Errorf("segment %s: %w: index at %d+%d", key, ErrCorrupt, off, n)
	}
	ib, err := v.store.Get(ctx, key, fence.Range{Off: base + int64(off), Len: int64(n)})
	if err != nil {
		return nil, fmt.Errorf("volume %s: segment index: %w", v.name, err)
	}
	if index, err = decodeIndex(ib, off); err != nil {
		return nil, fmt.Errorf("segment %s: %w: %v", key, ErrCorrupt, err)
	}
	v.cacheMu.Lock()
	if v.indexLen+len(index) > remoteIndexMax {
		clear(v.indexes)
		v.indexLen = 0
	}
	if len(index) <= remoteIndexMax {
		v.indexes[key], v.indexLen = index, v.indexLen+len(index)
	}
	v.cacheMu.Unlock()
	return index, nil
}

// A large remote segment's pages are fetched by range on demand. One page
// alone (a window read) costs its record's bytes; pages read in order (a
// reader walking the history) are fetched ahead in ranges that double from
// 64 KiB up to 4 MiB, so a walk through a 64 MiB merged segment of 1 KiB
// pages is a few dozen GETs, not 65,000.
const (
	readAheadMin = 64 << 10
	readAheadMax = 4 << 20
)

// readAhead holds the last range fetched from one remote segment.
type readAhead struct {
	v    *Volume
	key  string
	base int64 // where the segment starts in the object (a packed commit's)
	end  int64 // where the page records end in the object (the index's offset)

	mu    sync.Mutex
	buf   []byte // the bytes at [at, at+len(buf))
	at    int64
	next  int64 // the end of the last record read: a read from there is sequential
	ahead int64 // the current read-ahead size (0: none yet)
}

// record returns the bytes of e's page record.
func (r *readAhead) record(ctx context.Context, e indexEntry) ([]byte, error) {
	lo, hi := r.base+int64(e.Off), r.base+int64(e.Off)+pageHeadSize+int64(e.Len)
	r.mu.Lock()
	defer r.mu.Unlock()
	if lo < r.at || hi > r.at+int64(len(r.buf)) {
		n := hi - lo
		if lo == r.next {
			r.ahead = min(max(2*r.ahead, readAheadMin), readAheadMax)
			n = max(n, min(r.ahead, r.end-lo))
		} else {
			r.ahead = 0
		}
		b, err := r.v.store.Get(ctx, r.key, fence.Range{Off: lo, Len: n})
		if err != nil {
			return nil, fmt.Errorf("volume %s: page %d: %w", r.v.name, e.No, err)
		}
		r.buf, r.at = b, lo
	}
	r.next = hi
	if hi > r.at+int64(len(r.buf)) { // a short read: checkPage names it
		return r.buf[lo-r.at:], nil
	}
	return r.buf[lo-r.at : hi-r.at], nil
}
