package graft

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/silt-dev/silt/pkg/fence"
)

// VerifyReport says what Verify checked.
type VerifyReport struct {
	Commits     int   `json:"commits"`
	Segments    int   `json:"segments"`
	Pages       int64 `json:"pages"`
	Bytes       int64 `json:"bytes"`
	Checkpoints int   `json:"checkpoints"`
}

// VerifyRemote checks the remote copy: every commit object's checksum, the
// hash chain and LSN sequence, every commit's tail against the commits it
// names, every segment's SHA-256, page checksums and page ranges against
// its commit, and every checkpoint against the chain (its commit, and each
// leaf recomputed from the chain's entries). The error names the first bad
// object; missing commits are named all at once.
func (v *Volume) VerifyRemote(ctx context.Context) (VerifyReport, error) {
	var rep VerifyReport
	keys, err := v.store.List(ctx, v.name+"/commits/", "", 0)
	if err != nil {
		return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
	}
	if missing := missingCommits(keys, v.name); len(missing) > 0 {
		return rep, fmt.Errorf("verify volume %s: %w: %s", v.name, ErrMissingCommits, strings.Join(missing, ", "))
	}
	cks, err := v.store.List(ctx, v.name+"/checkpoints/", "", 0)
	if err != nil {
		return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
	}
	ckAt := map[uint64]string{}
	for _, k := range cks {
		if lsn, ok := checkpointLSN(k); ok {
			ckAt[lsn] = k
		}
	}
	cv := chainVerifier{v: v, recent: map[uint64]Entry{}}
	for i, key := range keys {
		b, err := v.store.Get(ctx, key, fence.Range{})
		if err != nil {
			return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
		}
		c, err := DecodeCommit(key, b)
		if err != nil {
			return rep, err
		}
		if err := chained(key, c, uint64(i)+1, cv.prev); err != nil {
			return rep, err
		}
		if err := cv.add(key, c); err != nil {
			return rep, err
		}
		seg, err := v.store.Get(ctx, c.Segment.Key, fence.Range{})
		if err != nil {
			return rep, fmt.Errorf("verify volume %s: commit %s: %w", v.name, key, err)
		}
		if err := checkAgainst(c.Segment.Key, seg, c); err != nil {
			return rep, err
		}
		if ck, ok := ckAt[c.LSN]; ok {
			if err := cv.checkpoint(ctx, ck); err != nil {
				return rep, err
			}
			delete(ckAt, c.LSN)
			rep.Checkpoints++
		}
		rep.Commits, rep.Segments, rep.Pages, rep.Bytes = rep.Commits+1, rep.Segments+1, rep.Pages+int64(c.Pages), rep.Bytes+int64(len(seg))
	}
	for lsn, k := range ckAt {
		return rep, fmt.Errorf("checkpoint %s: %w: at LSN %d, beyond the chain's %d commits", k, ErrCorrupt, lsn, len(keys))
	}
	return rep, nil
}

// chainVerifier follows the chain in order, holding the entries of the
// leaf being filled and recent entries for tails, never the whole history.
type chainVerifier struct {
	v       *Volume
	prev    string
	leaves  []leafRef // full leaves, recomputed from the chain
	partial []Entry
	entries uint64
	bytes   int64
	mono    bool
	top     uint64
	recent  map[uint64]Entry // entries of recent commits, for their successors' tails
}

func (cv *chainVerifier) add(key string, c *Commit) error {
	for _, t := range c.Tail {
		if e, ok := cv.recent[t.LSN]; ok && !sameEntry(e, t) {
			return fmt.Errorf("commit %s: %w: its tail entry for LSN %d differs from commit %d", key, ErrCorrupt, t.LSN, t.LSN)
		}
	}
	e := entryOf(c, cv.v.KeepMeta)
	if cv.entries == 0 {
		cv.mono = true
	} else if e.lo() <= cv.top {
		cv.mono = false
	}
	cv.top = max(cv.top, e.hi())
	cv.partial = append(cv.partial, e)
	cv.entries, cv.bytes, cv.prev = cv.entries+1, cv.bytes+c.Segment.Size, c.Hash()
	if len(cv.partial) == leafSize {
		ref, err := cv.ref(cv.partial)
		if err != nil {
			return err
		}
		cv.leaves, cv.partial = append(cv.leaves, ref), nil
	}
	cv.recent[c.LSN] = e
	delete(cv.recent, c.LSN-uint64(8*max(cv.v.CheckpointEvery, CheckpointEvery)))
	return nil
}

func (cv *chainVerifier) ref(entries []Entry) (leafRef, error) {
	obj, err := encodeLeaf(entries)
	if err != nil {
		return leafRef{}, err
	}
	return leafRef{Key: cv.v.leafKey(entries[len(entries)-1].LSN, obj), Entries: len(entries)}, nil
}

// checkpoint checks the checkpoint at the commit just added.
func (cv *chainVerifier) checkpoint(ctx context.Context, key string) error {
	root, err := cv.v.store.Get(ctx, key, fence.Range{})
	if err != nil {
		return fmt.Errorf("verify volume %s: %w", cv.v.name, err)
	}
	ck, err := decodeCheckpoint(key, root)
	if err != nil {
		return err
	}
	want := slices.Clone(cv.leaves)
	if len(cv.partial) > 0 {
		ref, err := cv.ref(cv.partial)
		if err != nil {
			return err
		}
		want = append(want, ref)
	}
	switch {
	case ck.CommitHash != cv.prev:
		return fmt.Errorf("checkpoint %s: %w: names commit %.12s, the chain has %.12s at LSN %d", key, ErrCorrupt, ck.CommitHash, cv.prev, ck.LSN)
	case ck.Entries != cv.entries || ck.Bytes != cv.bytes || ck.Monotonic != cv.mono:
		return fmt.Errorf("checkpoint %s: %w: %d entries of %d bytes (monotonic %t), the chain has %d of %d (%t)",
			key, ErrCorrupt, ck.Entries, ck.Bytes, ck.Monotonic, cv.entries, cv.bytes, cv.mono)
	case len(ck.Leaves) != len(want):
		return fmt.Errorf("checkpoint %s: %w: %d leaves, the chain makes %d", key, ErrCorrupt, len(ck.Leaves), len(want))
	}
	for i, l := range ck.Leaves {
		if l.Key != want[i].Key || l.Entries != want[i].Entries {
			return fmt.Errorf("checkpoint %s: %w: leaf %d is %s, the chain makes %s", key, ErrCorrupt, i, l.Key, want[i].Key)
		}
		obj, err := cv.v.store.Get(ctx, l.Key, fence.Range{})
		if err != nil {
			return fmt.Errorf("checkpoint %s: leaf %d: %w", key, i, err)
		}
		if _, err := cv.v.decodeLeaf(l, obj); err != nil {
			return err
		}
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
		if err := chained(path, lc, c.LSN, prev); err != nil {
			return rep, err
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

func chained(name string, c *Commit, lsn uint64, prev string) error {
	switch {
	case c.LSN != lsn:
		return fmt.Errorf("commit %s: %w: LSN %d where %d was expected", name, ErrCorrupt, c.LSN, lsn)
	case c.Prev != prev:
		return fmt.Errorf("commit %s: %w: hash chain broken (prev %.12s, want %.12s)", name, ErrCorrupt, c.Prev, prev)
	}
	return nil
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
	if missing := missingCommits(keys, v.name); len(missing) > 0 {
		return rep, fmt.Errorf("pull volume %s: %w: %s", v.name, ErrMissingCommits, strings.Join(missing, ", "))
	}
	hashes := make([]string, 0, len(keys))
	prev := ""
	for i, key := range keys {
		c, obj, seg, err := v.fetchPair(ctx, key, uint64(i)+1, prev)
		if err != nil {
			return rep, err
		}
		if err := v.writeFile(v.localSegment(c.Segment.Key), seg); err != nil {
			return rep, err
		}
		if err := v.writeFile(v.localCommit(c.LSN), obj); err != nil {
			return rep, err
		}
		prev = c.Hash()
		hashes = append(hashes, prev)
		rep.Commits, rep.Segments, rep.Pages, rep.Bytes = rep.Commits+1, rep.Segments+1, rep.Pages+int64(c.Pages), rep.Bytes+int64(len(seg))
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
	clear(v.cache)
	clear(v.leaves)
	return rep, v.loadLocal()
}

// fetchPair fetches and checks one remote commit and its segment.
func (v *Volume) fetchPair(ctx context.Context, key string, lsn uint64, prev string) (c *Commit, obj, seg []byte, err error) {
	if obj, err = v.store.Get(ctx, key, fence.Range{}); err != nil {
		return nil, nil, nil, fmt.Errorf("pull volume %s: %w", v.name, err)
	}
	if c, err = DecodeCommit(key, obj); err != nil {
		return nil, nil, nil, err
	}
	if err := chained(key, c, lsn, prev); err != nil {
		return nil, nil, nil, err
	}
	if seg, err = v.store.Get(ctx, c.Segment.Key, fence.Range{}); err != nil {
		return nil, nil, nil, fmt.Errorf("pull volume %s: %w", v.name, err)
	}
	return c, obj, seg, checkAgainst(c.Segment.Key, seg, c)
}

// MinGrace is the smallest grace GC accepts unless forced: a reader or a
// writer in flight holds a state for at most this long.
const MinGrace = time.Minute

// ErrGraceTooShort: GC was asked for a grace under MinGrace.
var ErrGraceTooShort = errors.New("gc grace too short")

// GC removes what no live state references, once older than grace:
// segments no entry names (a crashed or losing upload leaves them),
// checkpoint roots superseded for longer than grace, and the leaves only
// they named; and such local segment files. It lists the segments before
// it reads the state, so a segment committed meanwhile is referenced by
// the state it reads. It returns how many remote objects it deleted.
func (v *Volume) GC(ctx context.Context, grace time.Duration, force bool) (int, error) {
	if grace < MinGrace && !force {
		return 0, fmt.Errorf("gc volume %s: %w: %s is under %s; a commit in flight could lose its segment (force to override)", v.name, ErrGraceTooShort, grace, MinGrace)
	}
	keys, err := v.store.List(ctx, v.name+"/segments/", "", 0)
	if err != nil {
		return 0, fmt.Errorf("gc volume %s: %w", v.name, err)
	}
	if err := v.Refresh(ctx); err != nil {
		return 0, err
	}
	referenced := map[string]bool{}
	for c, err := range v.Entries(ctx, nil) {
		if err != nil {
			return 0, fmt.Errorf("gc volume %s: %w", v.name, err)
		}
		referenced[c.Segment.Key] = true
	}
	deleted := 0
	for _, k := range keys {
		if referenced[k] || time.Since(segmentTime(k)) < grace {
			continue
		}
		if err := v.store.Delete(ctx, k); err != nil {
			return deleted, fmt.Errorf("gc volume %s: %w", v.name, err)
		}
		deleted++
	}
	n, err := v.gcCheckpoints(ctx, grace)
	deleted += n
	if err != nil {
		return deleted, err
	}
	return deleted, v.gcLocal(referenced, grace)
}

// gcCheckpoints deletes the checkpoint roots whose successor is older than
// grace (a reader that opened one has had grace to finish), then the leaves
// no kept root names and no checkpoint in flight can (their last LSN is at
// or below the newest kept root's).
func (v *Volume) gcCheckpoints(ctx context.Context, grace time.Duration) (int, error) {
	roots, err := v.store.List(ctx, v.name+"/checkpoints/", "", 0) // newest first
	if err != nil || len(roots) == 0 {
		return 0, err
	}
	keep := map[string]bool{}
	var newest uint64
	cut := len(roots)
	for i, key := range roots {
		obj, err := v.store.Get(ctx, key, fence.Range{})
		if err != nil {
			return 0, fmt.Errorf("gc volume %s: %w", v.name, err)
		}
		ck, err := decodeCheckpoint(key, obj)
		if err != nil {
			return 0, fmt.Errorf("gc volume %s: %w (leaving checkpoints alone)", v.name, err)
		}
		for _, l := range ck.Leaves {
			keep[l.Key] = true
		}
		newest = max(newest, ck.LSN)
		if time.Since(ck.Time) >= grace {
			cut = i + 1 // older roots were superseded by this one over grace ago
			break
		}
	}
	deleted := 0
	for _, key := range roots[cut:] {
		if err := v.store.Delete(ctx, key); err != nil {
			return deleted, fmt.Errorf("gc volume %s: %w", v.name, err)
		}
		deleted++
	}
	leaves, err := v.store.List(ctx, v.name+"/index/", "", 0)
	if err != nil {
		return deleted, fmt.Errorf("gc volume %s: %w", v.name, err)
	}
	for _, key := range leaves {
		last, err := strconv.ParseUint(strings.SplitN(filepath.Base(key), "-", 2)[0], 10, 64)
		if keep[key] || err != nil || last > newest {
			continue
		}
		if err := v.store.Delete(ctx, key); err != nil {
			return deleted, fmt.Errorf("gc volume %s: %w", v.name, err)
		}
		deleted++
	}
	return deleted, nil
}

func (v *Volume) gcLocal(referenced map[string]bool, grace time.Duration) error {
	files, err := os.ReadDir(filepath.Join(v.dir, "segments"))
	if err != nil {
		return err
	}
	for _, f := range files {
		key := v.name + "/segments/" + f.Name()
		if !referenced[key] && time.Since(segmentTime(key)) >= grace {
			os.Remove(filepath.Join(v.dir, "segments", f.Name()))
		}
	}
	return nil
}

// segmentTime reads the creation time from a segment key
// <volume>/segments/<lsn>-<unix ms>-<writer>; an unreadable key is old.
func segmentTime(key string) time.Time {
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
