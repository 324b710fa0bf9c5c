package graft

import (
	"errors"
	"fmt"
)

// Errors of the package.
var (
	// ErrCorrupt: a checksum or structural check failed. The error names the
	// file or object.
	ErrCorrupt = errors.New("corrupt")
	// ErrNewerFormat: the file or object was written by a newer format
	// version; it is refused rather than misread.
	ErrNewerFormat = errors.New("newer format version")
	// ErrPageNotFound: no commit up to the requested LSN wrote the page.
	ErrPageNotFound = errors.New("page not found")
)

// ErrForeignRemote: the local files and the remote hold different
// histories of the volume (another remote, or a remote that lost commits).
var ErrForeignRemote = errors.New("local volume and remote disagree")

// ErrMissingCommits: the remote chain has a hole.
var ErrMissingCommits = errors.New("commits missing from the remote")

// ErrDropped is wrapped with ErrMissingCommits or ErrUnreachable when the
// commits asked for were dropped on purpose (DropOldCommits): only a
// checkpoint at or above the drop opens the volume.
var ErrDropped = errors.New("commits dropped below a checkpoint")

// ErrBadIndex marks an error about a checkpoint or one of its index nodes
// (with ErrCorrupt: bad or missing), which RebuildIndex rebuilds from the
// commit chain.
var ErrBadIndex = errors.New("checkpoint index")

// indexError is an error marked ErrBadIndex, its message unchanged.
type indexError struct{ err error }

func (e indexError) Error() string   { return e.err.Error() }
func (e indexError) Unwrap() []error { return []error{e.err, ErrBadIndex} }

// badIndex marks err (nil stays nil) as a checkpoint's or index node's.
func badIndex(err error) error {
	if err == nil {
		return nil
	}
	return indexError{err}
}

// ErrNotMonotonic: the volume rewrites pages, so it is not compacted.
var ErrNotMonotonic = errors.New("volume is not monotonic")

// ErrGraceTooShort: GC was asked for a grace under MinGrace.
var ErrGraceTooShort = errors.New("gc grace too short")

// ErrUnreachable is wrapped by CommitAt when the chain from the head cannot
// be followed down to the LSN asked for (a commit object missing below the
// base checkpoint, or too far below it).
var ErrUnreachable = errors.New("the commit chain does not reach this LSN")

// errRanged marks a segment left for a ranged read, in order.
var errRanged = errors.New("segment left for a ranged read")

// ConflictError is returned by a commit that lost the race for its LSN. The
// volume has adopted Winner; the caller re-reads its state and goes on.
type ConflictError struct {
	LSN    uint64
	Winner *Commit
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("commit %d lost the race to writer %s", e.LSN, e.Winner.Writer)
}

// IsConflict reports whether err is a lost commit race.
func IsConflict(err error) bool {
	var ce *ConflictError
	return errors.As(err, &ce)
}
