package graft

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/silt-dev/silt/pkg/fence"
)

// VerifyReport says what Verify checked.
type VerifyReport struct {
	Commits     int   `json:"commits"`
	Segments    int   `json:"segments"`
	Pages       int64 `json:"pages"`
	Bytes       int64 `json:"bytes"`
	Checkpoints int   `json:"checkpoints"`
	Entries     int   `json:"entries"`   // live segments (fewer than commits after compaction)
	Collected   int   `json:"collected"` // segments compacted away and removed by gc
	// ChainStart is the checkpoint the chain starts from when the commits
	// before it were dropped (DropOldCommits); 0: the chain starts at LSN 1.
	ChainStart uint64 `json:"chain_start,omitempty"`
}

// VerifyRemote checks the remote copy: every commit object's checksum, the
// hash chain and LSN sequence, every commit's tail against the commits it
// names, every segment's SHA-256, page checksums and page ranges against
// its commit, and every checkpoint against the chain (its commit and
// totals; for the newest, every entry of every leaf). Segments a
// compaction replaced may be gone (gc): they are checked when present.
// The error names the first bad object; missing commits are named all at
// once.
func (v *Volume) VerifyRemote(ctx context.Context) (VerifyReport, error) {
	var rep VerifyReport
	first, err := v.store.List(ctx, v.name+"/commits/", "", 1)
	if err != nil {
		return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
	}
	cks, err := v.store.List(ctx, v.name+"/checkpoints/", "", 0)
	if err != nil {
		return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
	}
	ckAt := map[uint64]string{}
	var newestCk uint64
	for _, k := range cks {
		if lsn, ok := checkpointLSN(k); ok {
			ckAt[lsn], newestCk = k, max(newestCk, lsn)
		}
	}
	cv := chainVerifier{v: v, recent: map[uint64]Entry{}}
	start := chainStart(first, ckAt)
	// The whole listing is read twice, a page at a time: every missing
	// commit is named before anything is read, and a chain of a million
	// commits is never held as a million keys.
	chain := 0
	holes := holeFinder{volume: v.name, want: start + 1}
	for key, err := range v.listed(ctx, v.name+"/commits/") {
		if err != nil {
			return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
		}
		holes.add(key)
		chain++
	}
	if len(holes.out) > 0 {
		return rep, fmt.Errorf("verify volume %s: %w: %s", v.name, ErrMissingCommits, strings.Join(holes.out, ", "))
	}
	if start > 0 {
		if err := cv.seed(ctx, ckAt[start]); err != nil {
			return rep, err
		}
	}
	rep.ChainStart = start
	for lsn := range ckAt {
		if lsn <= start && start > 0 { // the chain's genesis, and roots before it: nothing to check them against
			delete(ckAt, lsn)
		}
	}
	i := 0
	for key, err := range v.listed(ctx, v.name+"/commits/") {
		if err != nil {
			return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
		}
		if i == chain {
			break // commits made since the first pass: not in the chain checked
		}
		i++
		b, err := v.store.Get(ctx, key, fence.Range{})
		if err != nil {
			return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
		}
		c, err := DecodeCommit(key, b)
		if err != nil {
			return rep, err
		}
		if err := checkLink(v.name, c, start+uint64(i), cv.prev); err != nil {
			return rep, fmt.Errorf("%s: %w", key, err)
		}
		if err := cv.add(key, c); err != nil {
			return rep, err
		}
		var seg []byte
		if c.Segment.Key != "" { // a prune commit has none
			seg, err = v.store.Get(ctx, c.Segment.Key, fence.Range{})
		}
		if errors.Is(err, fence.ErrNotFound) {
			cv.missing = append(cv.missing, c.LSN) // fine if a compaction or a prune dropped it: checked at the end
			rep.Collected++
		} else if err != nil {
			return rep, fmt.Errorf("verify volume %s: commit %s: %w", v.name, key, err)
		} else if seg != nil {
			if err := checkAgainst(c.Segment.Key, seg, c); err != nil {
				return rep, err
			}
		}
		if ck, ok := ckAt[c.LSN]; ok {
			// Every checkpoint's commit and totals; the newest one's entries too.
			if err := cv.checkpoint(ctx, ck, c.LSN == newestCk); err != nil {
				return rep, err
			}
			delete(ckAt, c.LSN)
			rep.Checkpoints++
		}
		rep.Commits, rep.Pages = rep.Commits+1, rep.Pages+int64(c.Pages)
		if seg != nil {
			rep.Segments, rep.Bytes = rep.Segments+1, rep.Bytes+int64(len(seg))
		}
	}
	for lsn, k := range ckAt {
		return rep, fmt.Errorf("checkpoint %s: %w: at LSN %d, beyond the chain's %d commits", k, ErrCorrupt, lsn, chain)
	}
	rep.Entries = len(cv.entries)
	return rep, cv.gone(ctx)
}

// listed yields the keys under prefix in order, listing gcPage at a time.
func (v *Volume) listed(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for after := ""; ; {
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

// chainVerifier follows the chain in order and keeps the volume's entries
// as the chain makes them, in a compact form (about 48 bytes an entry,
// where a whole entry takes ten times that), and recent entries in full
// for their successors' tails.
type chainVerifier struct {
	v       *Volume
	prev    string
	entries []derived // in index order
	bytes   int64
	mono    bool
	top     uint64
	recent  map[uint64]Entry
	missing []uint64 // the commits whose segments were not found, in order
}

// derived is an entry as the chain makes it: its commit, page span and a
// digest of the whole entry.
type derived struct {
	lsn, lo, hi uint64
	size        int64
	digest      [16]byte
}

func derive(e Entry) derived {
	b, _ := json.Marshal(e)
	sum := sha256.Sum256(b)
	d := derived{lsn: e.LSN, lo: e.lo(), hi: e.hi(), size: e.Segment.Size}
	copy(d.digest[:], sum[:])
	return d
}

func (cv *chainVerifier) add(key string, c *Commit) error {
	for _, t := range c.Tail {
		if e, ok := cv.recent[t.LSN]; ok && !sameEntry(e, t) {
			return fmt.Errorf("commit %s: %w: its tail entry for LSN %d differs from commit %d", key, ErrCorrupt, t.LSN, t.LSN)
		}
	}
	e := entryOf(c, cv.v.KeepMeta)
	d := derive(e)
	if len(cv.entries) == 0 && c.LSN == 1 {
		cv.mono = true
	}
	if e.PruneBelow > 0 {
		if !cv.mono {
			return fmt.Errorf("commit %s: %w: prune of a volume whose pages are not in commit order", key, ErrCorrupt)
		}
		n := 0
		for n < len(cv.entries) && cv.entries[n].hi < e.PruneBelow {
			cv.bytes -= cv.entries[n].size
			n++
		}
		cv.entries = cv.entries[n:]
	} else if e.Replaces == nil {
		if len(cv.entries) > 0 && d.lo <= cv.top {
			cv.mono = false
		}
		cv.top = max(cv.top, d.hi)
		cv.entries, cv.bytes = append(cv.entries, d), cv.bytes+d.size
	} else {
		r := *e.Replaces
		i, _ := slices.BinarySearchFunc(cv.entries, r.Lo, func(x derived, lo uint64) int { return cmp.Compare(x.lo, lo) })
		j := i
		for j < len(cv.entries) && cv.entries[j].hi <= r.Hi {
			cv.bytes -= cv.entries[j].size
			j++
		}
		if !cv.mono || j == i || cv.entries[i].lo < r.Lo || j < len(cv.entries) && cv.entries[j].lo <= r.Hi {
			return fmt.Errorf("commit %s: %w: compaction of pages %d-%d does not replace whole entries", key, ErrCorrupt, r.Lo, r.Hi)
		}
		cv.entries = slices.Replace(cv.entries, i, j, d)
		cv.bytes += d.size
	}
	cv.prev = c.Hash()
	cv.recent[c.LSN] = e
	delete(cv.recent, c.LSN-uint64(8*max(cv.v.CheckpointEvery, CheckpointEvery)))
	return nil
}

// checkpoint checks the checkpoint at the commit just added: its commit,
// its totals, and, with full, every entry of every leaf.
func (cv *chainVerifier) checkpoint(ctx context.Context, key string, full bool) error {
	root, err := cv.v.store.Get(ctx, key, fence.Range{})
	if err != nil {
		return fmt.Errorf("verify volume %s: %w", cv.v.name, err)
	}
	ck, err := decodeCheckpoint(key, root)
	if err != nil {
		return err
	}
	switch {
	case ck.CommitHash != cv.prev:
		return fmt.Errorf("checkpoint %s: %w: names commit %.12s, the chain has %.12s at LSN %d", key, ErrCorrupt, ck.CommitHash, cv.prev, ck.LSN)
	case ck.Entries != uint64(len(cv.entries)) || ck.Bytes != cv.bytes || ck.Monotonic != cv.mono:
		return fmt.Errorf("checkpoint %s: %w: %d entries of %d bytes (monotonic %t), the chain has %d of %d (%t)",
			key, ErrCorrupt, ck.Entries, ck.Bytes, ck.Monotonic, len(cv.entries), cv.bytes, cv.mono)
	case !full:
		return nil
	}
	at := 0
	for l, err := range cv.v.leafRefs(ctx, ck, nil) {
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", key, err)
		}
		entries, err := cv.v.leaf(ctx, l)
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", key, err)
		}
		for _, e := range entries {
			if at >= len(cv.entries) || derive(e) != cv.entries[at] {
				return fmt.Errorf("checkpoint %s: %w: leaf %s, entry of commit %d: not the chain's entry %d", key, ErrCorrupt, l.Key, e.LSN, at)
			}
			at++
		}
	}
	return nil
}

// chainStart finds the LSN the commit chain starts after, from the first
// commit key (none: every commit dropped) and the checkpoints: 0, or, when
// the commits up to s were dropped (DropOldCommits), the checkpoint at s,
// whose entries then seed the verifier.
func chainStart(firstKey []string, ckAt map[uint64]string) uint64 {
	start := uint64(0)
	if len(firstKey) > 0 {
		first, _ := strconv.ParseUint(firstKey[0][strings.LastIndexByte(firstKey[0], '/')+1:], 10, 64)
		if _, ok := ckAt[first-1]; ok && first > 1 {
			start = first - 1
		}
	} else {
		for lsn := range ckAt { // every commit dropped: the newest checkpoint holds the head
			start = max(start, lsn)
		}
	}
	return start
}

// seed starts the verifier at the checkpoint at key: its commit and its
// entries, checked against its totals.
func (cv *chainVerifier) seed(ctx context.Context, key string) error {
	v := cv.v
	root, err := v.store.Get(ctx, key, fence.Range{})
	if err != nil {
		return fmt.Errorf("verify volume %s: %w", v.name, err)
	}
	ck, err := decodeCheckpoint(key, root)
	if err != nil {
		return err
	}
	cv.prev, cv.mono = ck.CommitHash, ck.Monotonic
	for ref, err := range v.leafRefs(ctx, ck, nil) {
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", key, err)
		}
		entries, err := v.leaf(ctx, ref)
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", key, err)
		}
		for _, e := range entries {
			cv.entries, cv.bytes, cv.top = append(cv.entries, derive(e)), cv.bytes+e.Segment.Size, max(cv.top, e.hi())
		}
	}
	if uint64(len(cv.entries)) != ck.Entries || cv.bytes != ck.Bytes {
		return fmt.Errorf("checkpoint %s: %w: its nodes hold %d entries of %d bytes, it says %d of %d", key, ErrCorrupt, len(cv.entries), cv.bytes, ck.Entries, ck.Bytes)
	}
	return nil
}

// gone checks, at the end of the chain, that every segment found missing
// belongs to an entry a compaction replaced: none of the live ones.
func (cv *chainVerifier) gone(ctx context.Context) error {
	for _, d := range cv.entries {
		if _, missing := slices.BinarySearch(cv.missing, d.lsn); !missing {
			continue
		}
		key := cv.v.commitKey(d.lsn) // read again to name the segment: only on this error
		if b, err := cv.v.store.Get(ctx, key, fence.Range{}); err == nil {
			if c, err := DecodeCommit(key, b); err == nil {
				key = c.Segment.Key
			}
		}
		return fmt.Errorf("verify volume %s: commit %d: %w: its segment %s is missing", cv.v.name, d.lsn, fence.ErrNotFound, key)
	}
	return nil
}

func sameEntry(a, b Entry) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// VerifyLocal checks the local files: the local checkpoint, the commit
// files after it (chained), and every local segment file of a live entry
// (missing ones are fetched on demand, so they are skipped).
func (v *Volume) VerifyLocal(ctx context.Context) (VerifyReport, error) {
	var rep VerifyReport
	st := v.state()
	prev := ""
	if st.base != nil {
		b, err := os.ReadFile(v.localCheckpoint())
		if err != nil {
			return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
		}
		if _, err := decodeCheckpoint(v.localCheckpoint(), b); err != nil {
			return rep, err
		}
		rep.Checkpoints, prev = 1, st.base.CommitHash
	}
	for i, c := range st.tail {
		path := v.localCommit(c.LSN)
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) && i < len(st.tail)-1 {
			prev = c.Hash() // known from the newest commit's tail
			continue
		}
		if err != nil {
			return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
		}
		lc, err := DecodeCommit(path, b)
		if err != nil {
			return rep, err
		}
		if err := checkLink(v.name, lc, c.LSN, prev); err != nil {
			return rep, fmt.Errorf("%s: %w", path, err)
		}
		prev = lc.Hash()
		rep.Commits++
	}
	for c, err := range v.Entries(ctx, nil) {
		if err != nil {
			return rep, err
		}
		seg, err := os.ReadFile(v.localSegment(c.Segment.Key))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
		}
		if err := checkAgainst(v.localSegment(c.Segment.Key), seg, c); err != nil {
			return rep, err
		}
		rep.Segments, rep.Pages, rep.Bytes = rep.Segments+1, rep.Pages+int64(c.Pages), rep.Bytes+int64(len(seg))
	}
	return rep, nil
}

// checkAgainst verifies a segment's bytes and that its pages are exactly the
// commit's page ranges.
func checkAgainst(name string, b []byte, c *Commit) error {
	seg, err := checkSegment(name, b, c)
	if err != nil {
		return err
	}
	pages := seg.Pages()
	i := 0
	for _, r := range c.Ranges {
		for no := r.Lo; ; no++ {
			if i >= len(pages) || pages[i] != no {
				return fmt.Errorf("segment %s: %w: pages differ from commit %d's ranges at page %d", name, ErrCorrupt, c.LSN, no)
			}
			i++
			if no == r.Hi {
				break
			}
		}
	}
	if i != len(pages) {
		return fmt.Errorf("segment %s: %w: %d pages beyond commit %d's ranges", name, ErrCorrupt, len(pages)-i, c.LSN)
	}
	return nil
}

// Pull rebuilds the local copy from the remote: every commit and segment is
// fetched, verified and written locally, replacing what was there; the
// newest checkpoint the chain confirms becomes the local base.
func (v *Volume) Pull(ctx context.Context) (VerifyReport, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var rep VerifyReport
	keys, err := v.store.List(ctx, v.name+"/commits/", "", 0)
	if err != nil {
		return rep, fmt.Errorf("pull volume %s: %w", v.name, err)
	}
	if missing := missingCommits(keys, v.name, 1); len(missing) > 0 {
		return rep, fmt.Errorf("pull volume %s: %w: %s (a chain whose old commits were dropped is not pulled: open it cold instead)", v.name, ErrMissingCommits, strings.Join(missing, ", "))
	}
	hashes := make([]string, 0, len(keys))
	cv := chainVerifier{v: v, recent: map[uint64]Entry{}}
	for i, key := range keys {
		obj, err := v.store.Get(ctx, key, fence.Range{})
		if err != nil {
			return rep, fmt.Errorf("pull volume %s: %w", v.name, err)
		}
		c, err := DecodeCommit(key, obj)
		if err != nil {
			return rep, err
		}
		if err := checkLink(v.name, c, uint64(i)+1, cv.prev); err != nil {
			return rep, fmt.Errorf("%s: %w", key, err)
		}
		if err := cv.add(key, c); err != nil {
			return rep, err
		}
		var seg []byte
		if c.Segment.Key != "" { // a prune commit has none
			seg, err = v.store.Get(ctx, c.Segment.Key, fence.Range{})
		}
		switch {
		case c.Segment.Key == "":
		case errors.Is(err, fence.ErrNotFound):
			cv.missing = append(cv.missing, c.LSN) // compacted away, or an error found by gone()
		case err != nil:
			return rep, fmt.Errorf("pull volume %s: %w", v.name, err)
		default:
			if err := checkAgainst(c.Segment.Key, seg, c); err != nil {
				return rep, err
			}
			if err := v.writeFile(v.localSegment(c.Segment.Key), seg); err != nil {
				return rep, err
			}
			rep.Segments, rep.Bytes = rep.Segments+1, rep.Bytes+int64(len(seg))
		}
		if err := v.writeCommitFile(c.LSN, obj); err != nil {
			return rep, err
		}
		hashes = append(hashes, c.Hash())
		rep.Commits, rep.Pages = rep.Commits+1, rep.Pages+int64(c.Pages)
	}
	if err := cv.gone(ctx); err != nil {
		return rep, err
	}
	os.Remove(v.localCheckpoint())
	if cks, err := v.store.List(ctx, v.name+"/checkpoints/", "", 1); err == nil && len(cks) == 1 {
		if lsn, ok := checkpointLSN(cks[0]); ok && lsn >= 1 && lsn <= uint64(len(hashes)) {
			if root, err := v.store.Get(ctx, cks[0], fence.Range{}); err == nil {
				if ck, err := decodeCheckpoint(cks[0], root); err == nil && ck.CommitHash == hashes[lsn-1] {
					v.writeFile(v.localCheckpoint(), root)
				}
			}
		}
	}
	v.base, v.tail = nil, nil
	v.cacheMu.Lock()
	clear(v.cache)
	v.cacheMu.Unlock()
	v.leafMu.Lock()
	clear(v.leaves)
	v.leafMu.Unlock()
	return rep, v.loadLocal()
}

// MinGrace is the smallest grace GC accepts unless forced: a reader or a
// writer in flight holds a state for at most this long.
const MinGrace = time.Minute

// ErrGraceTooShort: GC was asked for a grace under MinGrace.
var ErrGraceTooShort = errors.New("gc grace too short")

// GC removes what no state a reader may hold references, once older than
// grace: segments no entry names (a crashed or losing upload leaves them,
// and compaction replaces them), checkpoint roots superseded for longer
// than grace, and the leaves only they named; and such local segment
// files. A state a reader may hold is the current one or that of a
// checkpoint superseded less than grace ago. GC reads the current state
// first and never deletes a segment made for a commit above its head: one
// committed meanwhile, or in flight. It lists the remote in pages (gcPage
// keys) and holds the live segments as 16 bytes each, so a volume of a
// million segments never collected is collected in a few tens of
// megabytes. It returns how many remote objects it deleted.
func (v *Volume) GC(ctx context.Context, grace time.Duration, force bool) (int, error) {
	if grace < MinGrace && !force {
		return 0, fmt.Errorf("gc volume %s: %w: %s is under %s; a commit in flight could lose its segment (force to override)", v.name, ErrGraceTooShort, grace, MinGrace)
	}
	if err := v.Refresh(ctx); err != nil {
		return 0, err
	}
	head := v.Head()
	var live liveSegments
	for c, err := range v.Entries(ctx, nil) {
		if err != nil {
			return 0, fmt.Errorf("gc volume %s: %w", v.name, err)
		}
		live.add(c.Segment.Key)
	}
	for _, c := range v.state().tail {
		live.add(c.Segment.Key) // compaction commits not yet checkpointed
	}
	roots, err := v.keptRoots(ctx, grace)
	if err != nil {
		return 0, err
	}
	for _, ref := range roots.leaves {
		entries, err := v.leaf(ctx, ref)
		if err != nil {
			return 0, fmt.Errorf("gc volume %s: %w", v.name, err)
		}
		for _, e := range entries {
			live.add(e.Segment.Key)
		}
	}
	live.seal()
	garbage := func(key string) bool {
		return segmentLSN(key) <= head && !live.has(key) && time.Since(keyTime(key)) >= grace
	}
	deleted, err := v.deleteListed(ctx, v.name+"/segments/", garbage)
	if err != nil {
		return deleted, err
	}
	n, err := v.gcCheckpoints(ctx, roots, grace)
	deleted += n
	if err != nil {
		return deleted, err
	}
	return deleted, v.gcLocal(garbage)
}

// gcPage is how many keys gc lists at a time.
var gcPage = 50_000

// gcDeletes is how many deletes gc keeps in flight: the first gc of an
// archive that never had one deletes a segment per commit it compacted, a
// million requests for a year of 30-second commits, hours one at a time
// against an object store 20-50 ms away.
const gcDeletes = 16

// deleteListed deletes the keys under prefix that garbage picks, listing
// them a page at a time and deleting gcDeletes at once. The first failed
// delete stops it.
func (v *Volume) deleteListed(ctx context.Context, prefix string, garbage func(key string) bool) (int, error) {
	var deleted atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(gcDeletes)
	for k, err := range v.listed(gctx, prefix) {
		if err != nil {
			if derr := g.Wait(); derr != nil {
				err = derr // a failed delete cancelled the listing
			} else {
				err = fmt.Errorf("gc volume %s: %w", v.name, err)
			}
			return int(deleted.Load()), err
		}
		if !garbage(k) {
			continue
		}
		g.Go(func() error {
			if err := v.store.Delete(gctx, k); err != nil {
				return fmt.Errorf("gc volume %s: %w", v.name, err)
			}
			deleted.Add(1)
			return nil
		})
	}
	err := g.Wait()
	return int(deleted.Load()), err
}

// liveSegments is a set of segment keys held as their LSN and a 64-bit
// hash of the key: 16 bytes a segment. Two keys of one LSN whose hashes
// collide count as one, which can only keep an orphan, never lose a live
// segment.
type liveSegments []liveKey

type liveKey struct{ lsn, hash uint64 }

func liveKeyOf(key string) liveKey { return liveKey{segmentLSN(key), keyHash(key)} }

func (a liveKey) compare(b liveKey) int {
	return cmp.Or(cmp.Compare(a.lsn, b.lsn), cmp.Compare(a.hash, b.hash))
}

func (s *liveSegments) add(key string) { *s = append(*s, liveKeyOf(key)) }

// seal sorts the set; has needs it.
func (s liveSegments) seal() { slices.SortFunc(s, liveKey.compare) }

func (s liveSegments) has(key string) bool {
	_, ok := slices.BinarySearchFunc(s, liveKeyOf(key), liveKey.compare)
	return ok
}

func keyHash(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64()
}

// segmentLSN reads the LSN a segment key <volume>/segments/<lsn>-<ms>-<writer>
// was made for; 0 when it has none.
func segmentLSN(key string) uint64 {
	name := key[strings.LastIndexByte(key, '/')+1:]
	digits, _, _ := strings.Cut(name, "-")
	lsn, _ := strconv.ParseUint(digits, 10, 64)
	return lsn
}

// DropOldCommits deletes the commit objects before the oldest checkpoint a
// reader may hold (as GC counts them, with the same grace), at most limit
// a call (0: 100,000), so a volume of a million commits keeps about as many
// objects as it has live segments. Readers never need those commits (they
// open from a checkpoint); verify then starts the chain at that checkpoint,
// trusting it as its genesis (VerifyReport.ChainStart), and pull refuses
// the volume. It returns how many it deleted.
func (v *Volume) DropOldCommits(ctx context.Context, grace time.Duration, force bool, limit int) (int, error) {
	if grace < MinGrace && !force {
		return 0, fmt.Errorf("drop old commits of volume %s: %w: %s is under %s (force to override)", v.name, ErrGraceTooShort, grace, MinGrace)
	}
	if limit <= 0 {
		limit = 100_000
	}
	k, err := v.keptRoots(ctx, grace)
	if err != nil || len(k.roots) == 0 {
		return 0, err
	}
	oldest, _ := checkpointLSN(k.roots[len(k.roots)-1])
	keys, err := v.store.List(ctx, v.name+"/commits/", "", limit)
	if err != nil {
		return 0, fmt.Errorf("drop old commits of volume %s: %w", v.name, err)
	}
	deleted := 0
	for _, key := range keys {
		lsn, err := strconv.ParseUint(key[strings.LastIndexByte(key, '/')+1:], 10, 64)
		if err != nil || lsn > oldest { // the root holds commit oldest whole
			break
		}
		if err := v.store.Delete(ctx, key); err != nil {
			return deleted, fmt.Errorf("drop old commits of volume %s: %w", v.name, err)
		}
		deleted++
	}
	return deleted, nil
}

// kept is what gc keeps of the checkpoints: the roots a reader may hold
// (newest first), the leaves they name, and the roots to delete.
type kept struct {
	roots, stale []string
	nodes        map[string]bool // leaves and branches the kept roots name
	leaves       []nodeRef
	newest       uint64
}

// keptRoots reads the checkpoint roots newest first, keeping each until
// one older than grace (every root older than that was superseded over
// grace ago).
func (v *Volume) keptRoots(ctx context.Context, grace time.Duration) (kept, error) {
	k := kept{nodes: map[string]bool{}}
	roots, err := v.store.List(ctx, v.name+"/checkpoints/", "", 0) // newest first
	if err != nil {
		return k, fmt.Errorf("gc volume %s: %w", v.name, err)
	}
	for i, key := range roots {
		obj, err := v.store.Get(ctx, key, fence.Range{})
		if err != nil {
			return k, fmt.Errorf("gc volume %s: %w", v.name, err)
		}
		ck, err := decodeCheckpoint(key, obj)
		if err != nil {
			return k, fmt.Errorf("gc volume %s: %w (gc deletes nothing while a checkpoint is unreadable)", v.name, err)
		}
		for _, b := range ck.Branches {
			if k.nodes[b.Key] {
				continue // shared with a newer root: its leaves are listed
			}
			k.nodes[b.Key] = true
			refs, err := v.branch(ctx, b)
			if err != nil {
				return k, fmt.Errorf("gc volume %s: %w (gc deletes nothing while a checkpoint is unreadable)", v.name, err)
			}
			for _, l := range refs {
				if !k.nodes[l.Key] {
					k.nodes[l.Key] = true
					k.leaves = append(k.leaves, l)
				}
			}
		}
		k.roots, k.newest = append(k.roots, key), max(k.newest, ck.LSN)
		if time.Since(ck.Time) >= grace {
			k.stale = roots[i+1:]
			break
		}
	}
	return k, nil
}

// gcCheckpoints deletes the stale roots, then the leaves and branches no
// kept root names, once older than grace (a checkpoint in flight writes its
// nodes before its root).
func (v *Volume) gcCheckpoints(ctx context.Context, k kept, grace time.Duration) (int, error) {
	deleted := 0
	for _, key := range k.stale {
		if err := v.store.Delete(ctx, key); err != nil {
			return deleted, fmt.Errorf("gc volume %s: %w", v.name, err)
		}
		deleted++
	}
	if len(k.roots) == 0 {
		return deleted, nil
	}
	garbage := func(key string) bool { return !k.nodes[key] && time.Since(keyTime(key)) >= grace }
	for _, dir := range []string{"/index/", "/branches/"} {
		n, err := v.deleteListed(ctx, v.name+dir, garbage)
		deleted += n
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

// gcLocal removes the local segment files garbage picks, reading the
// directory in chunks.
func (v *Volume) gcLocal(garbage func(key string) bool) error {
	dir := filepath.Join(v.dir, "segments")
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		files, err := f.ReadDir(1024)
		for _, file := range files {
			if garbage(v.name + "/segments/" + file.Name()) {
				os.Remove(filepath.Join(dir, file.Name()))
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// keyTime reads the creation time from a segment key
// <volume>/segments/<lsn>-<unix ms>-<writer> or an index node key
// <volume>/index/<lsn>-<unix ms>-<sha256>; an unreadable key is old.
func keyTime(key string) time.Time {
	parts := strings.Split(filepath.Base(key), "-")
	if len(parts) != 3 {
		return time.Time{}
	}
	ms, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
