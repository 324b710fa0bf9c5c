package graft

import (
	"bufio"
	"context"
	"fmt"
	"iter"
	"maps"
	"math"
	"os"
	"path/filepath"
	"sync"

	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/fence"
)

// Compaction merges the segments of adjacent small entries into one, so a
// volume of a million small commits keeps about bytes/Target segment
// objects (docs/architecture.md, "Deep history"). Only monotonic volumes
// (pages in commit order, as every archive is) are compacted.

// Defaults of CompactOptions.
const (
	DefaultCompactTarget     = 64 << 20
	DefaultCompactMinEntries = 1024
)

// CompactOptions bound one Compact call; the zero value takes the defaults.
type CompactOptions struct {
	// Target is the size a merged segment grows to (default 64 MiB). An
	// entry at or above it is never merged again.
	Target int64
	// MinEntries merges a run of this many small entries even below Target
	// (default 1024), so a quiet stream's object count stays bounded too.
	MinEntries int
	// MaxBytes bounds the bytes merged by one call (default 4 × Target): an
	// archive run compacts a little each time.
	MaxBytes int64
	// Current says the volume's view is current (the caller refreshed it
	// and committed since): Compact does not refresh it first, which saves
	// a round trip to the remote. A commit it did not see makes a
	// compaction lose its race for the LSN: it is dropped, as always.
	Current bool
}

func (o *CompactOptions) defaults() {
	if o.Target <= 0 {
		o.Target = DefaultCompactTarget
	}
	if o.MinEntries <= 1 {
		o.MinEntries = DefaultCompactMinEntries
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = 4 * o.Target
	}
}

// CompactResult says what one Compact call did.
type CompactResult struct {
	Merged   int   `json:"merged"`   // entries replaced
	Segments int   `json:"segments"` // merged segments written (one compaction commit each)
	Bytes    int64 `json:"bytes"`    // bytes of the merged segments
	Entries  int64 `json:"entries"`  // live entries after it
}

// Compact merges runs of adjacent small entries, oldest first, each into
// one segment committed by a compaction commit (which carries the latest
// metadata forward), then checkpoints so readers find the merged entry.
// A compaction that loses the race for its LSN to another writer is
// dropped (its segment is an orphan for gc) and the call returns what it
// did so far: the next call starts again from the new state.
//
// Readers that opened before a compaction still read the replaced
// segments: gc removes them only once no checkpoint younger than its
// grace names them.
func (v *Volume) Compact(ctx context.Context, opt CompactOptions) (CompactResult, error) {
	opt.defaults()
	v.mu.Lock()
	defer v.mu.Unlock()
	var res CompactResult
	if !opt.Current {
		if err := v.refresh(ctx); err != nil {
			return res, err
		}
	}
	// A pass goes from the first entry to the last, never merging what it
	// merged (the next run starts above it); the next pass may merge those
	// merged entries that are still below Target: levels, each about
	// MinEntries times the one before, so a byte is rewritten about
	// log(entries)/log(MinEntries) times at most (twice for a million).
	if s := v.stats(); s.Entries < int64(opt.MinEntries) && s.Bytes < opt.Target {
		return v.compacted(res), nil // no run can qualify: not even a checkpoint is due
	}
	for pass := 0; res.Bytes < opt.MaxBytes; pass++ {
		merged := res.Segments
		for from := uint64(0); res.Bytes < opt.MaxBytes; {
			if len(v.tail) > 0 { // every entry in leaves: runs are found there
				if _, err := v.checkpoint(ctx); err != nil {
					return res, err
				}
			}
			if v.base == nil {
				return v.compacted(res), nil
			}
			if !v.base.Monotonic {
				return res, fmt.Errorf("compact volume %s: %w", v.name, ErrNotMonotonic)
			}
			run, err := v.smallRun(ctx, opt, from)
			if err != nil {
				return v.compacted(res), err
			}
			if len(run) < 2 {
				break
			}
			n, err := v.merge(ctx, run)
			if IsConflict(err) {
				return v.compacted(res), nil
			}
			if err != nil {
				return v.compacted(res), err
			}
			res.Merged, res.Segments, res.Bytes = res.Merged+len(run), res.Segments+1, res.Bytes+n
			from = run[len(run)-1].hi() + 1
		}
		if res.Segments == merged {
			break // a pass that merged nothing: done
		}
	}
	return v.compacted(res), nil
}

func (v *Volume) compacted(res CompactResult) CompactResult {
	if v.base != nil {
		res.Entries = int64(v.base.Entries)
	}
	res.Entries += int64(len(v.tail))
	return res
}

// smallRun returns the first run of adjacent entries below Target, from
// page from on, that reaches Target bytes or MinEntries entries (nil: none
// does yet).
func (v *Volume) smallRun(ctx context.Context, opt CompactOptions, from uint64) ([]Entry, error) {
	var run []Entry
	var bytes int64
	for ref, err := range v.leafRefs(ctx, v.base, func(r nodeRef) bool { return r.Hi < from }) {
		if err != nil {
			return nil, err
		}
		if ref.Bytes >= opt.Target*int64(ref.Entries) {
			run, bytes = nil, 0 // a leaf of merged entries only
			continue
		}
		entries, err := v.leaf(ctx, ref)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.lo() < from {
				continue
			}
			if e.Segment.Size >= opt.Target {
				run, bytes = nil, 0
				continue
			}
			run, bytes = append(run, e), bytes+e.Segment.Size
			if bytes >= opt.Target || len(run) >= opt.MinEntries {
				return run, nil
			}
		}
	}
	return nil, nil
}

// A merge fetches the segments it reads ahead of the one it copies, up to
// fetchConcurrency at once and fetchAheadBytes in all (one more if a single
// segment is larger): memory stays a few segments, whatever the merge's size.
const (
	fetchConcurrency = 8
	fetchAheadBytes  = 2 << 20
)

// sources yields the verified segments of run in order, fetching ahead.
func (v *Volume) sources(ctx context.Context, run []Entry) iter.Seq2[*Segment, error] {
	return func(yield func(*Segment, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }()
		type fetched struct {
			seg *Segment
			err error
		}
		out := make([]chan fetched, len(run))
		next, ahead := 0, int64(0) // the next segment to fetch; bytes fetched and not yet yielded
		for i := range run {
			for next < len(run) && next-i < fetchConcurrency && (next == i || ahead+run[next].Segment.Size <= fetchAheadBytes) {
				out[next] = make(chan fetched, 1)
				wg.Add(1)
				go func(j int) {
					defer wg.Done()
					seg, err := v.segmentOf(ctx, run[j].commit(v.name), true)
					out[j] <- fetched{seg, err}
				}(next)
				ahead += run[next].Segment.Size
				next++
			}
			f := <-out[i]
			ahead -= run[i].Segment.Size
			if f.err != nil {
				yield(nil, f.err)
				return
			}
			if !yield(f.seg, nil) {
				return
			}
		}
	}
}

// merge writes the pages of run's segments as one compaction commit and
// checkpoints it; it returns the merged segment's size. The merged segment
// is streamed to a local file, source by source, and uploaded from it: a
// merge of 64 MiB holds a few source segments in memory, never its output.
func (v *Volume) merge(ctx context.Context, run []Entry) (int64, error) {
	lsn := v.headLSN() + 1
	path, size, sum, ranges, pages, err := v.writeMerged(ctx, lsn, run)
	if err != nil {
		return 0, fmt.Errorf("compact volume %s: %w", v.name, err)
	}
	last := run[len(run)-1]
	c := v.newCommit(lsn, size, sum, ranges, pages, maps.Clone(v.head().Meta))
	c.Version, c.Replaces, c.EntryMeta = compactionVersion, &PageRange{Lo: run[0].lo(), Hi: last.hi()}, maps.Clone(last.Meta)
	local := v.localSegment(c.Segment.Key)
	if err := (staged{path: local, tmp: path, fs: v.files()}).place(); err != nil {
		return 0, fmt.Errorf("volume %s: %w", v.name, err)
	}
	v.failpoint(failpoint.SegmentWritten)
	if err := fence.CreateFromFile(ctx, v.store, c.Segment.Key, local, size, sum); err != nil {
		return 0, fmt.Errorf("upload segment %s: %w", c.Segment.Key, err)
	}
	v.failpoint(failpoint.SegmentUploaded)
	if err := v.put(ctx, c); err != nil {
		return 0, err
	}
	if err := v.Sync(); err != nil {
		return 0, err
	}
	v.failpoint(failpoint.CompactionCommitted)
	if _, err := v.checkpoint(ctx); err != nil {
		// Readers still find every page (the compaction commit is in the
		// commits after the checkpoint); the next call checkpoints first.
		return c.Segment.Size, fmt.Errorf("compact volume %s: checkpoint after compaction commit %d: %w", v.name, c.LSN, err)
	}
	return c.Segment.Size, nil
}

// writeMerged writes the segment of lsn holding the pages of run's
// segments to a new file in the tmp directory, fsynced. It returns the
// file, the segment's size and SHA-256, and the pages it holds.
func (v *Volume) writeMerged(ctx context.Context, lsn uint64, run []Entry) (path string, size int64, sum string, ranges []PageRange, pages uint64, err error) {
	for _, e := range run {
		pages += e.Pages
	}
	if pages > math.MaxUint32 {
		return "", 0, "", nil, 0, fmt.Errorf("merge of %d pages: over a segment's limit", pages)
	}
	tmp := filepath.Join(v.dir, "tmp")
	f, err := os.CreateTemp(tmp, "m-*")
	if err != nil {
		return "", 0, "", nil, 0, err
	}
	spill, err := os.CreateTemp(tmp, "i-*")
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", 0, "", nil, 0, err
	}
	defer func() {
		spill.Close()
		os.Remove(spill.Name())
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	out := bufio.NewWriterSize(f, 256<<10)
	w := newSegmentWriter(out, spill, lsn, uint32(pages))
	for seg, err := range v.sources(ctx, run) {
		if err != nil {
			return "", 0, "", nil, 0, err
		}
		for _, e := range seg.index {
			if err := w.add(e.No, seg.data[e.Off:e.Off+pageHeadSize+uint64(e.Len)]); err != nil {
				return "", 0, "", nil, 0, err
			}
			ranges = addRange(ranges, e.No)
		}
	}
	if size, sum, err = w.finish(); err != nil {
		return "", 0, "", nil, 0, err
	}
	if err = out.Flush(); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", 0, "", nil, 0, fmt.Errorf("write merged segment: %w", err)
	}
	return f.Name(), size, sum, ranges, pages, nil
}
