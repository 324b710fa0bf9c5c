package graft

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/silt-dev/silt/pkg/fence"
)

// Refresh adopts commits the remote has beyond the local head, probing
// forward (GET head+1, head+2, ... until not found): no LIST.
func (v *Volume) Refresh(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.refresh(ctx)
}

func (v *Volume) refresh(ctx context.Context) error { return v.refreshFrom(ctx, nil) }

// refreshFrom is refresh with its first probe possibly made already:
// first, when set and still for the commit after the head, gives it.
func (v *Volume) refreshFrom(ctx context.Context, first *early[*Commit]) error {
	for {
		lsn := v.headLSN() + 1
		var c *Commit
		var err error
		if first != nil && first.lsn == lsn {
			if c, err = first.wait(); err == nil {
				err = v.writeCommitFile(c.LSN, c.raw)
			}
		} else {
			c, err = v.fetchCommit(ctx, lsn)
		}
		first = nil
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

// hint moves the head hint to lsn: the LSN in its 20 digits (lsnName),
// written over the file's first bytes, never truncated. Every hint has
// those 20 bytes, and one written by an older build (fewer digits) is
// covered whole. A truncating rewrite made ext4 start the file's
// writeback at close (its auto_da_alloc), 140-340 µs on each commit's
// path; a write in place costs a few. The hint is not synced: a torn or
// stale one is checked at open (newestLocalCommit).
func (v *Volume) hint(lsn uint64) {
	if lsn <= v.localHead {
		return
	}
	v.localHead = lsn
	f, err := os.OpenFile(filepath.Join(v.dir, "head"), os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	f.WriteAt([]byte(lsnName(lsn)), 0)
	f.Close()
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

// sameHistory checks that the remote holds the local head commit, byte for
// byte: a data directory pointed at another remote (or at one that lost
// commits) must not chain new commits onto a history the remote never had.
func (v *Volume) sameHistory(ctx context.Context, read *early[*Commit]) error {
	head := v.head()
	if head == nil {
		return nil
	}
	key := v.commitKey(head.LSN)
	theirs, err := read.wait()
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
func (v *Volume) catchUp(ctx context.Context, list *early[[]string]) (current bool, err error) {
	keys, err := list.wait() // newest first
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

// openReads are an open's first reads of the remote, made at once rather
// than one after another (each a round trip, tens of milliseconds to a
// bucket in another region): the local head's commit (sameHistory), the
// newest checkpoints (catchUp) and, with a local head, the commit after it
// (refresh's first probe). Each is used where the open makes its checks,
// in their order; a read the open no longer needs (a check failed, a
// checkpoint moved the head) is cancelled.
type openReads struct {
	head, next  *early[*Commit]
	checkpoints *early[[]string]
	cancel      context.CancelFunc
}

// readAtOnce starts an open's first reads.
func (v *Volume) readAtOnce(ctx context.Context) openReads {
	ctx, cancel := context.WithCancel(ctx)
	r := openReads{cancel: cancel}
	r.checkpoints = startRead(0, func() ([]string, error) {
		return v.store.List(ctx, v.name+"/checkpoints/", "", jumpTries)
	})
	if head := v.head(); head != nil {
		r.head = startRead(head.LSN, func() (*Commit, error) { return v.readCommit(ctx, v.commitKey(head.LSN)) })
		r.next = startRead(head.LSN+1, func() (*Commit, error) { return v.getCommit(ctx, head.LSN+1) })
	}
	return r
}

// stop cancels the reads not used and waits for them.
func (r openReads) stop() {
	r.cancel()
	r.checkpoints.done()
	r.head.done()
	r.next.done()
}

// early is one read started ahead of its use: of the commit at lsn, or
// (lsn 0) a list.
type early[T any] struct {
	lsn uint64
	ch  chan struct{}
	val T
	err error
}

// startRead starts read on a goroutine of its own.
func startRead[T any](lsn uint64, read func() (T, error)) *early[T] {
	e := &early[T]{lsn: lsn, ch: make(chan struct{})}
	go func() {
		defer close(e.ch)
		e.val, e.err = read()
	}()
	return e
}

// wait returns the read's result once it is done.
func (e *early[T]) wait() (T, error) {
	<-e.ch
	return e.val, e.err
}

// done waits for the read, if one was started.
func (e *early[T]) done() {
	if e != nil {
		<-e.ch
	}
}
