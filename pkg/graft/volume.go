package graft

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/fence/durable"
)

// Volume is one named page store: local files under a data directory,
// replicated to a fence.Store. It is safe for concurrent use; commits are
// serialised.
//
// In memory a volume holds its base checkpoint (the entries as of a commit,
// in leaves fetched on demand) and the commits after it, so its memory is
// bounded by the checkpoint interval, not by its history.
type Volume struct {
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
	syncMu    sync.Mutex              // guards syncing, so Sync waits while mu is held by a commit
	syncing   *dirSync                // the last commit's local record directory sync, maybe running
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
	// Failpoint, when set, is called at the steps of a commit, a
	// checkpoint and a compaction (package failpoint lists them): crash
	// tests kill the process there.
	Failpoint failpoint.Func
	// CacheWholeBelow: a remote segment up to this size is fetched whole and
	// cached locally on first read; larger ones are read with range GETs
	// (0: 16 MiB).
	CacheWholeBelow int64
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
	if opt.CacheWholeBelow == 0 {
		opt.CacheWholeBelow = 16 << 20
	}
	v := &Volume{
		Options: opt,
		name:    name,
		dir:     filepath.Join(dataDir, name),
		store:   store,
		writer:  randomID(),
		cache:   map[string]*Segment{},
		indexes: map[string][]indexEntry{},
		leaves:  map[string]any{},
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
	reads := v.readAtOnce(ctx)
	defer reads.stop() // no read outlives the open
	if err := v.sameHistory(ctx, reads.head); err != nil {
		return nil, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	current, err := v.catchUp(ctx, reads.checkpoints)
	if err != nil || current {
		return v, err
	}
	return v, v.refreshFrom(ctx, reads.next)
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

func (v *Volume) failpoint(step failpoint.Name) {
	if v.Failpoint != nil {
		v.Failpoint(step)
	}
}
