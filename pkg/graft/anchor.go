package graft

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/silt-dev/silt/pkg/fence"
)

// A caller that keeps its own record of a volume's commits (an anchor: an
// LSN and the commit's hash, held by the system the volume archives) proves
// the remote against it with CommitAt and ReadBack: the remote's chain must
// reach the anchor, and hold there the very commit recorded.

// anchorWalk bounds how many commit objects below the base checkpoint
// CommitAt reads to reach an LSN: a writer records each commit it makes,
// so the anchor sits within a checkpoint interval or two of the head.
const anchorWalk = 4 * CheckpointEvery

// CommitAt returns the commit at lsn as this volume's chain holds it: from
// memory when lsn is at or above the base checkpoint (its Meta holds only
// Options.KeepMeta below the head), else read back from the remote commit
// by commit, each linked by hash to the one above, down from the base.
// An lsn above the head is ErrNotFound; a chain that cannot be followed
// there is ErrUnreachable, or ErrCorrupt when a link does not match.
func (v *Volume) CommitAt(ctx context.Context, lsn uint64) (*Commit, error) {
	v.mu.Lock()
	if c := v.commitAt(lsn); c != nil {
		v.mu.Unlock()
		return c, nil
	}
	base, head := v.base, v.headLSN()
	v.mu.Unlock()
	switch {
	case lsn == 0 || lsn > head:
		return nil, fmt.Errorf("volume %s: commit %d: %w (the head is %d)", v.name, lsn, fence.ErrNotFound, head)
	case base == nil || base.commit == nil:
		return nil, fmt.Errorf("volume %s: commit %d: %w", v.name, lsn, ErrUnreachable)
	case base.LSN-lsn > anchorWalk:
		return nil, fmt.Errorf("volume %s: commit %d is %d commits below the base checkpoint %d: %w",
			v.name, lsn, base.LSN-lsn, base.LSN, ErrUnreachable)
	}
	want := base.commit.Prev
	for at := base.LSN - 1; ; at-- {
		c, err := v.getCommit(ctx, at)
		if errors.Is(err, fence.ErrNotFound) {
			return nil, fmt.Errorf("volume %s: commit %d is missing below checkpoint %d (dropped with the commits below a checkpoint?): %w",
				v.name, at, base.LSN, ErrUnreachable)
		}
		if err != nil {
			return nil, err
		}
		if c.LSN != at || c.Hash() != want {
			return nil, fmt.Errorf("volume %s: commit %d (hash %.12s) is not the one commit %d chains to (%.12s): %w",
				v.name, at, c.Hash(), at+1, want, ErrCorrupt)
		}
		if at == lsn {
			return c, nil
		}
		want = c.Prev
	}
}

// ReadBack reads the commit at c's LSN from the remote itself, whatever
// this volume holds in memory or on local disk: what a reader of the
// remote would get now. c is the commit the caller expects there: of a
// packed commit, the first GET asks for as many last bytes as its record
// and footer take, not the commitRead of a commit of unknown size, and
// the remote reads less of the object. Whatever the remote holds is read
// whole as any commit is (a longer record with a second GET) and returned
// to be compared.
func (v *Volume) ReadBack(ctx context.Context, c *Commit) (*Commit, error) {
	first := int64(commitRead)
	if c.Version == packedVersion && len(c.raw) > 0 {
		first = int64(len(c.raw) + packedFooter)
	}
	back, err := v.readCommitTail(ctx, v.commitKey(c.LSN), first)
	if err != nil {
		return nil, fmt.Errorf("volume %s: read back commit %d: %w", v.name, c.LSN, err)
	}
	return back, nil
}

// ForgetLocal removes the local copies of the commit chain (commit files,
// the head hint and the local checkpoint) and empties the chain in memory,
// so that the next open reads the remote afresh. A caller whose proof
// refused commits this volume fetched (a forged or foreign commit) calls
// it: after the remote is repaired, a copy of the refused commit must not
// stand in for the remote's. Segments and index nodes stay: each is
// checked against the commit or checkpoint that names it before use.
func (v *Volume) ForgetLocal() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	files, err := os.ReadDir(filepath.Join(v.dir, "commits"))
	if err != nil {
		return fmt.Errorf("volume %s: forget local commits: %w", v.name, err)
	}
	for _, f := range files {
		if err := os.Remove(filepath.Join(v.dir, "commits", f.Name())); err != nil {
			return fmt.Errorf("volume %s: forget local commits: %w", v.name, err)
		}
	}
	for _, name := range []string{v.localCheckpoint(), filepath.Join(v.dir, "head")} {
		if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("volume %s: forget local commits: %w", v.name, err)
		}
	}
	v.base, v.tail = nil, nil
	return nil
}
