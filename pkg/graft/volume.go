package graft

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/silt-dev/silt/internal/durable"
	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/fence"
)

// Volume is one named page store: local files under a data directory,
// replicated to a fence.Store. It is safe for concurrent use; commits are
// serialised.
//
// In memory a volume holds its base checkpoint (the entries as of a commit,
// in leaves fetched on demand) and the commits after it, so its memory is
// bounded by the checkpoint interval, not by its history.
type Volume struct {
	// Failpoint, when set, is called at the steps of a commit, a
	// checkpoint and a compaction (package failpoint lists them): crash
	// tests kill the process there.
	Failpoint failpoint.Func
	// CacheWholeBelow: a remote segment up to this size is fetched whole and
	// cached locally on first read; larger ones are read with range GETs.
	CacheWholeBelow int64

	Options
	name   string
	dir    string // local directory of this volume
	store  fence.Store
	writer string

	fs        fileSystem // nil: the real one (files.go)
	mu        sync.Mutex
	base      *checkpoint // nil: no checkpoint yet
	tail      []*Commit   // the commits after base, in LSN order; all but the latest slimmed
	cacheMu   sync.Mutex  // guards cache and indexes, so segments are read while mu is held
	cache     map[string]*Segment
	indexes   map[string][]indexEntry // of large remote segments, by key (objects never change)
	indexLen  int                     // entries held in indexes
	leafMu    sync.Mutex              // guards leaves, so a leaf is read while mu is held
	leaves    map[string]any          // decoded leaves ([]Entry) and branches ([]nodeRef) by key
	badBases  map[uint64]bool         // checkpoints found unusable: warned about once, never adopted
	localHead uint64                  // the newest local commit file this handle wrote (the head hint)
	segBuf    []byte                  // the last commit's segment buffer, for the next to reuse (mu)
}

// maxReusedSegment bounds the segment buffer a volume keeps between
// commits: an archive slice's (4 MiB by default) is kept, a compaction's
// (64 MiB) is not.
const maxReusedSegment = 16 << 20

// Options tune a volume; the zero value is fine.
type Options struct {
	// KeepMeta lists the metadata keys that commits older than the latest,
	// tail entries and checkpoints keep (nil: all of them).
	KeepMeta []string
	// CheckpointEvery is the checkpoint interval in commits (0: the default
	// CheckpointEvery; negative: this handle writes none).
	CheckpointEvery int
	// Warn receives what the volume worked around: an unusable checkpoint
	// it fell back from. Nil: warnings are dropped.
	Warn func(msg string)
	// Unpacked writes each commit of new pages as two objects, its segment
	// then its commit record (format 1), instead of one packed object
	// (format 3). It is set for a store where a suffix read fetches the
	// whole object (fence.SuffixReadsWhole: an encrypted one), where every
	// read of a packed commit's record would.
	Unpacked bool
}

// Open opens volume name with local files under dataDir and the remote in
// store, then refreshes from the remote: the remote's latest commit is the
// truth. The name must be a valid fence key segment. OpenWith takes
// Options.
func Open(ctx context.Context, dataDir, name string, store fence.Store) (*Volume, error) {
	return OpenWith(ctx, dataDir, name, store, Options{})
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, dataDir, name string, store fence.Store, opt Options) (*Volume, error) {
	if err := fence.CheckKey(name); err != nil || strings.Contains(name, "/") {
		return nil, fmt.Errorf("volume name %q: must be one key segment of [A-Za-z0-9._-]", name)
	}
	v := &Volume{
		CacheWholeBelow: 16 << 20,
		Options:         opt,
		name:            name,
		dir:             filepath.Join(dataDir, name),
		store:           store,
		writer:          randomID(),
		cache:           map[string]*Segment{},
		indexes:         map[string][]indexEntry{},
		leaves:          map[string]any{},
	}
	v.Unpacked = v.Unpacked || fence.SuffixReadsWhole(store)
	for _, d := range []string{"segments", "commits", "index", "tmp"} {
		if err := os.MkdirAll(filepath.Join(v.dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("open volume %s: %w", name, err)
		}
	}
	durable.RemoveStale(filepath.Join(v.dir, "tmp")) // what a killed merge or commit left
	if err := v.loadLocal(); err != nil {
		return nil, err
	}
	if err := v.sameHistory(ctx); err != nil {
		return nil, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	current, err := v.catchUp(ctx)
	if err != nil || current {
		return v, err
	}
	return v, v.refresh(ctx)
}

func randomID() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Name returns the volume's name.
func (v *Volume) Name() string { return v.name }

// Writer returns this handle's writer id, recorded in its commits.
func (v *Volume) Writer() string { return v.writer }

func lsnName(lsn uint64) string { return fmt.Sprintf("%020d", lsn) }

func (v *Volume) commitKey(lsn uint64) string { return v.name + "/commits/" + lsnName(lsn) }

func (v *Volume) localCommit(lsn uint64) string {
	return filepath.Join(v.dir, "commits", lsnName(lsn))
}

func (v *Volume) localSegment(key string) string {
	return filepath.Join(v.dir, "segments", filepath.Base(key))
}

func (v *Volume) localCheckpoint() string { return filepath.Join(v.dir, "checkpoint") }

func (v *Volume) warnf(format string, args ...any) {
	if v.Warn != nil {
		v.Warn(fmt.Sprintf("volume %s: ", v.name) + fmt.Sprintf(format, args...))
	}
}

// baseLSN is the LSN of the base checkpoint (0: none).
func (v *Volume) baseLSN() uint64 {
	if v.base == nil {
		return 0
	}
	return v.base.LSN
}

// head returns the latest commit (nil for an empty volume).
func (v *Volume) head() *Commit {
	if n := len(v.tail); n > 0 {
		return v.tail[n-1]
	}
	if v.base != nil {
		return v.base.commit
	}
	return nil
}

func (v *Volume) headLSN() uint64 { return v.baseLSN() + uint64(len(v.tail)) }

func (v *Volume) headHash() string {
	if c := v.head(); c != nil {
		return c.Hash()
	}
	return ""
}

// loadLocal loads the local state: the local copy of the base checkpoint,
// then the newest local commit file with its tail, else the commit files
// after the base one by one. A local checkpoint the commit files do not
// chain to is dropped and the files are loaded from LSN 1.
func (v *Volume) loadLocal() error {
	if b, err := readFile(v.localCheckpoint()); err == nil {
		ck, err := decodeCheckpoint(v.localCheckpoint(), b)
		switch {
		case err != nil:
			v.warnf("local checkpoint unusable, reading the commit files: %v", err)
		case ck.Volume != v.name:
			v.warnf("local checkpoint belongs to volume %q, reading the commit files", ck.Volume)
		default:
			v.base = ck
		}
	}
	newest, err := v.newestLocalCommit()
	if err != nil || newest == nil {
		return err
	}
	if v.fromTail(newest) == nil {
		return nil
	}
	v.tail = nil
	if err := v.loadFiles(); err == nil || v.base == nil {
		return err
	}
	v.warnf("local checkpoint %d does not chain to the commit files, reading them from LSN 1", v.base.LSN)
	v.base, v.tail = nil, nil
	return v.loadFiles()
}

// newestLocalCommit reads the newest local commit file above the base.
func (v *Volume) newestLocalCommit() (*Commit, error) {
	// The head hint names it without reading a directory that may hold a
	// file per commit ever written here; files after a stale hint are found
	// by probing.
	if b, err := os.ReadFile(filepath.Join(v.dir, "head")); err == nil {
		if h, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && fileExists(v.localCommit(h)) {
			for fileExists(v.localCommit(h + 1)) {
				h++
			}
			if h <= v.baseLSN() {
				return nil, nil
			}
			return v.readCommitFile(h)
		}
	}
	files, err := os.ReadDir(filepath.Join(v.dir, "commits"))
	if err != nil {
		return nil, fmt.Errorf("open volume %s: %w", v.name, err)
	}
	for i := len(files) - 1; i >= 0; i-- {
		lsn, err := strconv.ParseUint(files[i].Name(), 10, 64)
		if err != nil || len(files[i].Name()) != 20 {
			continue
		}
		if lsn <= v.baseLSN() {
			return nil, nil
		}
		return v.readCommitFile(lsn)
	}
	return nil, nil
}

// dropLocalBelow removes the local commit files from the old base up to
// the new one (kept): no open reads them again, and a data directory would
// otherwise keep a file per commit forever. Only a handle moving its own
// base does it, a bounded step at a time.
func (v *Volume) dropLocalBelow(old, base uint64) {
	if old == 0 || base <= old || base-old > 4096 {
		return
	}
	for lsn := old; lsn < base; lsn++ {
		os.Remove(v.localCommit(lsn))
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// writeCommitFile stores the local copy of a commit object and moves the
// head hint (a hint: written without fsync, checked at open).
func (v *Volume) writeCommitFile(lsn uint64, obj []byte) error {
	if err := v.writeFile(v.localCommit(lsn), obj); err != nil {
		return err
	}
	v.hint(lsn)
	return nil
}

func (v *Volume) hint(lsn uint64) {
	if lsn > v.localHead {
		v.localHead = lsn
		os.WriteFile(filepath.Join(v.dir, "head"), []byte(strconv.FormatUint(lsn, 10)), 0o644)
	}
}

// fromTail sets the commits after the base from c's tail and c itself.
// c's base must be at or below ours, and its tail must name our base commit.
func (v *Volume) fromTail(c *Commit) error {
	first, err := checkTail(c)
	if err != nil {
		return err
	}
	b := v.baseLSN()
	if c.Base > b || c.LSN <= b {
		return fmt.Errorf("commit %d with base %d: %w: not above base %d", c.LSN, c.Base, ErrCorrupt, b)
	}
	at, want := first, ""
	if b > c.Base {
		at = c.Tail[b-c.Base-1].Hash
	}
	if v.base != nil {
		want = v.base.CommitHash
	}
	if at != want || c.Volume != v.name {
		return fmt.Errorf("commit %d: %w: its tail does not chain to commit %d", c.LSN, ErrCorrupt, b)
	}
	tail := make([]*Commit, 0, c.LSN-b)
	for _, e := range c.Tail[b-c.Base:] {
		tail = append(tail, e.commit(v.name))
	}
	v.tail = append(tail, c)
	return nil
}

// loadFiles links the local commit files after the head, up to the first
// missing one.
func (v *Volume) loadFiles() error {
	for lsn := v.headLSN() + 1; ; lsn++ {
		c, err := v.readCommitFile(lsn)
		if isNotExist(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("open volume %s: %w", v.name, err)
		}
		if err := v.link(c); err != nil {
			return err
		}
	}
}

// maxTail bounds the entries a commit carries (16 times the default
// checkpoint interval).
const maxTail = 16 * CheckpointEvery

// ErrForeignRemote: the local files and the remote hold different
// histories of the volume (another remote, or a remote that lost commits).
var ErrForeignRemote = errors.New("local volume and remote disagree")

// sameHistory checks that the remote holds the local head commit, byte for
// byte: a data directory pointed at another remote (or at one that lost
// commits) must not chain new commits onto a history the remote never had.
func (v *Volume) sameHistory(ctx context.Context) error {
	head := v.head()
	if head == nil {
		return nil
	}
	key := v.commitKey(head.LSN)
	theirs, err := v.readCommit(ctx, key)
	if errors.Is(err, fence.ErrNotFound) {
		// gc --drop-old-commits removes commits a checkpoint covers: then
		// the local state is just behind, and the remote's checkpoint is
		// the way in (the commits are a cache here; nothing local is lost).
		if keys, lerr := v.store.List(ctx, v.name+"/checkpoints/", "", 1); lerr == nil && len(keys) == 1 {
			if lsn, ok := checkpointLSN(keys[0]); ok && lsn >= head.LSN {
				v.warnf("the remote dropped local head commit %d (covered by checkpoint %d): opening from the checkpoint", head.LSN, lsn)
				v.base, v.tail = nil, nil
				return nil
			}
		}
		return fmt.Errorf("open volume %s: local head is commit %d, %s has no %s: %w (another remote, or one that lost data; "+
			"move %s aside to start from the remote)", v.name, head.LSN, v.store, key, ErrForeignRemote, v.dir)
	}
	if err != nil {
		return fmt.Errorf("open volume %s: %w", v.name, err)
	}
	if theirs.Hash() != head.Hash() {
		return fmt.Errorf("open volume %s: local commit %d differs from %s in %s: %w (a different history; "+
			"move %s aside to start from the remote)", v.name, head.LSN, key, v.store, ErrForeignRemote, v.dir)
	}
	return nil
}

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

// push appends the new latest commit and slims the previous one.
func (v *Volume) push(c *Commit) {
	if n := len(v.tail); n > 0 {
		v.tail[n-1] = v.slim(v.tail[n-1])
	}
	v.tail = append(v.tail, c)
}

// slim returns a copy of c with only what reads, tails and checkpoints need.
func (v *Volume) slim(c *Commit) *Commit {
	return entryOf(c, v.KeepMeta).commit(v.name)
}

// Head returns the latest LSN known (0 for an empty volume).
func (v *Volume) Head() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.headLSN()
}

// Latest returns the latest commit, or nil for an empty volume.
func (v *Volume) Latest() *Commit {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.head()
}

// Refresh adopts commits the remote has beyond the local head, probing
// forward (GET head+1, head+2, ... until not found): no LIST.
func (v *Volume) Refresh(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.refresh(ctx)
}

func (v *Volume) refresh(ctx context.Context) error {
	for {
		c, err := v.fetchCommit(ctx, v.headLSN()+1)
		if errors.Is(err, fence.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := v.link(c); err != nil {
			return err
		}
		v.rebase(ctx, c.Base)
	}
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
	b, err := v.store.Get(ctx, key, fence.Suffix(commitRead))
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
	case !packed && len(b) == commitRead: // an unpacked object at least this long: all of it
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

// rebase moves the base to the checkpoint at lsn when it is newer than
// ours and names the commit our chain has there, dropping the commits up to
// it from memory. Any failure keeps the current base (a warning): the
// commits stay in memory, nothing is lost.
func (v *Volume) rebase(ctx context.Context, lsn uint64) {
	b := v.baseLSN()
	if lsn <= b || lsn > v.headLSN() || v.badBases[lsn] {
		return
	}
	key := v.checkpointKey(lsn)
	root, err := v.store.Get(ctx, key, fence.Range{})
	if err == nil {
		var ck *checkpoint
		if ck, err = decodeCheckpoint(key, root); err == nil {
			if at := v.tail[lsn-b-1]; ck.LSN != lsn || ck.CommitHash != at.Hash() {
				err = fmt.Errorf("%w: it names commit %.12s, the chain has %.12s", ErrCorrupt, ck.CommitHash, at.Hash())
			} else {
				v.writeFile(v.localCheckpoint(), root)
				v.dropLocalBelow(b, lsn)
				v.base, v.tail = ck, slices.Clone(v.tail[lsn-b:])
				return
			}
		}
	}
	v.markBad(lsn) // warned once; the next checkpoint is tried when a commit names it
	v.warnf("checkpoint %d named by a commit is unusable, keeping the commits since %d in memory: %v", lsn, b, err)
}

// catchUp is the open's jump: when the remote's newest checkpoint is above
// the local head, it becomes the base and the newest commit after it
// brings the commits between in its tail (current: the head is the
// remote's newest, no probe needed). An unusable checkpoint is named in a
// warning and the next older one tried, up to jumpTries of them: once old
// commits were dropped (DropOldCommits) an older checkpoint is the only way
// in. Without a usable checkpoint a volume with no local state reads the
// whole commit chain.
func (v *Volume) catchUp(ctx context.Context) (current bool, err error) {
	keys, err := v.store.List(ctx, v.name+"/checkpoints/", "", jumpTries) // newest first
	if err != nil {
		return false, fmt.Errorf("open volume %s: %w", v.name, err)
	}
	var floor uint64
	for i, key := range keys {
		lsn, ok := checkpointLSN(key)
		if !ok || lsn <= v.headLSN() || lsn < floor {
			break
		}
		current, err := v.jump(ctx, key, lsn)
		if err == nil {
			return current, nil
		}
		v.markBad(lsn)
		if i == 0 {
			// A checkpoint below the commits dropped has a hole above it,
			// where its newest commit would be looked for: never adopted.
			var ferr error
			if floor, ferr = v.chainFloor(ctx); ferr != nil {
				return false, fmt.Errorf("open volume %s: checkpoint %d unusable (%v), and then: %w", v.name, lsn, err, ferr)
			}
		}
		next := "reading the commit chain instead"
		if i+1 < len(keys) {
			if older, ok := checkpointLSN(keys[i+1]); ok && older >= floor && older > v.headLSN() {
				next = "trying the one before it"
			}
		}
		v.warnf("checkpoint %d unusable, %s: %v", lsn, next, err)
	}
	if v.headLSN() > 0 {
		return false, nil // refresh probes forward from the head
	}
	return true, v.readChain(ctx)
}

// markBad records that the checkpoint at lsn is unusable.
func (v *Volume) markBad(lsn uint64) {
	if v.badBases == nil {
		v.badBases = map[uint64]bool{}
	}
	v.badBases[lsn] = true
}

// jumpTries is how many checkpoints, newest first, an open tries before it
// reads the commit chain.
const jumpTries = 4

// chainFloor is the lowest checkpoint LSN whose commits above are all
// there: what a drop of old commits may have deleted up to (its mark, or,
// dropped by a build that left none, the commit before the first left).
func (v *Volume) chainFloor(ctx context.Context) (uint64, error) {
	floor, err := v.droppedUpTo(ctx)
	if err != nil {
		return 0, err
	}
	first, err := v.store.List(ctx, v.name+"/commits/", "", 1)
	if err != nil {
		return 0, err
	}
	if len(first) == 1 {
		if lsn, ok := keyLSN(first[0]); ok && lsn > 1 {
			floor = max(floor, lsn-1)
		}
	}
	return floor, nil
}

// jump adopts the checkpoint at key (above the head: nothing local is
// newer), then the newest commit after it with its tail. current reports
// that the head is then the remote's newest commit.
func (v *Volume) jump(ctx context.Context, key string, lsn uint64) (current bool, err error) {
	root, err := v.store.Get(ctx, key, fence.Range{})
	if err != nil {
		return false, err
	}
	ck, err := decodeCheckpoint(key, root)
	if err != nil {
		return false, err
	}
	if ck.LSN != lsn || ck.Volume != v.name {
		return false, fmt.Errorf("%w: checkpoint %s holds LSN %d of volume %q", ErrCorrupt, key, ck.LSN, ck.Volume)
	}
	newest, err := v.newestAfter(ctx, lsn)
	if err != nil {
		return false, err
	}
	old, oldTail := v.base, v.tail
	v.base, v.tail, current = ck, nil, true
	if newest != nil {
		if err := v.fromTail(newest); err != nil {
			v.tail, current = nil, false // no usable tail: refresh links the commits after it one by one
		} else if err := v.writeCommitFile(newest.LSN, newest.raw); err != nil {
			v.base, v.tail = old, oldTail
			return false, err
		}
	}
	if err := v.writeFile(v.localCheckpoint(), root); err != nil {
		v.base, v.tail = old, oldTail
		return false, err
	}
	// The local commit file of the checkpoint's commit, for a later open's chain check.
	return current, v.writeCommitFile(lsn, []byte(ck.Commit))
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
			return fmt.Errorf("volume %s: %w: %s; the commits up to %d were dropped (gc --drop-old-commits), so only a checkpoint "+
				"at or above %d opens this volume, and none did (the warnings say why each was unusable)",
				v.name, ErrMissingCommits, strings.Join(missing, ", "), dropped, dropped)
		}
		return fmt.Errorf("volume %s: %w: the remote lacks %s of a chain of %d commits, and no checkpoint covers them "+
			"(repair: `archiver pull` from a data directory that still has them, or `archiver verify` to see what is left)",
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

// ErrMissingCommits: the remote chain has a hole.
var ErrMissingCommits = errors.New("commits missing from the remote")

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

func (v *Volume) failpoint(step failpoint.Name) {
	if v.Failpoint != nil {
		v.Failpoint(step)
	}
}

// Commit writes pages as the next LSN with meta and returns the commit. The
// steps: segment written locally (fsync), uploaded create-only under a key
// unique to this writer, then the commit object created with If-None-Match:
// *, then the local head. Losing the race for the LSN adopts the winner and
// returns a *ConflictError; nothing of ours becomes visible.
func (v *Volume) Commit(ctx context.Context, pages []Page, meta map[string]string) (*Commit, error) {
	byNo := func(a, b Page) int { return cmp.Compare(a.No, b.No) }
	if !slices.IsSortedFunc(pages, byNo) { // sort a copy: the caller's slice stays as it is
		pages = slices.Clone(pages)
		slices.SortFunc(pages, byNo)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	c, err := v.commit(ctx, pages, meta, nil)
	if err != nil {
		return nil, err
	}
	if v.CheckpointEvery >= 0 && v.checkpointDue() {
		if _, err := v.checkpoint(ctx); err != nil {
			// The commit stands; the next commit's tail carries on until a
			// checkpoint succeeds.
			v.warnf("checkpoint at commit %d not written: %v", c.LSN, err)
		}
	}
	return c, nil
}

// commit writes the next commit with v.mu held; with edit, the commit is
// changed before it is encoded (a compaction's fields).
func (v *Volume) commit(ctx context.Context, pages []Page, meta map[string]string, edit func(*Commit)) (_ *Commit, err error) {
	lsn := v.headLSN() + 1
	if edit == nil && !v.Unpacked {
		return v.commitPacked(ctx, lsn, pages, meta)
	}
	seg, err := appendSegment(v.segBuf, lsn, pages)
	v.segBuf = nil
	if err != nil {
		return nil, err
	}
	defer func() {
		// Only a commit that went through hands its buffer on: after a
		// failed upload the HTTP transport may still be reading it.
		if err == nil && cap(seg) <= maxReusedSegment {
			v.segBuf = seg
		}
	}()
	sum := sha256.Sum256(seg)
	c := v.newCommit(lsn, int64(len(seg)), hex.EncodeToString(sum[:]), rangesOf(pages), uint64(len(pages)), meta)
	if edit != nil {
		edit(c)
	}
	if c.Segment.Key != "" { // a prune commit has none
		if err := v.writeSegment(ctx, c.Segment.Key, seg, c.Segment.SHA256); err != nil {
			return nil, err
		}
	}
	if err := v.put(ctx, c); err != nil {
		return nil, err
	}
	return c, nil
}

// recordSlack is room left after a packed commit's segment for its record
// and footer, so they are appended without copying the segment.
const recordSlack = 64 << 10

// commitPacked writes the next commit as one packed object (commit.go):
// the segment is laid out after the preamble and hashed once, the record
// and footer appended, and the object created with If-None-Match: * while
// the segment and the record are written and fsynced locally.
func (v *Volume) commitPacked(ctx context.Context, lsn uint64, pages []Page, meta map[string]string) (_ *Commit, err error) {
	n := len(packedPreamble)
	buf := v.segBuf[:0]
	v.segBuf = nil
	if size := n + segmentSize(pages) + recordSlack; cap(buf) < size {
		buf = make([]byte, 0, size)
	}
	buf = append(buf, packedPreamble...)
	seg, err := appendSegment(buf[n:n], lsn, pages)
	if err != nil {
		return nil, err
	}
	obj := buf[:n+len(seg)] // seg was laid out in buf's storage, after the preamble
	if &obj[n] != &seg[0] {
		obj = append(buf, seg...)
	}
	defer func() {
		if err == nil && cap(obj) <= maxReusedSegment {
			v.segBuf = obj
		}
	}()
	sum := sha256.New()
	sum.Write(obj)
	c := v.newCommit(lsn, int64(len(obj)), hex.EncodeToString(sum.Sum(nil)), rangesOf(pages), uint64(len(pages)), meta)
	c.Version, c.Segment.Key, c.Segment.Offset = packedVersion, v.commitKey(lsn), int64(n)
	obj, whole, err := appendPacked(obj, c, sum)
	if err != nil {
		return nil, err
	}
	// The local segment is staged, not written in place: its name is the
	// LSN's, which another writer may win (a format 1 segment's key is its
	// writer's own).
	local, record := make(chan staged, 1), make(chan staged, 1)
	go func() {
		s := v.stageFile(v.localSegment(c.Segment.Key), obj[:c.Segment.Size])
		if s.err == nil {
			v.failpoint(failpoint.SegmentWritten)
		}
		local <- s
	}()
	go func() { record <- v.stageFile(v.localCommit(lsn), c.raw) }()
	var upErr error
	if hc, ok := v.store.(fence.HashedCreator); ok {
		upErr = hc.CreateHashed(ctx, c.Segment.Key, obj, whole)
	} else {
		upErr = v.store.Create(ctx, c.Segment.Key, obj)
	}
	ls, s := <-local, <-record
	if upErr != nil {
		ls.drop()
		s.drop()
		if errors.Is(upErr, fence.ErrExists) {
			return nil, v.lost(ctx, lsn)
		}
		return nil, fmt.Errorf("commit %d of volume %s: %w", lsn, v.name, upErr)
	}
	v.failpoint(failpoint.SegmentUploaded)
	v.failpoint(failpoint.CommitPut)
	if ls.err != nil {
		s.drop()
		return nil, fmt.Errorf("volume %s: %w", v.name, ls.err)
	}
	if err := ls.placeCache(); err != nil {
		s.drop()
		return nil, err
	}
	if err := v.placeHead(c, s); err != nil {
		return nil, err
	}
	return c, nil
}

// put creates the commit object of c, whose segment is stored, and makes c
// the head. The local copy is written and fsynced while the commit object
// is created; it is renamed into place only once the remote has it.
func (v *Volume) put(ctx context.Context, c *Commit) error {
	obj, err := c.Encode()
	if err != nil {
		return err
	}
	local := make(chan staged, 1)
	go func() { local <- v.stageFile(v.localCommit(c.LSN), obj) }()
	err = v.store.Create(ctx, v.commitKey(c.LSN), obj)
	s := <-local
	if err != nil {
		s.drop()
		if errors.Is(err, fence.ErrExists) {
			return v.lost(ctx, c.LSN)
		}
		return fmt.Errorf("commit %d of volume %s: %w", c.LSN, v.name, err)
	}
	v.failpoint(failpoint.CommitPut)
	return v.placeHead(c, s)
}

// placeHead puts the local copy of c's committed record in place and makes
// c the head.
func (v *Volume) placeHead(c *Commit, s staged) error {
	if s.err != nil {
		return s.err
	}
	if err := s.place(); err != nil {
		return err
	}
	v.hint(c.LSN)
	v.push(c)
	v.failpoint(failpoint.HeadUpdated)
	return nil
}

// newCommit returns the commit of lsn for a segment of size bytes and
// SHA-256 sum holding pages pages in ranges; its segment key is new.
func (v *Volume) newCommit(lsn uint64, size int64, sum string, ranges []PageRange, pages uint64, meta map[string]string) *Commit {
	now := time.Now().UTC()
	c := &Commit{
		Version: plainVersion, Volume: v.name, LSN: lsn,
		Segment: SegmentRef{
			Key:  fmt.Sprintf("%s/segments/%s-%013d-%s", v.name, lsnName(lsn), now.UnixMilli(), v.writer),
			Size: size, SHA256: sum,
		},
		Ranges: ranges, Pages: pages, Meta: meta, Writer: v.writer, Time: now,
		Prev: v.headHash(), Base: v.baseLSN(),
	}
	// The tail is bounded: a writer whose checkpoints keep failing (or that
	// writes none) stops carrying one, and opens then probe commit by
	// commit from the newest checkpoint, as they would without tails.
	if (c.Base > 0 || len(v.tail) > 0) && len(v.tail) <= maxTail {
		for _, t := range v.tail {
			c.Tail = append(c.Tail, entryOf(t, v.KeepMeta))
		}
	} else {
		c.Base = 0
	}
	return c
}

// writeSegment stores the segment locally and uploads it, both at once:
// neither is visible to readers until the commit object exists.
func (v *Volume) writeSegment(ctx context.Context, key string, seg []byte, sha256hex string) error {
	local := make(chan error, 1)
	go func() {
		err := v.writeFile(v.localSegment(key), seg)
		if err == nil {
			v.failpoint(failpoint.SegmentWritten)
		}
		local <- err
	}()
	var upErr error
	if hc, ok := v.store.(fence.HashedCreator); ok { // the commit already hashed the segment
		upErr = hc.CreateHashed(ctx, key, seg, sha256hex)
	} else {
		upErr = v.store.Create(ctx, key, seg)
	}
	if err := <-local; err != nil {
		return fmt.Errorf("volume %s: %w", v.name, err)
	}
	if upErr != nil {
		return fmt.Errorf("upload segment %s: %w", key, upErr)
	}
	v.failpoint(failpoint.SegmentUploaded)
	return nil
}

// lost handles a commit race we lost: adopt the remote state and report the winner.
func (v *Volume) lost(ctx context.Context, lsn uint64) error {
	if err := v.refresh(ctx); err != nil {
		return fmt.Errorf("commit %d of volume %s lost a race; adopting the winner: %w", lsn, v.name, err)
	}
	if v.headLSN() < lsn {
		return fmt.Errorf("commit %d of volume %s: refused as existing, but not found on refresh", lsn, v.name)
	}
	return &ConflictError{LSN: lsn, Winner: v.commitAt(lsn)}
}
