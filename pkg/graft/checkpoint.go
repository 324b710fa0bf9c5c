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
	return badIndex(v.checkNode(dir, ref, obj, out, count))
}

func (v *Volume) checkNode(dir string, ref nodeRef, obj []byte, out any, count func() (children, entries int)) error {
	sum := sha256.Sum256(obj)
	if !strings.HasPrefix(ref.Key, v.name+"/"+dir+"/") || !strings.HasSuffix(ref.Key, "-"+hex.EncodeToString(sum[:])) {
		return fmt.Errorf("checkpoint node %s: %w: content does not match its key", ref.Key, ErrCorrupt)
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
	ck, err := parseCheckpoint(name, obj)
	return ck, badIndex(err)
}

func parseCheckpoint(name string, obj []byte) (*checkpoint, error) {
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
