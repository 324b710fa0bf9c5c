package graft

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/silt-dev/silt/pkg/fence"
)

// Checkpoints (docs/architecture.md, "Deep history"): every CheckpointEvery
// commits a writer publishes the volume's entries as of a commit, so an
// open reads one checkpoint and the newest commit instead of the history.
const (
	// CheckpointEvery is the default checkpoint interval K in commits.
	CheckpointEvery = 16
	// leafSize is how many entries a leaf holds; full leaves are shared by
	// every later checkpoint.
	leafSize         = 512
	checkpointFormat = 1
	leafCacheSize    = 16
)

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
}

// entryOf returns c's entry, keeping only the metadata keys in keep (nil: all).
func entryOf(c *Commit, keep []string) Entry {
	e := Entry{LSN: c.LSN, Hash: c.Hash(), Prev: c.Prev, Segment: c.Segment, Ranges: c.Ranges, Pages: c.Pages, Time: c.Time, Replaces: c.Replaces}
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
		Ranges: e.Ranges, Pages: e.Pages, Meta: e.Meta, Time: e.Time, Replaces: e.Replaces, hash: e.Hash}
	if e.Replaces != nil {
		c.Version, c.EntryMeta = compactionVersion, e.Meta
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

// leafRef names one leaf of a checkpoint and summarises it, so a search
// picks the leaf it needs without fetching the others.
type leafRef struct {
	Key      string            `json:"key"`
	Size     int64             `json:"size"`
	Entries  int               `json:"entries"`
	Lo       uint64            `json:"lo"` // page span of the leaf's entries
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
	Leaves     []leafRef `json:"leaves"`
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

// leafKey: the last LSN the leaf holds, then its hash, so gc can tell a
// superseded leaf from one a checkpoint in flight is writing.
func (v *Volume) leafKey(lastLSN uint64, obj []byte) string {
	sum := sha256.Sum256(obj)
	return fmt.Sprintf("%s/index/%s-%s", v.name, lsnName(lastLSN), hex.EncodeToString(sum[:]))
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

func encodeLeaf(entries []Entry) ([]byte, error) { return sealed(entries) }

func (v *Volume) decodeLeaf(ref leafRef, obj []byte) ([]Entry, error) {
	var entries []Entry
	if v.leafKey(ref.LastLSN, obj) != ref.Key {
		return nil, fmt.Errorf("checkpoint leaf %s: %w: content does not match its key", ref.Key, ErrCorrupt)
	}
	if err := unseal("checkpoint leaf "+ref.Key, obj, &entries); err != nil {
		return nil, err
	}
	if len(entries) != ref.Entries || len(entries) == 0 || entries[0].LSN != ref.FirstLSN && ref.FirstLSN != 0 {
		return nil, fmt.Errorf("checkpoint leaf %s: %w: holds %d entries, its checkpoint says %d", ref.Key, ErrCorrupt, len(entries), ref.Entries)
	}
	return entries, nil
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
	for _, l := range ck.Leaves {
		n += uint64(l.Entries)
	}
	if n != ck.Entries {
		return nil, fmt.Errorf("checkpoint %s: %w: leaves hold %d entries, it says %d", name, ErrCorrupt, n, ck.Entries)
	}
	sum := sha256.Sum256(obj)
	ck.commit, ck.hash = c, hex.EncodeToString(sum[:])
	return ck, nil
}

// leaf returns the entries of one leaf: from memory, the local cache or
// the remote, always checked against the leaf's key.
func (v *Volume) leaf(ctx context.Context, ref leafRef) ([]Entry, error) {
	v.leafMu.Lock()
	if e, ok := v.leaves[ref.Key]; ok {
		v.leafMu.Unlock()
		return e, nil
	}
	v.leafMu.Unlock()
	path := v.localLeaf(ref.Key)
	obj, err := readFile(path)
	if err != nil {
		if obj, err = v.store.Get(ctx, ref.Key, fence.Range{}); err != nil {
			return nil, fmt.Errorf("volume %s: checkpoint leaf: %w", v.name, err)
		}
	}
	entries, err := v.decodeLeaf(ref, obj)
	if err != nil {
		return nil, err
	}
	if path != "" {
		v.writeFile(path, obj) // a cache: a failed write costs a GET next time
	}
	v.leafMu.Lock()
	if len(v.leaves) >= leafCacheSize {
		clear(v.leaves)
	}
	v.leaves[ref.Key] = entries
	v.leafMu.Unlock()
	return entries, nil
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

// checkpoint writes the leaves, then the root, create-only: the base
// checkpoint's leaves with the tail applied (buildLeaves).
func (v *Volume) checkpoint(ctx context.Context) (uint64, error) {
	head := v.tail[len(v.tail)-1]
	ck := &checkpoint{Version: checkpointFormat, Volume: v.name, LSN: head.LSN, CommitHash: head.Hash(), Time: time.Now().UTC()}
	var err error
	if ck.Leaves, ck.Monotonic, err = v.buildLeaves(ctx, v.base, v.tail); err != nil {
		return 0, fmt.Errorf("checkpoint %d of volume %s: %w", ck.LSN, v.name, err)
	}
	for _, l := range ck.Leaves {
		ck.Entries, ck.Bytes = ck.Entries+uint64(l.Entries), ck.Bytes+l.Bytes
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
	v.failpoint("checkpoint-leaves")
	key := v.checkpointKey(ck.LSN)
	if err := v.store.Create(ctx, key, root); errors.Is(err, fence.ErrExists) {
		// Another writer checkpointed this commit: use theirs if it is the same commit.
		if root, err = v.store.Get(ctx, key, fence.Range{}); err != nil {
			return 0, fmt.Errorf("checkpoint %d of volume %s: %w", ck.LSN, v.name, err)
		}
	} else if err != nil {
		return 0, fmt.Errorf("checkpoint %d of volume %s: %w", ck.LSN, v.name, err)
	}
	v.failpoint("checkpoint-put")
	return ck.LSN, v.adoptCheckpoint(key, root, head.LSN)
}

// chunk is a run of entries in index order: a leaf left as it is (ref), or
// entries in hand that will be cut into new leaves.
type chunk struct {
	ref     *leafRef
	entries []Entry
}

func (c chunk) span() (lo, hi uint64) {
	if c.ref != nil {
		return c.ref.Lo, c.ref.Hi
	}
	if len(c.entries) == 0 {
		return 1, 0
	}
	return c.entries[0].lo(), c.entries[len(c.entries)-1].hi()
}

// buildLeaves applies the commits after base to its leaves: a commit of
// new pages is appended; a compaction commit takes the place of the
// entries inside the span it replaces. Leaves nothing touched keep their
// keys; the entries in hand are cut into leaves of leafSize and uploaded.
// A volume stays monotonic while every appended commit's pages are above
// all earlier ones.
func (v *Volume) buildLeaves(ctx context.Context, base *checkpoint, tail []*Commit) ([]leafRef, bool, error) {
	var chunks []chunk
	mono, top, seen := true, uint64(0), false
	if base != nil {
		mono = base.Monotonic
		for i := range base.Leaves {
			chunks = append(chunks, chunk{ref: &base.Leaves[i]})
			top, seen = max(top, base.Leaves[i].Hi), true
		}
	}
	open := func(i int) error { // materialise chunk i
		if chunks[i].ref == nil {
			return nil
		}
		entries, err := v.leaf(ctx, *chunks[i].ref)
		if err != nil {
			return err
		}
		chunks[i] = chunk{entries: slices.Clone(entries)}
		return nil
	}
	if n := len(chunks); n > 0 && chunks[n-1].ref.Entries < leafSize {
		if err := open(n - 1); err != nil {
			return nil, false, err
		}
	}
	for _, c := range tail {
		e := entryOf(c, v.KeepMeta)
		if e.Replaces == nil {
			if seen && e.lo() <= top {
				mono = false
			}
			top, seen = max(top, e.hi()), true
			if n := len(chunks); n > 0 && chunks[n-1].ref == nil {
				chunks[n-1].entries = append(chunks[n-1].entries, e)
			} else {
				chunks = append(chunks, chunk{entries: []Entry{e}})
			}
			continue
		}
		if !mono {
			return nil, false, fmt.Errorf("%w: compaction commit %d in a volume whose pages are not in commit order", ErrCorrupt, e.LSN)
		}
		if err := v.replace(chunks, open, e); err != nil {
			return nil, false, err
		}
	}
	var leaves []leafRef
	var pending []Entry
	flush := func() error {
		for len(pending) > 0 {
			n := min(len(pending), leafSize)
			ref, err := v.putLeaf(ctx, pending[:n])
			if err != nil {
				return err
			}
			leaves, pending = append(leaves, ref), pending[n:]
		}
		return nil
	}
	for _, c := range chunks {
		if c.ref != nil {
			if err := flush(); err != nil {
				return nil, false, err
			}
			leaves = append(leaves, *c.ref)
			continue
		}
		pending = append(pending, c.entries...)
	}
	return leaves, mono, flush()
}

// replace puts compaction entry e in place of the entries inside its span.
// An entry that straddles the span's edge means the compaction was built on
// another state: corrupt.
func (v *Volume) replace(chunks []chunk, open func(int) error, e Entry) error {
	r := *e.Replaces
	placed := false
	for i := range chunks {
		if lo, hi := chunks[i].span(); hi < r.Lo || lo > r.Hi {
			continue
		}
		if err := open(i); err != nil {
			return err
		}
		kept := chunks[i].entries[:0:0]
		for _, x := range chunks[i].entries {
			switch {
			case x.hi() < r.Lo || x.lo() > r.Hi:
				kept = append(kept, x)
			case x.lo() >= r.Lo && x.hi() <= r.Hi:
				if !placed {
					kept, placed = append(kept, e), true
				}
			default:
				return fmt.Errorf("%w: compaction commit %d replaces pages %d-%d, entry %d straddles them (%d-%d)", ErrCorrupt, e.LSN, r.Lo, r.Hi, x.LSN, x.lo(), x.hi())
			}
		}
		chunks[i].entries = kept
	}
	if !placed {
		return fmt.Errorf("%w: compaction commit %d replaces pages %d-%d, which no entry holds", ErrCorrupt, e.LSN, r.Lo, r.Hi)
	}
	return nil
}

func (v *Volume) putLeaf(ctx context.Context, entries []Entry) (leafRef, error) {
	obj, err := encodeLeaf(entries)
	if err != nil {
		return leafRef{}, err
	}
	last := entries[len(entries)-1]
	ref := leafRef{Key: v.leafKey(last.LSN, obj), Size: int64(len(obj)), Entries: len(entries),
		Lo: entries[0].lo(), Hi: last.hi(), FirstLSN: entries[0].LSN, LastLSN: last.LSN, Last: last.Meta}
	for _, e := range entries {
		ref.Lo, ref.Hi, ref.Bytes = min(ref.Lo, e.lo()), max(ref.Hi, e.hi()), ref.Bytes+e.Segment.Size
	}
	if err := v.store.Create(ctx, ref.Key, obj); err != nil && !errors.Is(err, fence.ErrExists) {
		return leafRef{}, fmt.Errorf("checkpoint leaf of volume %s: %w", v.name, err)
	}
	return ref, nil
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
