package graft

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/fence"
)

// Checkpoints (docs/architecture.md, "Deep history"): every CheckpointEvery
// commits a writer publishes the volume's entries as of a commit, so an
// open reads one checkpoint and the newest commit instead of the history.
const (
	// CheckpointEvery is the default checkpoint interval K in commits.
	CheckpointEvery  = 16
	checkpointFormat = 2 // 2: entries may name packed commits (an older build would misread their segments)
	leafCacheSize    = 16
)

// leafSize is how many entries a leaf holds and branchSize how many leaf
// refs a branch holds; full ones are shared by every later checkpoint, so a
// checkpoint rewrites one leaf, one branch and the root. (Variables so a
// test can build deep indexes from few commits.)
var leafSize, branchSize = 128, 128

// Entry is one live segment of a volume's state: the commit that wrote it,
// slimmed to what reads and maintenance need. Commits carry the entries of
// the commits since their base checkpoint (Commit.Tail); checkpoint leaves
// carry all of them.
type Entry struct {
	LSN     uint64            `json:"lsn"`
	Hash    string            `json:"hash"`
	Prev    string            `json:"prev"`
	Segment SegmentRef        `json:"segment"`
	Ranges  []PageRange       `json:"ranges"`
	Pages   uint64            `json:"pages"`
	Time    time.Time         `json:"time"`
	Meta    map[string]string `json:"meta,omitempty"`
	// Replaces: the entry is a compaction's (Commit.Replaces).
	Replaces *PageRange `json:"replaces,omitempty"`
	// PruneBelow: a prune commit's (in tails only; never a live entry).
	PruneBelow uint64 `json:"prune_below,omitempty"`
}

// entryOf returns c's entry, keeping only the metadata keys in keep (nil: all).
func entryOf(c *Commit, keep []string) Entry {
	e := Entry{LSN: c.LSN, Hash: c.Hash(), Prev: c.Prev, Segment: c.Segment, Ranges: c.Ranges, Pages: c.Pages, Time: c.Time,
		Replaces: c.Replaces, PruneBelow: c.PruneBelow}
	meta := c.Meta
	if c.Replaces != nil {
		meta = c.EntryMeta
	}
	if keep == nil {
		e.Meta = meta
		return e
	}
	for _, k := range keep {
		if val, ok := meta[k]; ok {
			if e.Meta == nil {
				e.Meta = map[string]string{}
			}
			e.Meta[k] = val
		}
	}
	return e
}

// commit returns the slim commit an entry stands for.
func (e Entry) commit(volume string) *Commit {
	c := &Commit{Version: plainVersion, Volume: volume, LSN: e.LSN, Prev: e.Prev, Segment: e.Segment,
		Ranges: e.Ranges, Pages: e.Pages, Meta: e.Meta, Time: e.Time, Replaces: e.Replaces, PruneBelow: e.PruneBelow, hash: e.Hash}
	switch {
	case e.Replaces != nil || e.PruneBelow > 0:
		c.Version, c.EntryMeta = compactionVersion, e.Meta
	case e.Segment.Offset > 0:
		c.Version = packedVersion
	}
	return c
}

// lo and hi are the entry's page span (0, 0 for a commit of no pages).
func (e Entry) lo() uint64 {
	if len(e.Ranges) == 0 {
		return 0
	}
	return e.Ranges[0].Lo
}

func (e Entry) hi() uint64 {
	if len(e.Ranges) == 0 {
		return 0
	}
	return e.Ranges[len(e.Ranges)-1].Hi
}

// checkTail checks that a commit's tail holds exactly the commits from its
// base to it, each chained to the one before, and returns the hash the
// first must chain to: the base commit's.
func checkTail(c *Commit) (baseHash string, err error) {
	if c.Base >= c.LSN || uint64(len(c.Tail)) != c.LSN-c.Base-1 {
		return "", fmt.Errorf("%w: commit %d: tail of %d entries from base %d", ErrCorrupt, c.LSN, len(c.Tail), c.Base)
	}
	prev := c.Prev
	for i := len(c.Tail) - 1; i >= 0; i-- {
		e := c.Tail[i]
		if e.LSN != c.Base+1+uint64(i) || e.Hash != prev || e.Hash == "" {
			return "", fmt.Errorf("%w: commit %d: tail entry %d (LSN %d) does not chain", ErrCorrupt, c.LSN, i, e.LSN)
		}
		prev = e.Prev
	}
	return prev, nil
}

// nodeRef names one leaf (of entries) or one branch (of leaf refs) and
// summarises it, so a search picks the node it needs without fetching the
// others.
type nodeRef struct {
	Key      string            `json:"key"`
	Size     int64             `json:"size"`
	Children int               `json:"children"` // entries of a leaf, leaf refs of a branch
	Entries  int               `json:"entries"`
	Lo       uint64            `json:"lo"` // page span of the entries
	Hi       uint64            `json:"hi"`
	FirstLSN uint64            `json:"first_lsn"`
	LastLSN  uint64            `json:"last_lsn"`
	Bytes    int64             `json:"bytes"`          // sum of the entries' segment sizes
	Last     map[string]string `json:"last,omitempty"` // kept metadata of the last entry
}

// checkpoint is a checkpoint root: the commit at LSN and the leaves that
// hold the entries of the volume as of that commit, in order.
type checkpoint struct {
	Version    int       `json:"version"`
	Volume     string    `json:"volume"`
	LSN        uint64    `json:"lsn"`
	CommitHash string    `json:"commit_hash"`
	Commit     string    `json:"commit"` // the commit object at LSN, byte for byte
	Monotonic  bool      `json:"monotonic"`
	Entries    uint64    `json:"entries"`
	Bytes      int64     `json:"bytes"` // sum of the entries' segment sizes
	Branches   []nodeRef `json:"branches"`
	Time       time.Time `json:"time"`

	commit *Commit
	hash   string // SHA-256 of the encoded root
}

// checkpointKey sorts the newest checkpoint first: a LIST of one key finds it.
func (v *Volume) checkpointKey(lsn uint64) string {
	return v.name + "/checkpoints/" + fmt.Sprintf("%020d", math.MaxUint64-lsn)
}

func checkpointLSN(key string) (uint64, bool) {
	n, err := strconv.ParseUint(key[strings.LastIndexByte(key, '/')+1:], 10, 64)
	return math.MaxUint64 - n, err == nil
}

// nodeKey names a node: the LSN of the checkpoint writing it and the time
// (gc keeps a node younger than its grace: a checkpoint in flight may be
// about to name it), then its SHA-256. Leaves are under index/, branches
// under branches/.
func (v *Volume) nodeKey(dir string, lsn uint64, obj []byte) string {
	sum := sha256.Sum256(obj)
	return fmt.Sprintf("%s/%s/%s-%013d-%s", v.name, dir, lsnName(lsn), time.Now().UnixMilli(), hex.EncodeToString(sum[:]))
}

// sealed encodes a JSON value as one line followed by "sha256 <hex>".
func sealed(x any) ([]byte, error) {
	body, err := json.Marshal(x)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	return fmt.Appendf(body, "\nsha256 %s\n", hex.EncodeToString(sum[:])), nil
}

// unseal checks and decodes an object written by sealed.
func unseal(name string, obj []byte, x any) error {
	body, trailer, ok := bytes.Cut(obj, []byte("\n"))
	sum := sha256.Sum256(body)
	if !ok || string(trailer) != "sha256 "+hex.EncodeToString(sum[:])+"\n" {
		return fmt.Errorf("%s: %w: checksum mismatch", name, ErrCorrupt)
	}
	if err := json.Unmarshal(body, x); err != nil {
		return fmt.Errorf("%s: %w: %v", name, ErrCorrupt, err)
	}
	return nil
}

// decodeNode checks a leaf or branch object against its ref (key, count)
// and decodes its children into out.
func (v *Volume) decodeNode(dir string, ref nodeRef, obj []byte, out any, count func() (children, entries int)) error {
	sum := sha256.Sum256(obj)
	if !strings.HasPrefix(ref.Key, v.name+"/"+dir+"/") || !strings.HasSuffix(ref.Key, "-"+hex.EncodeToString(sum[:])) {
		return fmt.Errorf("checkpoint node %s: %w: content does not match its key (repair: archiver reindex)", ref.Key, ErrCorrupt)
	}
	if err := unseal("checkpoint node "+ref.Key, obj, out); err != nil {
		return err
	}
	if children, entries := count(); children != ref.Children || entries != ref.Entries || children == 0 {
		return fmt.Errorf("checkpoint node %s: %w: holds %d children and %d entries, its parent says %d and %d", ref.Key, ErrCorrupt, children, entries, ref.Children, ref.Entries)
	}
	return nil
}

func decodeCheckpoint(name string, obj []byte) (*checkpoint, error) {
	ck := new(checkpoint)
	body, _, _ := bytes.Cut(obj, []byte("\n"))
	var peek struct{ Version int }
	if json.Unmarshal(body, &peek) == nil && peek.Version > checkpointFormat {
		return nil, fmt.Errorf("checkpoint %s: %w: version %d, this build reads up to %d", name, ErrNewerFormat, peek.Version, checkpointFormat)
	}
	if err := unseal("checkpoint "+name, obj, ck); err != nil {
		return nil, err
	}
	c, err := DecodeCommit(name+" (its commit)", []byte(ck.Commit))
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	if c.Hash() != ck.CommitHash || c.LSN != ck.LSN {
		return nil, fmt.Errorf("checkpoint %s: %w: its commit is not commit %d %.12s", name, ErrCorrupt, ck.LSN, ck.CommitHash)
	}
	var n uint64
	for _, b := range ck.Branches {
		n += uint64(b.Entries)
	}
	if n != ck.Entries {
		return nil, fmt.Errorf("checkpoint %s: %w: branches hold %d entries, it says %d", name, ErrCorrupt, n, ck.Entries)
	}
	sum := sha256.Sum256(obj)
	ck.commit, ck.hash = c, hex.EncodeToString(sum[:])
	return ck, nil
}

// leaf returns the entries of one leaf.
func (v *Volume) leaf(ctx context.Context, ref nodeRef) ([]Entry, error) {
	if cached, ok := v.cachedNode(ref.Key).([]Entry); ok {
		return cached, nil
	}
	var entries []Entry
	err := v.node(ctx, "index", ref, &entries, func() (int, int) { return len(entries), len(entries) })
	if err == nil {
		v.cacheNode(ref.Key, entries)
	}
	return entries, err
}

// branch returns the leaf refs of one branch.
func (v *Volume) branch(ctx context.Context, ref nodeRef) ([]nodeRef, error) {
	if cached, ok := v.cachedNode(ref.Key).([]nodeRef); ok {
		return cached, nil
	}
	var leaves []nodeRef
	err := v.node(ctx, "branches", ref, &leaves, func() (int, int) {
		n := 0
		for _, l := range leaves {
			n += l.Entries
		}
		return len(leaves), n
	})
	if err == nil {
		v.cacheNode(ref.Key, leaves)
	}
	return leaves, err
}

// cachedNode returns a decoded node checked when it was loaded (nil: not
// cached). Callers must not change it.
func (v *Volume) cachedNode(key string) any {
	v.leafMu.Lock()
	defer v.leafMu.Unlock()
	return v.leaves[key]
}

func (v *Volume) cacheNode(key string, node any) {
	v.leafMu.Lock()
	defer v.leafMu.Unlock()
	if len(v.leaves) >= leafCacheSize {
		clear(v.leaves)
	}
	v.leaves[key] = node
}

// node reads a leaf or a branch from the local cache or the remote, checked
// against its key, and decodes it into out.
func (v *Volume) node(ctx context.Context, dir string, ref nodeRef, out any, count func() (int, int)) error {
	path := filepath.Join(v.dir, "index", filepath.Base(ref.Key))
	obj, err := readFile(path)
	if err != nil {
		if obj, err = v.store.Get(ctx, ref.Key, fence.Range{}); err != nil {
			return fmt.Errorf("volume %s: checkpoint node: %w", v.name, err)
		}
		defer v.writeCache(path, obj)
	}
	return v.decodeNode(dir, ref, obj, out, count)
}

// checkpointDue reports whether the head commit leaves a tail of K or more.
func (v *Volume) checkpointDue() bool {
	every := v.CheckpointEvery
	if every == 0 {
		every = CheckpointEvery
	}
	return every > 0 && len(v.tail) >= every
}

// Checkpoint publishes a checkpoint at the head commit when the commits
// since the last one reach CheckpointEvery (force: whenever there are any).
// Commit calls it; an archive run calls it once at start, so a volume
// written before checkpoints existed gets one. It returns the checkpoint's
// LSN, 0 when none was due.
func (v *Volume) Checkpoint(ctx context.Context, force bool) (uint64, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.tail) == 0 || !force && !v.checkpointDue() {
		return 0, nil
	}
	return v.checkpoint(ctx)
}

// checkpoint writes the leaves and branches, then the root, create-only:
// the base checkpoint's index with the tail applied (buildIndex).
func (v *Volume) checkpoint(ctx context.Context) (uint64, error) {
	head := v.tail[len(v.tail)-1]
	ck := &checkpoint{Version: checkpointFormat, Volume: v.name, LSN: head.LSN, CommitHash: head.Hash(), Time: time.Now().UTC()}
	var err error
	if ck.Branches, ck.Monotonic, err = v.buildIndex(ctx, v.base, v.tail); err != nil {
		return 0, fmt.Errorf("checkpoint %d of volume %s: %w", ck.LSN, v.name, err)
	}
	for _, b := range ck.Branches {
		ck.Entries, ck.Bytes = ck.Entries+uint64(b.Entries), ck.Bytes+b.Bytes
	}
	obj, err := v.commitObject(head)
	if err != nil {
		return 0, err
	}
	ck.Commit = string(obj)
	root, err := sealed(ck)
	if err != nil {
		return 0, err
	}
	v.failpoint(failpoint.CheckpointLeaves)
	key := v.checkpointKey(ck.LSN)
	if err := v.store.Create(ctx, key, root); errors.Is(err, fence.ErrExists) {
		// Another writer checkpointed this commit: use theirs if it is the same commit.
		if root, err = v.store.Get(ctx, key, fence.Range{}); err != nil {
			return 0, fmt.Errorf("checkpoint %d of volume %s: %w", ck.LSN, v.name, err)
		}
	} else if err != nil {
		return 0, fmt.Errorf("checkpoint %d of volume %s: %w", ck.LSN, v.name, err)
	}
	v.failpoint(failpoint.CheckpointPut)
	return ck.LSN, v.adoptCheckpoint(key, root, head.LSN)
}

// The index under construction: branches, each a ref left as it is or its
// leaves in hand; leaves, each a ref left as it is or its entries in hand.
type (
	bchunk struct {
		ref    *nodeRef
		leaves []lchunk
	}
	lchunk struct {
		ref     *nodeRef
		entries []Entry
	}
)

// span is the page span of a chunk's entries (1, 0 when it has none: it
// overlaps nothing).
func (c *lchunk) span() (uint64, uint64) {
	switch {
	case c.ref != nil:
		return c.ref.Lo, c.ref.Hi
	case len(c.entries) == 0:
		return 1, 0
	}
	return c.entries[0].lo(), c.entries[len(c.entries)-1].hi()
}

func (c *bchunk) span() (uint64, uint64) {
	if c.ref != nil {
		return c.ref.Lo, c.ref.Hi
	}
	lo, hi, any := uint64(0), uint64(0), false
	for i := range c.leaves {
		l, h := c.leaves[i].span()
		if l > h {
			continue
		}
		if !any {
			lo = l
		}
		hi, any = h, true
	}
	if !any {
		return 1, 0
	}
	return lo, hi
}

// index is the builder: it opens (materialises) only the nodes a change
// touches.
type index struct {
	v        *Volume
	ctx      context.Context
	lsn      uint64 // the checkpoint's
	branches []bchunk
}

func (x *index) openBranch(i int) error {
	b := &x.branches[i]
	if b.ref == nil {
		return nil
	}
	refs, err := x.v.branch(x.ctx, *b.ref)
	if err != nil {
		return err
	}
	refs = slices.Clone(refs) // the cached branch stays as it is
	b.ref, b.leaves = nil, make([]lchunk, len(refs))
	for j := range refs {
		b.leaves[j] = lchunk{ref: &refs[j]}
	}
	return nil
}

func (x *index) openLeaf(i, j int) error {
	l := &x.branches[i].leaves[j]
	if l.ref == nil {
		return nil
	}
	entries, err := x.v.leaf(x.ctx, *l.ref)
	if err != nil {
		return err
	}
	l.ref, l.entries = nil, slices.Clone(entries)
	return nil
}

// appendEntry adds e after every entry: into the last leaf when it is not
// full, else a new one.
func (x *index) appendEntry(e Entry) error {
	n := len(x.branches)
	if n > 0 && x.branches[n-1].ref != nil && x.branches[n-1].ref.Children >= branchSize {
		// A full branch takes no more leaves; its last leaf may have room.
		refs, err := x.v.branch(x.ctx, *x.branches[n-1].ref)
		if err != nil {
			return err
		}
		if refs[len(refs)-1].Children >= leafSize {
			x.branches = append(x.branches, bchunk{})
			n++
		}
	}
	if n == 0 {
		x.branches = append(x.branches, bchunk{})
		n++
	}
	if err := x.openBranch(n - 1); err != nil {
		return err
	}
	b := &x.branches[n-1]
	m := len(b.leaves)
	if m > 0 && b.leaves[m-1].ref != nil && b.leaves[m-1].ref.Children < leafSize {
		if err := x.openLeaf(n-1, m-1); err != nil {
			return err
		}
	}
	if m == 0 || b.leaves[m-1].ref != nil {
		b.leaves = append(b.leaves, lchunk{})
		m++
	}
	b.leaves[m-1].entries = append(b.leaves[m-1].entries, e)
	return nil
}

// replace puts compaction entry e in place of the entries inside its span.
// An entry that straddles the span's edge means the compaction was built on
// another state: corrupt.
func (x *index) replace(e Entry) error {
	r := *e.Replaces
	overlaps := func(lo, hi uint64) bool { return lo <= hi && hi >= r.Lo && lo <= r.Hi }
	placed := false
	for i := range x.branches {
		if !overlaps(x.branches[i].span()) {
			continue
		}
		if err := x.openBranch(i); err != nil {
			return err
		}
		for j := range x.branches[i].leaves {
			if !overlaps(x.branches[i].leaves[j].span()) {
				continue
			}
			if err := x.openLeaf(i, j); err != nil {
				return err
			}
			l := &x.branches[i].leaves[j]
			kept := l.entries[:0:0]
			for _, y := range l.entries {
				switch {
				case y.hi() < r.Lo || y.lo() > r.Hi:
					kept = append(kept, y)
				case y.lo() >= r.Lo && y.hi() <= r.Hi:
					if !placed {
						kept, placed = append(kept, e), true
					}
				default:
					return fmt.Errorf("%w: compaction commit %d replaces pages %d-%d, entry %d straddles them (%d-%d)", ErrCorrupt, e.LSN, r.Lo, r.Hi, y.LSN, y.lo(), y.hi())
				}
			}
			l.entries = kept
		}
	}
	if !placed {
		return fmt.Errorf("%w: compaction commit %d replaces pages %d-%d, which no entry holds", ErrCorrupt, e.LSN, r.Lo, r.Hi)
	}
	return nil
}

// prune drops every entry whose pages are all below page below: whole
// branches and leaves by their refs, the boundary leaf opened.
func (x *index) prune(below uint64) error {
	var kept []bchunk
	for i := range x.branches {
		if lo, hi := x.branches[i].span(); lo <= hi && hi < below {
			continue
		} else if lo >= below || lo > hi {
			kept = append(kept, x.branches[i])
			continue
		}
		if err := x.openBranch(i); err != nil {
			return err
		}
		var leaves []lchunk
		for j := range x.branches[i].leaves {
			l := &x.branches[i].leaves[j]
			if lo, hi := l.span(); lo <= hi && hi < below {
				continue
			} else if lo < below && lo <= hi {
				if err := x.openLeaf(i, j); err != nil {
					return err
				}
				l.entries = slices.DeleteFunc(l.entries, func(e Entry) bool { return e.hi() < below })
			}
			leaves = append(leaves, *l)
		}
		if len(leaves) > 0 {
			kept = append(kept, bchunk{leaves: leaves})
		}
	}
	x.branches = kept
	return nil
}

// buildIndex applies the commits after base to its index: a commit of new
// pages is appended; a compaction commit takes the place of the entries
// inside the span it replaces. Nodes nothing touched keep their keys; the
// entries and leaf refs in hand are packed into full nodes and uploaded.
// A volume stays monotonic while every appended commit's pages are above
// all earlier ones.
func (v *Volume) buildIndex(ctx context.Context, base *checkpoint, tail []*Commit) ([]nodeRef, bool, error) {
	x := &index{v: v, ctx: ctx, lsn: tail[len(tail)-1].LSN}
	mono, top, seen := true, uint64(0), false
	if base != nil {
		mono = base.Monotonic
		for i := range base.Branches {
			x.branches = append(x.branches, bchunk{ref: &base.Branches[i]})
			top, seen = max(top, base.Branches[i].Hi), true
		}
	}
	for _, c := range tail {
		e := entryOf(c, v.KeepMeta)
		var err error
		if e.PruneBelow > 0 {
			if !mono {
				return nil, false, fmt.Errorf("%w: prune commit %d in a volume whose pages are not in commit order", ErrCorrupt, e.LSN)
			}
			err = x.prune(e.PruneBelow)
		} else if e.Replaces == nil {
			if seen && e.lo() <= top {
				mono = false
			}
			top, seen = max(top, e.hi()), true
			err = x.appendEntry(e)
		} else if !mono {
			err = fmt.Errorf("%w: compaction commit %d in a volume whose pages are not in commit order", ErrCorrupt, e.LSN)
		} else {
			err = x.replace(e)
		}
		if err != nil {
			return nil, false, err
		}
	}
	refs, err := x.pack()
	return refs, mono, err
}

// pack uploads the nodes in hand: entries into leaves of leafSize, leaf
// refs into branches of branchSize, consecutive ones in hand packed
// together so the full nodes before the change keep their keys.
func (x *index) pack() ([]nodeRef, error) {
	var out, leafRefs []nodeRef
	var entries []Entry
	flushEntries := func() error {
		for len(entries) > 0 {
			n := min(len(entries), leafSize)
			ref, err := x.putLeaf(entries[:n])
			if err != nil {
				return err
			}
			leafRefs, entries = append(leafRefs, ref), entries[n:]
		}
		return nil
	}
	flushLeaves := func() error {
		if err := flushEntries(); err != nil {
			return err
		}
		for len(leafRefs) > 0 {
			n := min(len(leafRefs), branchSize)
			ref, err := x.putBranch(leafRefs[:n])
			if err != nil {
				return err
			}
			out, leafRefs = append(out, ref), leafRefs[n:]
		}
		return nil
	}
	for _, b := range x.branches {
		if b.ref != nil {
			if err := flushLeaves(); err != nil {
				return nil, err
			}
			out = append(out, *b.ref)
			continue
		}
		for _, l := range b.leaves {
			if l.ref != nil {
				if err := flushEntries(); err != nil {
					return nil, err
				}
				leafRefs = append(leafRefs, *l.ref)
				continue
			}
			entries = append(entries, l.entries...)
		}
	}
	return out, flushLeaves()
}

// putLeaf and putBranch upload a node and return its ref, which
// summarises it for the searches of its parent.
func (x *index) putLeaf(entries []Entry) (nodeRef, error) {
	first, last := entries[0], entries[len(entries)-1]
	ref := nodeRef{Children: len(entries), Entries: len(entries), Lo: first.lo(), Hi: last.hi(), FirstLSN: first.LSN, LastLSN: last.LSN, Last: last.Meta}
	for _, e := range entries {
		ref.Lo, ref.Hi, ref.Bytes = min(ref.Lo, e.lo()), max(ref.Hi, e.hi()), ref.Bytes+e.Segment.Size
	}
	return ref, x.putNode("index", &ref, entries)
}

func (x *index) putBranch(leaves []nodeRef) (nodeRef, error) {
	first, last := leaves[0], leaves[len(leaves)-1]
	ref := nodeRef{Children: len(leaves), Lo: first.Lo, Hi: last.Hi, FirstLSN: first.FirstLSN, LastLSN: last.LastLSN, Last: last.Last}
	for _, l := range leaves {
		ref.Entries, ref.Bytes = ref.Entries+l.Entries, ref.Bytes+l.Bytes
		ref.Lo, ref.Hi = min(ref.Lo, l.Lo), max(ref.Hi, l.Hi)
	}
	return ref, x.putNode("branches", &ref, leaves)
}

func (x *index) putNode(dir string, ref *nodeRef, children any) error {
	obj, err := sealed(children)
	if err != nil {
		return err
	}
	ref.Key, ref.Size = x.v.nodeKey(dir, x.lsn, obj), int64(len(obj))
	if err := x.v.store.Create(x.ctx, ref.Key, obj); err != nil && !errors.Is(err, fence.ErrExists) { // same key: same bytes
		return fmt.Errorf("checkpoint node of volume %s: %w", x.v.name, err)
	}
	return nil
}

// adoptCheckpoint makes a checkpoint root the volume's base. It must be at
// the head (the writer's own) or above it (found by an open); the root's
// commit must be the head commit when it is at the head.
func (v *Volume) adoptCheckpoint(key string, root []byte, lsn uint64) error {
	ck, err := decodeCheckpoint(key, root)
	if err != nil {
		return err
	}
	if ck.LSN != lsn {
		return fmt.Errorf("checkpoint %s: %w: at LSN %d, expected %d", key, ErrCorrupt, ck.LSN, lsn)
	}
	if head := v.head(); head != nil && head.LSN == ck.LSN && head.Hash() != ck.CommitHash {
		return fmt.Errorf("checkpoint %s: %w: names commit %.12s, the chain has %.12s at LSN %d", key, ErrForeignRemote, ck.CommitHash, head.Hash(), ck.LSN)
	}
	v.writeFile(v.localCheckpoint(), root) // a cache: the next open falls back to the commit files
	v.dropLocalBelow(v.baseLSN(), ck.LSN)
	v.base, v.tail = ck, nil
	return nil
}

// commitObject returns the encoded object of a full commit, as stored.
func (v *Volume) commitObject(c *Commit) ([]byte, error) {
	if c.raw != nil {
		return c.raw, nil
	}
	if b, err := readFile(v.localCommit(c.LSN)); err == nil {
		return b, nil
	}
	return nil, fmt.Errorf("volume %s: commit %d: its object is not at hand", v.name, c.LSN)
}

// leafRefs yields the checkpoint's leaf refs in order from the first for
// which skip is false; skip must hold for a prefix of them only (nil: from
// the first). A binary search over the root's branches, then one branch,
// finds it.
func (v *Volume) leafRefs(ctx context.Context, ck *checkpoint, skip func(nodeRef) bool) iter.Seq2[nodeRef, error] {
	if skip == nil {
		skip = func(nodeRef) bool { return false }
	}
	return func(yield func(nodeRef, error) bool) {
		bs := ck.Branches
		i := sort.Search(len(bs), func(i int) bool { return !skip(bs[i]) })
		for first := true; i < len(bs); i, first = i+1, false {
			refs, err := v.branch(ctx, bs[i])
			if err != nil {
				yield(nodeRef{}, err)
				return
			}
			j := 0
			if first {
				j = sort.Search(len(refs), func(j int) bool { return !skip(refs[j]) })
			}
			for _, r := range refs[j:] {
				if !yield(r, nil) {
					return
				}
			}
		}
	}
}
