package graft

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"

	"github.com/silt-dev/silt/pkg/fence"
)

// verified is one commit as fetched ahead: the commit (or why its object
// does not decode) and its segment when small (seg), missing (segErr wraps
// fence.ErrNotFound) or left for a ranged read (segErr is errRanged).
type verified struct {
	key    string
	c      *Commit
	bad    error
	seg    []byte
	segErr error
}

// fetchVerified GETs one commit object and, when it is small, its segment.
func (v *Volume) fetchVerified(ctx context.Context, key string) (verified, error) {
	f := verified{key: key}
	if f.c, f.bad = v.readCommit(ctx, key); f.bad != nil {
		if errors.Is(f.bad, ErrCorrupt) || errors.Is(f.bad, ErrNewerFormat) {
			return f, nil // named in chain order, at its place
		}
		return f, f.bad
	}
	f.seg, f.segErr = v.fetchSegment(ctx, f.c)
	return f, nil
}

// fetchSegment GETs c's segment when it is at most verifyWholeMax; a larger
// one is errRanged (read by ranges, in order), a prune commit's none.
func (v *Volume) fetchSegment(ctx context.Context, c *Commit) ([]byte, error) {
	switch seg := c.Segment; {
	case seg.Key == "":
		return nil, nil
	case seg.Size > verifyWholeMax:
		return nil, errRanged
	default:
		return v.store.Get(ctx, seg.Key, seg.span())
	}
}

// checkRanges verifies c's remote segment as checkAgainst verifies a whole
// one (size and SHA-256, header, trailer checksum, index, every page's
// checksum, pages against the commit's ranges), reading it in order by
// ranges of verifyRange bytes: it holds one range and the index. With a
// sink, every range is written to it as it is read (pull).
func (v *Volume) checkRanges(ctx context.Context, c *Commit, sink io.Writer) error {
	r := rangedSegment{v: v, c: c, key: c.Segment.Key, size: c.Segment.Size, base: c.Segment.Offset}
	size, base := r.size, r.base
	tail, index, err := r.readIndex(ctx)
	if err != nil {
		return err
	}
	records := newRecordChecker(r.key, base, index)
	sum, tcrc := sha256.New(), uint32(0)
	crcEnd := size - trailerSize + 16 // the trailer's checksum covers the bytes before it
	for at := int64(0); at < size; {
		n := min(max(verifyRange, base+headerSize), size-at)
		if at+n == size && base == 0 {
			n++ // one byte more than the commit names: the object must not have it (a packed one goes on with its record)
		}
		b, err := v.store.Get(ctx, r.key, fence.Range{Off: at, Len: n})
		if err != nil {
			return err
		}
		if at+int64(len(b)) != min(at+n, size) {
			return r.fail("%d bytes at %d: the object's size differs from commit %d's %d", len(b), at, c.LSN, size)
		}
		if at == 0 {
			h, err := decodeHeader(b[base : base+headerSize])
			if err != nil {
				return fmt.Errorf("segment %s: %w", r.key, err)
			}
			if h.LSN != c.LSN || int(h.Pages) != len(index) {
				return r.fail("header says LSN %d and %d pages; commit %d, index of %d", h.LSN, h.Pages, c.LSN, len(index))
			}
		}
		sum.Write(b)
		if sink != nil {
			if _, err := sink.Write(b); err != nil {
				return fmt.Errorf("volume %s: %w", v.name, err)
			}
		}
		if at < crcEnd { // over the segment's bytes: from base
			tcrc = crc32.Update(tcrc, castagnoli, b[max(base-at, 0):min(int64(len(b)), crcEnd-at)])
		}
		if err := records.check(at, b); err != nil {
			return err
		}
		at += int64(len(b))
	}
	if hex.EncodeToString(sum.Sum(nil)) != c.Segment.SHA256 {
		return r.fail("SHA-256 differs from commit %d", c.LSN)
	}
	if tcrc != binary.BigEndian.Uint32(tail[16:]) {
		return r.fail("trailer checksum mismatch")
	}
	return nil
}

// rangedSegment is a remote segment read by ranges: [base, size) of the
// object key, which commit c names.
type rangedSegment struct {
	v          *Volume
	c          *Commit
	key        string
	size, base int64
}

func (r *rangedSegment) fail(format string, args ...any) error {
	return fmt.Errorf("segment %s: %w: %s", r.key, ErrCorrupt, fmt.Sprintf(format, args...))
}

// get reads n bytes at off, exactly.
func (r *rangedSegment) get(ctx context.Context, off, n int64) ([]byte, error) {
	b, err := r.v.store.Get(ctx, r.key, fence.Range{Off: off, Len: n})
	if err == nil && int64(len(b)) != n {
		err = r.fail("%d bytes at %d, want %d: the object's size differs from commit %d's %d", len(b), off, n, r.c.LSN, r.size)
	}
	return b, err
}

// readIndex reads the segment's trailer and index (two ranged GETs) and
// checks the index against the commit's page ranges.
func (r *rangedSegment) readIndex(ctx context.Context) (trailer []byte, index []indexEntry, err error) {
	size, base := r.size, r.base
	if size < base+headerSize+trailerSize {
		return nil, nil, r.fail("commit %d says %d bytes, shorter than header and trailer", r.c.LSN, size)
	}
	tail, err := r.get(ctx, size-trailerSize, trailerSize)
	if err != nil {
		return nil, nil, err
	}
	if string(tail[20:]) != trailerMagic {
		return nil, nil, r.fail("bad trailer magic")
	}
	indexOff, indexLen := int64(binary.BigEndian.Uint64(tail)), int64(binary.BigEndian.Uint64(tail[8:])) // from the segment's start
	if indexOff < headerSize || base+indexOff+indexLen != size-trailerSize || indexLen%indexItemSize != 0 {
		return nil, nil, r.fail("index at %d+%d does not fit a segment of %d bytes", indexOff, indexLen, size-base)
	}
	ib, err := r.get(ctx, base+indexOff, indexLen)
	if err != nil {
		return nil, nil, err
	}
	if index, err = decodeIndex(ib, uint64(indexOff)); err != nil {
		return nil, nil, r.fail("%v", err)
	}
	if err := matchRanges(r.key, index, r.c); err != nil {
		return nil, nil, err
	}
	return tail, index, nil
}

// recordChecker checks a segment's records as its bytes arrive in ranges,
// in file order (both writers lay them out by page number: the index's
// order). A record inside a range is checked there; one that straddles
// ranges is carried: the bytes from its start (carryAt) on.
type recordChecker struct {
	key     string
	base    int64 // the segment's offset in its object
	byOff   []indexEntry
	next    int // the first record not checked yet
	carry   []byte
	carryAt int64
}

func newRecordChecker(key string, base int64, index []indexEntry) *recordChecker {
	byOff, inOrder := index, func(a, b indexEntry) int { return cmp.Compare(a.Off, b.Off) }
	if !slices.IsSortedFunc(byOff, inOrder) { // a copy only then: an index is 24 bytes a page in memory
		byOff = slices.SortedFunc(slices.Values(index), inOrder)
	}
	return &recordChecker{key: key, base: base, byOff: byOff}
}

// check takes the next range, b, which holds the object's bytes from lo on.
func (rc *recordChecker) check(lo int64, b []byte) error {
	base, at := rc.base, lo+int64(len(b))
	for ; rc.next < len(rc.byOff); rc.next++ {
		e := rc.byOff[rc.next]
		rlo, rhi := base+int64(e.Off), base+int64(e.Off)+pageHeadSize+int64(e.Len)
		if rhi > at {
			break
		}
		rec := b[max(rlo-lo, 0) : rhi-lo]
		if rlo < lo { // begun in a range before: carried
			rec = append(slices.Clip(rc.carry[rlo-rc.carryAt:]), rec...)
		}
		if _, err := checkPage(rec, e); err != nil {
			return fmt.Errorf("segment %s: %w", rc.key, err)
		}
	}
	switch {
	case rc.next == len(rc.byOff) || base+int64(rc.byOff[rc.next].Off) >= at:
		rc.carry = rc.carry[:0]
	case base+int64(rc.byOff[rc.next].Off) >= lo:
		rc.carryAt = base + int64(rc.byOff[rc.next].Off)
		rc.carry = append(rc.carry[:0], b[rc.carryAt-lo:]...)
	default: // a record longer than a range: its start is carried already
		from := base + int64(rc.byOff[rc.next].Off)
		rc.carry = append(rc.carry[:copy(rc.carry, rc.carry[from-rc.carryAt:])], b...)
		rc.carryAt = from
	}
	return nil
}
