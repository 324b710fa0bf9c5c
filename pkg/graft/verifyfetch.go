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
	"iter"
	"path/filepath"
	"slices"
	"sync"

	"github.com/silt-dev/silt/internal/durable"
	"github.com/silt-dev/silt/pkg/fence"
)

// Walks of the whole chain read ahead: verify, pull and the chain's read
// (an open with no usable checkpoint, reindex). A chain of a million
// commits is a million GETs, two million with segments: days one at a
// time against an object store 20-50 ms away. They keep verifyAhead
// commits in flight (verify and pull: each commit object, then its segment
// when that is at most verifyWholeMax), use them in chain order, and read
// larger segments by ranges of verifyRange bytes: memory stays within
// (verifyAhead + 1) × 4 MiB and the index of the segment being read,
// whatever the segments' size.
var (
	verifyAhead    = 8
	verifyWholeMax = int64(4 << 20)
	verifyRange    = int64(4 << 20)
)

// errRanged marks a segment left for a ranged read, in order.
var errRanged = errors.New("segment left for a ranged read")

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

// ahead bounds a fetchAhead: at most n fetches in flight and, counting
// each item's size, bytes (0: no bound; one item larger than it still
// goes); with ramp, the depth starts at one and doubles with each result
// the caller takes, so a caller that stops early fetched little for
// nothing.
type ahead struct {
	n     int
	bytes int64
	ramp  bool
}

// fetchAhead yields fetch's results for the items of in, in order,
// fetching ahead of the caller within lim (size weighs an item; nil: 0).
// The first error, of in or of a fetch, is yielded in its place and ends it.
func fetchAhead[K, T any](ctx context.Context, in iter.Seq2[K, error], lim ahead, size func(K) int64, fetch func(context.Context, K) (T, error)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		next, stop := iter.Pull2(in)
		defer stop()
		ctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }()
		type pending struct {
			v    T
			size int64
			err  error
			done chan struct{}
		}
		var queue []*pending
		var bytes int64
		depth, more := lim.n, true
		if lim.ramp {
			depth = 1
		}
		for {
			for more && (len(queue) == 0 || len(queue) < depth && (lim.bytes == 0 || bytes < lim.bytes)) {
				k, err, ok := next()
				if !ok {
					more = false
					break
				}
				p := &pending{err: err, done: make(chan struct{})}
				queue = append(queue, p)
				if err != nil {
					close(p.done)
					more = false
					break
				}
				if size != nil {
					p.size = size(k)
				}
				bytes += p.size
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer close(p.done)
					p.v, p.err = fetch(ctx, k)
				}()
			}
			if len(queue) == 0 {
				return
			}
			p := queue[0]
			queue[0] = nil // or the backing array keeps a taken result (a whole segment) alive
			queue = queue[1:]
			<-p.done
			bytes -= p.size
			if !yield(p.v, p.err) || p.err != nil {
				return
			}
			if lim.ramp {
				depth = min(2*depth, lim.n)
			}
		}
	}
}

// chainKeys yields the first n commit keys from LSN from on: the chain as
// a first pass counted it (commits made since are not in it).
func (v *Volume) chainKeys(ctx context.Context, from uint64, n int) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		after := ""
		if from > 1 {
			after = v.commitKey(from - 1)
		}
		i := 0
		for key, err := range v.listedAfter(ctx, v.name+"/commits/", after) {
			if i == n || !yield(key, err) || err != nil {
				return
			}
			i++
		}
	}
}

// pullRanged checks c's large segment by ranges (checkRanges) while
// writing them to a temp file, which becomes its local file once the whole
// segment checks out.
func (v *Volume) pullRanged(ctx context.Context, c *Commit) error {
	path := v.localSegment(c.Segment.Key)
	fsys := v.files()
	f, err := fsys.CreateTemp(filepath.Join(v.dir, "tmp"), "p-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := durable.FillWith(f, func(w io.Writer) error { return v.checkRanges(ctx, c, w) }); err != nil {
		return err
	}
	return staged{path: path, tmp: f.Name(), fs: fsys}.place()
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
	key, size, base := c.Segment.Key, c.Segment.Size, c.Segment.Offset // the segment is [base, size) of the object
	fail := func(format string, args ...any) error {
		return fmt.Errorf("segment %s: %w: %s", key, ErrCorrupt, fmt.Sprintf(format, args...))
	}
	get := func(off, n int64) ([]byte, error) {
		b, err := v.store.Get(ctx, key, fence.Range{Off: off, Len: n})
		if err == nil && int64(len(b)) != n {
			err = fail("%d bytes at %d, want %d: the object's size differs from commit %d's %d", len(b), off, n, c.LSN, size)
		}
		return b, err
	}
	if size < base+headerSize+trailerSize {
		return fail("commit %d says %d bytes, shorter than header and trailer", c.LSN, size)
	}
	tail, err := get(size-trailerSize, trailerSize)
	if err != nil {
		return err
	}
	if string(tail[20:]) != trailerMagic {
		return fail("bad trailer magic")
	}
	indexOff, indexLen := int64(binary.BigEndian.Uint64(tail)), int64(binary.BigEndian.Uint64(tail[8:])) // from the segment's start
	if indexOff < headerSize || base+indexOff+indexLen != size-trailerSize || indexLen%indexItemSize != 0 {
		return fail("index at %d+%d does not fit a segment of %d bytes", indexOff, indexLen, size-base)
	}
	ib, err := get(base+indexOff, indexLen)
	if err != nil {
		return err
	}
	index, err := decodeIndex(ib, uint64(indexOff))
	if err != nil {
		return fail("%v", err)
	}
	if err := matchRanges(key, index, c); err != nil {
		return err
	}
	// Records in file order (both writers lay them out by page number: the
	// index's order). A record inside a range is checked there; one that
	// straddles ranges is carried: the bytes from its start (carryAt) on.
	byOff, inOrder := index, func(a, b indexEntry) int { return cmp.Compare(a.Off, b.Off) }
	if !slices.IsSortedFunc(byOff, inOrder) { // a copy only then: an index is 24 bytes a page in memory
		byOff = slices.SortedFunc(slices.Values(index), inOrder)
	}
	sum, tcrc := sha256.New(), uint32(0)
	crcEnd := size - trailerSize + 16 // the trailer's checksum covers the bytes before it
	var carry []byte
	carryAt, next := int64(0), 0
	for at := int64(0); at < size; {
		n := min(max(verifyRange, base+headerSize), size-at)
		if at+n == size && base == 0 {
			n++ // one byte more than the commit names: the object must not have it (a packed one goes on with its record)
		}
		b, err := v.store.Get(ctx, key, fence.Range{Off: at, Len: n})
		if err != nil {
			return err
		}
		if at+int64(len(b)) != min(at+n, size) {
			return fail("%d bytes at %d: the object's size differs from commit %d's %d", len(b), at, c.LSN, size)
		}
		if at == 0 {
			h, err := decodeHeader(b[base : base+headerSize])
			if err != nil {
				return fmt.Errorf("segment %s: %w", key, err)
			}
			if h.LSN != c.LSN || int(h.Pages) != len(index) {
				return fail("header says LSN %d and %d pages; commit %d, index of %d", h.LSN, h.Pages, c.LSN, len(index))
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
		lo := at // b holds [lo, at)
		at += int64(len(b))
		for ; next < len(byOff); next++ {
			e := byOff[next]
			rlo, rhi := base+int64(e.Off), base+int64(e.Off)+pageHeadSize+int64(e.Len)
			if rhi > at {
				break
			}
			rec := b[max(rlo-lo, 0) : rhi-lo]
			if rlo < lo { // begun in a range before: carried
				rec = append(slices.Clip(carry[rlo-carryAt:]), rec...)
			}
			if _, err := checkPage(rec, e); err != nil {
				return fmt.Errorf("segment %s: %w", key, err)
			}
		}
		switch {
		case next == len(byOff) || base+int64(byOff[next].Off) >= at:
			carry = carry[:0]
		case base+int64(byOff[next].Off) >= lo:
			carryAt = base + int64(byOff[next].Off)
			carry = append(carry[:0], b[carryAt-lo:]...)
		default: // a record longer than a range: its start is carried already
			from := base + int64(byOff[next].Off)
			carry = append(carry[:copy(carry, carry[from-carryAt:])], b...)
			carryAt = from
		}
	}
	if hex.EncodeToString(sum.Sum(nil)) != c.Segment.SHA256 {
		return fail("SHA-256 differs from commit %d", c.LSN)
	}
	if tcrc != binary.BigEndian.Uint32(tail[16:]) {
		return fail("trailer checksum mismatch")
	}
	return nil
}
