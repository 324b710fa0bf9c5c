package graft

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"strconv"
	"strings"
	"sync"

	"github.com/silt-dev/silt/pkg/fence"
)

// link appends c to the chain after checking that it is the next link.
func (v *Volume) link(c *Commit) error {
	if err := checkLink(v.name, c, v.headLSN()+1, v.headHash()); err != nil {
		return err
	}
	v.push(c)
	return nil
}

// checkLink is the one rule of the hash chain, which opening, refreshing
// and verify all apply: c is commit lsn of volume, and names the hash of
// the commit before it (prev).
func checkLink(volume string, c *Commit, lsn uint64, prev string) error {
	switch {
	case c.LSN != lsn:
		return fmt.Errorf("volume %s: commit %d where %d was expected: %w", volume, c.LSN, lsn, ErrCorrupt)
	case c.Prev != prev:
		return fmt.Errorf("volume %s: commit %d does not chain to commit %d (prev %.12s, want %.12s): %w", volume, c.LSN, lsn-1, c.Prev, prev, ErrCorrupt)
	case c.Volume != volume:
		return fmt.Errorf("volume %s: commit %d belongs to volume %q: %w", volume, c.LSN, c.Volume, ErrCorrupt)
	}
	return nil
}

// fetchCommit GETs and decodes the remote commit of lsn and stores its
// local copy.
func (v *Volume) fetchCommit(ctx context.Context, lsn uint64) (*Commit, error) {
	c, err := v.getCommit(ctx, lsn)
	if err != nil {
		return nil, err
	}
	return c, v.writeCommitFile(c.LSN, c.raw)
}

// getCommit GETs and decodes the remote commit of lsn.
func (v *Volume) getCommit(ctx context.Context, lsn uint64) (*Commit, error) {
	c, err := v.readCommit(ctx, v.commitKey(lsn))
	if err != nil {
		return nil, fmt.Errorf("refresh volume %s: %w", v.name, err)
	}
	return c, nil
}

// commitRead is how many last bytes of a commit object one GET reads: a
// packed commit's record and footer (a tail of 64 entries is about 20
// KiB), or the whole of a format 1 or 2 object.
const commitRead = 64 << 10

// readCommit GETs and decodes the commit object at key, packed or not: the
// last commitRead bytes, then, rarely, the longer record they name, or the
// whole of a longer unpacked object.
func (v *Volume) readCommit(ctx context.Context, key string) (*Commit, error) {
	return v.readCommitTail(ctx, key, commitRead)
}

// readCommitTail is readCommit with the first GET reading the last first
// bytes of the object.
func (v *Volume) readCommitTail(ctx context.Context, key string, first int64) (*Commit, error) {
	b, err := v.store.Get(ctx, key, fence.Suffix(first))
	if err != nil {
		return nil, err
	}
	rec, need, packed, err := packedRecord(key, b)
	switch {
	case err != nil:
		return nil, err
	case packed && need > 0:
		if b, err = v.store.Get(ctx, key, fence.Suffix(need)); err != nil {
			return nil, err
		}
		if int64(len(b)) < need {
			return nil, fmt.Errorf("commit %s: %w: its footer names a record of %d bytes in an object of %d", key, ErrCorrupt, need-int64(packedFooter), len(b))
		}
		if rec, need, _, err = packedRecord(key, b); err != nil || need > 0 {
			return nil, cmp.Or(err, fmt.Errorf("commit %s: %w: its footer changed between two reads", key, ErrCorrupt))
		}
	case !packed && int64(len(b)) == first: // an unpacked object at least this long: all of it
		if b, err = v.store.Get(ctx, key, fence.Range{}); err != nil {
			return nil, err
		}
	}
	if !packed {
		return DecodeCommit(key, b)
	}
	c, err := DecodeCommit(key, rec)
	if err == nil && c.Version != packedVersion {
		err = fmt.Errorf("commit %s: %w: a packed object's record says format %d", key, ErrCorrupt, c.Version)
	}
	return c, err
}

// newestAfter finds the newest commit after lsn without a LIST (which is
// O(history) on a local store): it gallops from lsn by half the checkpoint
// interval, then bisects, so the usual tail below the interval costs four
// to six GETs. It returns nil when lsn is the newest. It assumes no hole
// in the chain above lsn (a hole there is corruption, found by verify).
func (v *Volume) newestAfter(ctx context.Context, lsn uint64) (*Commit, error) {
	var newest *Commit
	present := func(at uint64) (bool, error) {
		c, err := v.getCommit(ctx, at)
		if errors.Is(err, fence.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if newest == nil || c.LSN > newest.LSN {
			newest = c
		}
		return true, nil
	}
	lo, step, hi := lsn, uint64(max(CheckpointEvery/2, 1)), uint64(0)
	for hi == 0 {
		ok, err := present(lo + step)
		if err != nil {
			return nil, err
		}
		if ok {
			lo, step = lo+step, step*2
		} else {
			hi = lo + step
		}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		ok, err := present(mid)
		if err != nil {
			return nil, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	if newest == nil || newest.LSN != lo {
		return nil, nil // lo is lsn itself
	}
	return newest, nil
}

// readChain reads the whole remote commit chain: a volume with no local
// state and no usable checkpoint. A missing commit is an error naming
// every missing object and the repairs.
func (v *Volume) readChain(ctx context.Context) error {
	scan, err := v.scanChain(ctx)
	if err != nil {
		return fmt.Errorf("refresh volume %s: %w", v.name, err)
	}
	n := scan.keys
	if missing := scan.missing(0); len(missing) > 0 {
		if dropped, derr := v.droppedUpTo(ctx); derr == nil && dropped > 0 && scan.holes[0].Lo == 1 {
			return fmt.Errorf("volume %s: %w: %w: %s; the commits up to %d were dropped, so only a checkpoint "+
				"at or above %d opens this volume, and none did (the warnings say why each was unusable)",
				v.name, ErrMissingCommits, ErrDropped, strings.Join(missing, ", "), dropped, dropped)
		}
		return fmt.Errorf("volume %s: %w: the remote lacks %s of a chain of %d commits, and no checkpoint covers them",
			v.name, ErrMissingCommits, strings.Join(missing, ", "), scan.last)
	}
	return v.linkChain(ctx, 1, n, true)
}

// linkChain fetches the n commits from LSN from, 8 at once, writes each
// locally and links them in order onto the head (the base when from is
// above 1). With rebase, the checkpoints the commits name are adopted on
// the way; RebuildIndex distrusts them.
func (v *Volume) linkChain(ctx context.Context, from uint64, n int, rebase bool) error {
	fetch := func(ctx context.Context, key string) (*Commit, error) {
		lsn, ok := keyLSN(key)
		if !ok {
			return nil, fmt.Errorf("volume %s: %w: commit key %s", v.name, ErrCorrupt, key)
		}
		c, err := v.getCommit(ctx, lsn)
		if err != nil {
			return nil, err
		}
		return c, v.writeFile(v.localCommit(c.LSN), c.raw)
	}
	for c, err := range fetchAhead(ctx, v.chainKeys(ctx, from, n), ahead{n: verifyAhead}, nil, fetch) {
		if err != nil {
			return err
		}
		v.hint(c.LSN)
		if err := v.link(c); err != nil {
			return err
		}
		if rebase {
			v.rebase(ctx, c.Base)
		}
	}
	return nil
}

// scanChain reads the commit listing a page at a time: how many commit
// keys there are, the last LSN, and the LSN ranges missing below it.
func (v *Volume) scanChain(ctx context.Context) (chainScan, error) {
	scan := chainScan{volume: v.name}
	for key, err := range v.listed(ctx, v.name+"/commits/") {
		if err != nil {
			return scan, err
		}
		scan.add(key)
	}
	return scan, nil
}

// keyLSN reads the LSN a commit key ends with.
func keyLSN(key string) (uint64, bool) {
	lsn, err := strconv.ParseUint(key[strings.LastIndexByte(key, '/')+1:], 10, 64)
	return lsn, err == nil
}

// chainScan is what one pass over the commit keys, in order, found.
type chainScan struct {
	volume string
	keys   int
	last   uint64
	holes  []PageRange // LSN ranges missing below last, in order
}

func (s *chainScan) add(key string) {
	lsn, ok := keyLSN(key)
	if !ok {
		return
	}
	if lsn > s.last+1 {
		s.holes = append(s.holes, PageRange{s.last + 1, lsn - 1})
	}
	s.keys, s.last = s.keys+1, lsn
}

// missing names the LSN ranges missing above LSN after.
func (s chainScan) missing(after uint64) []string {
	var out []string
	for _, h := range s.holes {
		if h.Hi > after {
			out = append(out, rangeName(s.volume, max(h.Lo, after+1), h.Hi))
		}
	}
	return out
}

// above counts the keys above LSN after, when none is missing there.
func (s chainScan) above(after uint64) int {
	if after >= s.last {
		return 0
	}
	return int(s.last - after)
}

func rangeName(volume string, lo, hi uint64) string {
	if lo == hi {
		return volume + "/commits/" + lsnName(lo)
	}
	return fmt.Sprintf("%s/commits/%s..%s (%d objects)", volume, lsnName(lo), lsnName(hi), hi-lo+1)
}

// chainPlan is what verify and pull walk: the remote's checkpoints by LSN,
// the commit listing, and where the chain starts (0: at its first commit;
// otherwise the checkpoint at that LSN, where a drop left it).
type chainPlan struct {
	ckAt     map[uint64]string
	newestCk uint64
	scan     chainScan
	start    uint64
}

// planChain lists the checkpoints and the commits and finds where the
// chain starts. Commits missing above that start are an error naming them
// all, before anything is read.
func (v *Volume) planChain(ctx context.Context) (chainPlan, error) {
	plan := chainPlan{ckAt: map[uint64]string{}}
	cks, err := v.store.List(ctx, v.name+"/checkpoints/", "", 0)
	if err != nil {
		return plan, err
	}
	for _, k := range cks {
		if lsn, ok := checkpointLSN(k); ok {
			plan.ckAt[lsn], plan.newestCk = k, max(plan.newestCk, lsn)
		}
	}
	dropped, err := v.droppedUpTo(ctx)
	if err != nil {
		return plan, err
	}
	// The whole listing is read twice, a page at a time: every missing
	// commit is named before anything is read, and a chain of a million
	// commits is never held as a million keys.
	if plan.scan, err = v.scanChain(ctx); err != nil {
		return plan, err
	}
	plan.start = chainStart(plan.scan, dropped, plan.ckAt)
	if missing := plan.scan.missing(plan.start); len(missing) > 0 {
		return plan, fmt.Errorf("%w: %s", ErrMissingCommits, strings.Join(missing, ", "))
	}
	return plan, nil
}

// chainStart finds the LSN the commit chain starts after: 0 while no
// commit is missing up to dropped, the LSN a drop of old commits
// (DropOldCommits) may have deleted up to; otherwise the oldest
// checkpoint at or above the highest commit missing there, whose entries
// then seed the verifier. The commits below it are what a drop that did
// not finish left (stopped by its limit, an error or a kill), never
// chained; the next drop deletes them. Commits missing above dropped are
// never forgiven. With no commit left at all, the newest checkpoint.
func chainStart(scan chainScan, dropped uint64, ckAt map[uint64]string) uint64 {
	if scan.keys == 0 {
		start := uint64(0)
		for lsn := range ckAt { // every commit dropped: the newest checkpoint holds the head
			start = max(start, lsn)
		}
		return start
	}
	if len(scan.holes) > 0 && scan.holes[0].Lo == 1 {
		if _, ok := ckAt[scan.holes[0].Hi]; ok {
			// Dropped by a build that left no mark: a prefix ending at a checkpoint.
			dropped = max(dropped, scan.holes[0].Hi)
		}
	}
	var gone uint64 // the highest commit missing up to dropped
	for _, h := range scan.holes {
		if h.Lo <= dropped {
			gone = min(h.Hi, dropped)
		}
	}
	if dropped > scan.last { // the newest commits dropped too, packed ones below them kept (their segments are live)
		gone = dropped
	}
	if gone == 0 {
		return 0
	}
	start := uint64(0)
	for lsn := range ckAt {
		if lsn >= gone && (start == 0 || lsn < start) {
			start = lsn
		}
	}
	return start
}

// listed yields the keys under prefix in order, listing gcPage at a time.
func (v *Volume) listed(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return v.listedAfter(ctx, prefix, "")
}

// listedAfter is listed from the first key after after ("": from the first).
func (v *Volume) listedAfter(ctx context.Context, prefix, after string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for {
			keys, err := v.store.List(ctx, prefix, after, gcPage)
			if err != nil {
				yield("", err)
				return
			}
			for _, k := range keys {
				if !yield(k, nil) {
					return
				}
			}
			if len(keys) < gcPage {
				return
			}
			after = keys[len(keys)-1]
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

// droppedKey names the mark of a drop of the commits up to lsn; marks are
// listed newest first.
func (v *Volume) droppedKey(lsn uint64) string {
	return v.name + "/dropped/" + fmt.Sprintf("%020d", math.MaxUint64-lsn)
}

// droppedUpTo reads the newest drop mark: commits up to it may be gone (0:
// none dropped, or only by a build that left no mark).
func (v *Volume) droppedUpTo(ctx context.Context) (uint64, error) {
	keys, err := v.store.List(ctx, v.name+"/dropped/", "", 1)
	if err != nil || len(keys) == 0 {
		return 0, err
	}
	lsn, ok := checkpointLSN(keys[0])
	if !ok {
		return 0, fmt.Errorf("%w: drop mark %s", ErrCorrupt, keys[0])
	}
	return lsn, nil
}

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
