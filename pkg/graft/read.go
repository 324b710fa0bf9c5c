package graft

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/silt-dev/silt/pkg/fence"
)

// Read returns page no as of the latest commit.
func (v *Volume) Read(ctx context.Context, no uint64) ([]byte, error) {
	return v.ReadAt(ctx, v.Head(), no)
}

// ReadAt returns page no as of commit lsn (a snapshot): the data written by
// the newest commit at or below lsn that wrote the page.
func (v *Volume) ReadAt(ctx context.Context, lsn, no uint64) ([]byte, error) {
	c := v.find(lsn, no)
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

// find returns the newest commit at or below lsn that wrote page no.
func (v *Volume) find(lsn, no uint64) *Commit {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := min(lsn, uint64(len(v.commits))); i >= 1; i-- {
		if c := v.commits[i-1]; c.Contains(no) {
			return c
		}
	}
	return nil
}

// Segment returns commit c's decoded segment, for callers that read many of
// its pages (such as the archive's range reads).
func (v *Volume) Segment(ctx context.Context, c *Commit) (*Segment, error) { return v.segment(ctx, c) }

// segment returns c's segment: from the memory cache, the local file, or the
// remote (fetched whole and cached locally when small enough). Every byte is
// checked against the commit's SHA-256 before use.
func (v *Volume) segment(ctx context.Context, c *Commit) (*Segment, error) {
	v.mu.Lock()
	seg := v.cache[c.Segment.Key]
	v.mu.Unlock()
	if seg != nil {
		return seg, nil
	}
	path := v.localSegment(c.Segment.Key)
	b, err := os.ReadFile(path)
	name := path
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if c.Segment.Size > v.CacheWholeBelow {
			return v.remoteSegment(ctx, c)
		}
		if b, err = v.store.Get(ctx, c.Segment.Key, fence.Range{}); err != nil {
			return nil, fmt.Errorf("volume %s: fetch segment: %w", v.name, err)
		}
		name = c.Segment.Key
	case err != nil:
		return nil, fmt.Errorf("volume %s: %w", v.name, err)
	}
	if seg, err = checkSegment(name, b, c); err != nil {
		return nil, err
	}
	if name != path {
		if err := v.writeFile(path, b); err != nil {
			return nil, err
		}
	}
	v.mu.Lock()
	if len(v.cache) > 64 { // a small bound: segments are re-read from disk cheaply
		clear(v.cache)
	}
	v.cache[c.Segment.Key] = seg
	v.mu.Unlock()
	return seg, nil
}

// checkSegment verifies b against the commit's size and hash, then decodes it.
func checkSegment(name string, b []byte, c *Commit) (*Segment, error) {
	sum := sha256.Sum256(b)
	if int64(len(b)) != c.Segment.Size || hex.EncodeToString(sum[:]) != c.Segment.SHA256 {
		return nil, fmt.Errorf("segment %s: %w: size or SHA-256 differs from commit %d", name, ErrCorrupt, c.LSN)
	}
	seg, err := DecodeSegment(name, b)
	if err != nil {
		return nil, err
	}
	if seg.Header.LSN != c.LSN {
		return nil, fmt.Errorf("segment %s: %w: written for LSN %d, committed as %d", name, ErrCorrupt, seg.Header.LSN, c.LSN)
	}
	return seg, nil
}

// remoteSegment reads a large remote segment's index with range GETs
// (trailer, then index) and returns a Segment whose pages are fetched by
// range on demand.
func (v *Volume) remoteSegment(ctx context.Context, c *Commit) (*Segment, error) {
	key := c.Segment.Key
	tail, err := v.store.Get(ctx, key, fence.Range{Off: c.Segment.Size - trailerSize, Len: trailerSize})
	if err != nil {
		return nil, fmt.Errorf("volume %s: segment trailer: %w", v.name, err)
	}
	if len(tail) != trailerSize || string(tail[20:]) != trailerMagic {
		return nil, fmt.Errorf("segment %s: %w: bad trailer", key, ErrCorrupt)
	}
	off, n := binary.BigEndian.Uint64(tail), binary.BigEndian.Uint64(tail[8:])
	if off+n != uint64(c.Segment.Size-trailerSize) {
		return nil, fmt.Errorf("segment %s: %w: index at %d+%d", key, ErrCorrupt, off, n)
	}
	ib, err := v.store.Get(ctx, key, fence.Range{Off: int64(off), Len: int64(n)})
	if err != nil {
		return nil, fmt.Errorf("volume %s: segment index: %w", v.name, err)
	}
	index, err := decodeIndex(ib, off)
	if err != nil {
		return nil, fmt.Errorf("segment %s: %w: %v", key, ErrCorrupt, err)
	}
	return &Segment{Header: SegmentHeader{Version: segVersion, LSN: c.LSN, Pages: uint32(len(index))}, index: index,
		fetch: func(e indexEntry) ([]byte, error) {
			rec, err := v.store.Get(ctx, key, fence.Range{Off: int64(e.Off), Len: pageHeadSize + int64(e.Len)})
			if err != nil {
				return nil, fmt.Errorf("volume %s: page %d: %w", v.name, e.No, err)
			}
			data, err := checkPage(rec, e)
			if err != nil {
				return nil, fmt.Errorf("segment %s: %w", key, err)
			}
			return data, nil
		}}, nil
}
