package graft

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"maps"
	"os"
	"slices"

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
	// Unchained counts the commits below ChainStart a drop left: those a
	// drop that did not finish left behind (the next drop deletes them) and
	// packed commits whose segment is still live (deleted once compaction
	// replaced it). Not checked as commits.
	Unchained int `json:"unchained,omitempty"`
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
	plan, err := v.planChain(ctx)
	if err != nil {
		return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
	}
	ckAt, newestCk, start := plan.ckAt, plan.newestCk, plan.start
	cv := chainVerifier{v: v, recent: map[uint64]Entry{}}
	if start > 0 {
		ck, err := cv.seed(ctx, ckAt[start])
		if err != nil {
			return rep, err
		}
		if err := cv.checkSeeded(ctx, ckAt[start], ck, &rep); err != nil {
			return rep, err
		}
	}
	chain := plan.scan.above(start)
	rep.ChainStart, rep.Unchained = start, plan.scan.keys-chain
	listed := maps.Clone(ckAt)
	for lsn := range ckAt {
		if lsn <= start && start > 0 { // the chain's genesis, and roots before it: nothing to check them against
			delete(ckAt, lsn)
		}
	}
	head, err := cv.walk(ctx, "verify", start, chain, &rep, func(f verified) error {
		if err := cv.checkSegment(ctx, "commit "+f.key, f.c, f, &rep); err != nil {
			return err
		}
		if ck, ok := ckAt[f.c.LSN]; ok {
			// Every checkpoint's commit and totals; the newest one's entries too.
			if err := cv.checkpoint(ctx, ck, f.c.LSN == newestCk); err != nil {
				return badIndex(err)
			}
			delete(ckAt, f.c.LSN)
			rep.Checkpoints++
		}
		return nil
	})
	if err != nil {
		return rep, err
	}
	// The checkpoint the newest commit builds on is the one readers open
	// from; gone (and none newer), they fall back to the chain in silence.
	// Name it here.
	if head != nil && head.Base > start && newestCk < head.Base {
		if _, ok := listed[head.Base]; !ok {
			return rep, badIndex(fmt.Errorf("checkpoint %s: %w: the newest commit %d builds on checkpoint %d, which the remote does not hold (readers fall back to the commit chain)",
				v.checkpointKey(head.Base), ErrCorrupt, head.LSN, head.Base))
		}
	}
	for lsn, k := range ckAt {
		return rep, badIndex(fmt.Errorf("checkpoint %s: %w: at LSN %d, beyond the chain's last commit %d", k, ErrCorrupt, lsn, start+uint64(chain)))
	}
	rep.Entries = len(cv.entries)
	return rep, cv.gone(ctx)
}

// walk follows the chain's chain commits above start, fetched ahead: each
// is checked as the next link and added to the verifier's entries before
// visit sees it (its segment fetched, missing, or left for a ranged read),
// then counted in rep. It returns the last commit. verify and pull share
// it; op names which in errors.
func (cv *chainVerifier) walk(ctx context.Context, op string, start uint64, chain int, rep *VerifyReport, visit func(verified) error) (*Commit, error) {
	v := cv.v
	var head *Commit
	i := 0
	for f, err := range fetchAhead(ctx, v.chainKeys(ctx, start+1, chain), ahead{n: verifyAhead}, nil, v.fetchVerified) {
		if err != nil {
			return head, fmt.Errorf("%s volume %s: %w", op, v.name, err)
		}
		i++
		if f.bad != nil {
			return head, f.bad
		}
		if err := checkLink(v.name, f.c, start+uint64(i), cv.prev); err != nil {
			return head, fmt.Errorf("%s: %w", f.key, err)
		}
		if err := cv.add(f.key, f.c); err != nil {
			return head, err
		}
		if err := visit(f); err != nil {
			return head, err
		}
		rep.Commits, rep.Pages = rep.Commits+1, rep.Pages+int64(f.c.Pages)
		head = f.c
	}
	return head, nil
}

// checkSegment checks the segment f holds for c, or reads it by ranges
// (errRanged), and counts it. A missing one is noted: fine if a compaction
// or a prune replaced it, which gone checks at the end. what names the
// commit or entry for errors.
func (cv *chainVerifier) checkSegment(ctx context.Context, what string, c *Commit, f verified, rep *VerifyReport) error {
	checked, err := f.seg != nil, f.segErr
	if errors.Is(err, errRanged) {
		checked, err = true, cv.v.checkRanges(ctx, c, nil)
	} else if checked {
		err = checkAgainst(c.Segment.Key, f.seg, c)
	}
	switch {
	case c.Segment.Key == "": // a prune commit has none
	case errors.Is(err, fence.ErrNotFound):
		cv.missing = append(cv.missing, c.LSN)
		rep.Collected++
	case errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNewerFormat):
		return err
	case err != nil:
		return fmt.Errorf("verify volume %s: %s: %w", cv.v.name, what, err)
	case checked:
		rep.Segments, rep.Bytes = rep.Segments+1, rep.Bytes+c.Segment.Size
	}
	return nil
}

// checkSeeded checks the segments of the entries of checkpoint ck (at
// key), where the chain starts after a drop: no commit the chain walks
// names them (packed commits below the start whose segments are live,
// merged segments of compactions dropped), 8 fetched ahead as the chain's
// are.
func (cv *chainVerifier) checkSeeded(ctx context.Context, key string, ck *checkpoint, rep *VerifyReport) error {
	from := len(cv.missing)
	for f, err := range cv.v.seededSegments(ctx, key, ck) {
		if err != nil {
			return fmt.Errorf("verify volume %s: %w", cv.v.name, err)
		}
		if err := cv.checkSegment(ctx, fmt.Sprintf("entry %d of checkpoint %s", f.c.LSN, key), f.c, f, rep); err != nil {
			return err
		}
	}
	slices.Sort(cv.missing[from:]) // gone looks them up; the chain's come after, in order
	return nil
}

// seededSegments fetches the segments of the entries of checkpoint ck (at
// key), 8 ahead, as the chain's are: small ones whole, larger ones left to
// be read by ranges (errRanged).
func (v *Volume) seededSegments(ctx context.Context, key string, ck *checkpoint) iter.Seq2[verified, error] {
	entries := func(yield func(*Commit, error) bool) {
		for ref, err := range v.leafRefs(ctx, ck, nil) {
			var leaf []Entry
			if err == nil {
				leaf, err = v.leaf(ctx, ref)
			}
			if err != nil {
				yield(nil, fmt.Errorf("checkpoint %s: %w", key, err))
				return
			}
			for _, e := range leaf {
				if !yield(e.commit(v.name), nil) {
					return
				}
			}
		}
	}
	fetch := func(ctx context.Context, c *Commit) (verified, error) {
		f := verified{key: c.Segment.Key, c: c}
		f.seg, f.segErr = v.fetchSegment(ctx, c)
		return f, nil
	}
	return fetchAhead(ctx, entries, ahead{n: verifyAhead}, nil, fetch)
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

// seed starts the verifier at the checkpoint at key: its commit and its
// entries, checked against its totals. It returns the checkpoint.
func (cv *chainVerifier) seed(ctx context.Context, key string) (*checkpoint, error) {
	v := cv.v
	root, err := v.store.Get(ctx, key, fence.Range{})
	if err != nil {
		return nil, fmt.Errorf("verify volume %s: %w", v.name, err)
	}
	ck, err := decodeCheckpoint(key, root)
	if err != nil {
		return nil, err
	}
	cv.prev, cv.mono = ck.CommitHash, ck.Monotonic
	for ref, err := range v.leafRefs(ctx, ck, nil) {
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", key, err)
		}
		entries, err := v.leaf(ctx, ref)
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", key, err)
		}
		for _, e := range entries {
			cv.entries, cv.bytes, cv.top = append(cv.entries, derive(e)), cv.bytes+e.Segment.Size, max(cv.top, e.hi())
		}
	}
	if uint64(len(cv.entries)) != ck.Entries || cv.bytes != ck.Bytes {
		return nil, fmt.Errorf("checkpoint %s: %w: its nodes hold %d entries of %d bytes, it says %d of %d", key, ErrCorrupt, len(cv.entries), cv.bytes, ck.Entries, ck.Bytes)
	}
	return ck, nil
}

// gone checks, at the end of the chain, that every segment found missing
// belongs to an entry a compaction replaced: none of the live ones.
func (cv *chainVerifier) gone(ctx context.Context) error {
	for _, d := range cv.entries {
		if _, missing := slices.BinarySearch(cv.missing, d.lsn); !missing {
			continue
		}
		key := cv.v.commitKey(d.lsn) // read again to name the segment: only on this error
		if c, err := cv.v.getCommit(ctx, d.lsn); err == nil {
			key = c.Segment.Key
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
	return matchRanges(name, seg.index, c)
}

// matchRanges checks that a segment's index holds exactly the pages of its
// commit's ranges.
func matchRanges(name string, index []indexEntry, c *Commit) error {
	i := 0
	for _, r := range c.Ranges {
		for no := r.Lo; ; no++ {
			if i >= len(index) || index[i].No != no {
				return fmt.Errorf("segment %s: %w: pages differ from commit %d's ranges at page %d", name, ErrCorrupt, c.LSN, no)
			}
			i++
			if no == r.Hi {
				break
			}
		}
	}
	if i != len(index) {
		return fmt.Errorf("segment %s: %w: %d pages beyond commit %d's ranges", name, ErrCorrupt, len(index)-i, c.LSN)
	}
	return nil
}
