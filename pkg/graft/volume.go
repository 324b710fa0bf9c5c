package graft

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/silt-dev/silt/pkg/fence"
)

// Volume is one named page store: local files under a data directory,
// replicated to a fence.Store. It is safe for concurrent use; commits are
// serialised.
type Volume struct {
	// Failpoint, when set, is called at named steps of a commit
	// ("segment-written", "segment-uploaded", "commit-put", "head-updated"):
	// crash tests kill the process there.
	Failpoint func(step string)
	// CacheWholeBelow: a remote segment up to this size is fetched whole and
	// cached locally on first read; larger ones are read with range GETs.
	CacheWholeBelow int64
	// KeepMeta, when set, lists the metadata keys that commits older than
	// the latest keep in memory; the others, Prev and Writer are dropped
	// once a newer commit exists (the objects keep everything). A volume of
	// many commits then holds little per commit.
	KeepMeta []string

	name   string
	dir    string // local directory of this volume
	store  fence.Store
	writer string

	fs      fileSystem // nil: the real one (files.go)
	mu      sync.Mutex
	commits []*Commit // index i holds LSN i+1
	cache   map[string]*Segment
	indexed int  // commits the commit index holds (index.go)
	indexOK bool // the index may grow: it holds LSNs 1..indexed and nothing else
	loading bool // loadLocal is running: the index is written after it
}

// Open opens volume name with local files under dataDir and the remote in
// store, then refreshes from the remote: the remote's latest commit is the
// truth. The name must be a valid fence key segment. keepMeta, if given,
// sets KeepMeta before the commits are loaded.
func Open(ctx context.Context, dataDir, name string, store fence.Store, keepMeta ...string) (*Volume, error) {
	if err := fence.CheckKey(name); err != nil || strings.Contains(name, "/") {
		return nil, fmt.Errorf("volume name %q: must be one key segment of [A-Za-z0-9._-]", name)
	}
	v := &Volume{
		CacheWholeBelow: 16 << 20,
		name:            name,
		dir:             filepath.Join(dataDir, name),
		store:           store,
		writer:          randomID(),
		cache:           map[string]*Segment{},
		KeepMeta:        keepMeta,
	}
	for _, d := range []string{"segments", "commits", "tmp"} {
		if err := os.MkdirAll(filepath.Join(v.dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("open volume %s: %w", name, err)
		}
	}
	if err := v.loadLocal(); err != nil {
		return nil, err
	}
	if err := v.sameHistory(ctx); err != nil {
		return nil, err
	}
	if err := v.Refresh(ctx); err != nil {
		return nil, err
	}
	return v, nil
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

// loadLocal loads the local commits: the commit index's (index.go), then
// the commit files from the next LSN on, up to the first missing one. A
// commit file that fails its checksum is an error naming it. When the files
// disagree with the index, the files alone are loaded and the index rebuilt.
func (v *Volume) loadLocal() error {
	if v.KeepMeta == nil {
		return v.loadFiles()
	}
	v.loading = true
	defer func() { v.loading = false }()
	clean := v.loadIndex()
	err := v.loadFiles()
	if err != nil && v.indexed > 0 {
		v.commits, v.indexed, clean = nil, 0, false
		err = v.loadFiles()
	}
	if err != nil {
		return err
	}
	if !clean || v.indexed < len(v.commits)-1 {
		v.writeIndex()
	} else {
		v.indexOK = true
	}
	return nil
}

// loadFiles links the local commit files after the commits loaded so far.
func (v *Volume) loadFiles() error {
	known := uint64(len(v.commits))
	for lsn := known + 1; ; lsn++ {
		c, err := v.readCommitFile(lsn)
		if isNotExist(err) {
			break
		}
		if err != nil {
			return fmt.Errorf("open volume %s: %w", v.name, err)
		}
		if err := v.link(c); err != nil {
			return err
		}
	}
	if known > 0 && uint64(len(v.commits)) == known {
		// The index holds the latest commit: take it whole, from its file.
		c, err := v.readCommitFile(known)
		if err != nil {
			return fmt.Errorf("open volume %s: %w", v.name, err)
		}
		if c.Hash() != v.commits[known-1].Hash() {
			return fmt.Errorf("open volume %s: commit %d: %w: the file differs from the commit index", v.name, known, ErrCorrupt)
		}
		v.commits[known-1] = c
	}
	return nil
}

// ErrForeignRemote: the local files and the remote hold different
// histories of the volume (another remote, or a remote that lost commits).
var ErrForeignRemote = errors.New("local volume and remote disagree")

// sameHistory checks that the remote holds the local head commit, byte for
// byte: a data directory pointed at another remote (or at one that lost
// commits) must not chain new commits onto a history the remote never had.
func (v *Volume) sameHistory(ctx context.Context) error {
	if len(v.commits) == 0 {
		return nil
	}
	head := v.commits[len(v.commits)-1]
	key := v.commitKey(head.LSN)
	b, err := v.store.Get(ctx, key, fence.Range{})
	if errors.Is(err, fence.ErrNotFound) {
		return fmt.Errorf("open volume %s: local head is commit %d, %s has no %s: %w (another remote, or one that lost data; "+
			"move %s aside to start from the remote)", v.name, head.LSN, v.store, key, ErrForeignRemote, v.dir)
	}
	if err != nil {
		return fmt.Errorf("open volume %s: %w", v.name, err)
	}
	theirs, err := DecodeCommit(key, b)
	if err != nil {
		return fmt.Errorf("open volume %s: %w", v.name, err)
	}
	if theirs.Hash() != head.Hash() {
		return fmt.Errorf("open volume %s: local commit %d differs from %s in %s: %w (a different history; "+
			"move %s aside to start from the remote)", v.name, head.LSN, key, v.store, ErrForeignRemote, v.dir)
	}
	return nil
}

// link appends c to the chain after checking its LSN and prev hash.
func (v *Volume) link(c *Commit) error {
	want := uint64(len(v.commits)) + 1
	prev := ""
	if want > 1 {
		prev = v.commits[want-2].Hash()
	}
	switch {
	case c.LSN != want:
		return fmt.Errorf("volume %s: commit %d where %d was expected: %w", v.name, c.LSN, want, ErrCorrupt)
	case c.Prev != prev:
		return fmt.Errorf("volume %s: commit %d does not chain to commit %d (prev %.12s, want %.12s): %w", v.name, c.LSN, want-1, c.Prev, prev, ErrCorrupt)
	case c.Volume != v.name:
		return fmt.Errorf("volume %s: commit %d belongs to volume %q: %w", v.name, c.LSN, c.Volume, ErrCorrupt)
	}
	v.push(c)
	return nil
}

// push appends the new latest commit and slims the previous one.
func (v *Volume) push(c *Commit) {
	if n := len(v.commits); n > 0 && v.KeepMeta != nil {
		v.commits[n-1] = v.slim(v.commits[n-1])
		if !v.loading {
			v.appendIndex(v.commits[n-1])
		}
	}
	v.commits = append(v.commits, c)
}

// slim returns a copy of c with only what reads and maintenance need.
func (v *Volume) slim(c *Commit) *Commit {
	s := *c
	s.Prev, s.Writer, s.Volume = "", "", v.name
	s.Meta = make(map[string]string, len(v.KeepMeta))
	for _, k := range v.KeepMeta {
		if val, ok := c.Meta[k]; ok {
			s.Meta[k] = val
		}
	}
	return &s
}

// Head returns the latest LSN known (0 for an empty volume).
func (v *Volume) Head() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return uint64(len(v.commits))
}

// Latest returns the latest commit, or nil for an empty volume.
func (v *Volume) Latest() *Commit {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.commits) == 0 {
		return nil
	}
	return v.commits[len(v.commits)-1]
}

// Commits returns the commits from LSN from on (1 for all), as kept in
// memory: with KeepMeta set, all but the latest are slimmed.
func (v *Volume) Commits(from uint64) []*Commit {
	v.mu.Lock()
	defer v.mu.Unlock()
	if from < 1 {
		from = 1
	}
	if from > uint64(len(v.commits)) {
		return nil
	}
	return slices.Clone(v.commits[from-1:])
}

// Refresh adopts commits the remote has beyond the local head. With a local
// head it probes forward (GET head+1, head+2, ... until not found); on a cold
// start it lists the remote commits once.
func (v *Volume) Refresh(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.refresh(ctx)
}

func (v *Volume) refresh(ctx context.Context) error {
	if len(v.commits) == 0 {
		keys, err := v.store.List(ctx, v.name+"/commits/", "", 0)
		if err != nil {
			return fmt.Errorf("refresh volume %s: %w", v.name, err)
		}
		for _, k := range keys {
			if err := v.adopt(ctx, k); err != nil {
				return err
			}
		}
		return nil
	}
	for {
		err := v.adopt(ctx, v.commitKey(uint64(len(v.commits))+1))
		if errors.Is(err, fence.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// adopt fetches a remote commit, links it, and stores its local copy.
func (v *Volume) adopt(ctx context.Context, key string) error {
	b, err := v.store.Get(ctx, key, fence.Range{})
	if err != nil {
		return fmt.Errorf("refresh volume %s: %w", v.name, err)
	}
	c, err := DecodeCommit(key, b)
	if err != nil {
		return fmt.Errorf("refresh volume %s: %w", v.name, err)
	}
	if err := v.link(c); err != nil {
		return err
	}
	return v.writeFile(v.localCommit(c.LSN), b)
}

func (v *Volume) failpoint(step string) {
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
	byNo := func(a, b Page) int { return cmpU64(a.No, b.No) }
	if !slices.IsSortedFunc(pages, byNo) { // sort a copy: the caller's slice stays as it is
		pages = slices.Clone(pages)
		slices.SortFunc(pages, byNo)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	lsn := uint64(len(v.commits)) + 1
	seg, err := EncodeSegment(lsn, pages)
	if err != nil {
		return nil, err
	}
	c := v.newCommit(lsn, seg, pages, meta)
	if err := v.writeSegment(ctx, c.Segment.Key, seg, c.Segment.SHA256); err != nil {
		return nil, err
	}
	obj, err := c.Encode()
	if err != nil {
		return nil, err
	}
	// The local copy is written and fsynced while the commit object is
	// created; it is renamed into place only once the remote has it.
	local := make(chan staged, 1)
	go func() { local <- v.stageFile(v.localCommit(lsn), obj) }()
	err = v.store.Create(ctx, v.commitKey(lsn), obj)
	s := <-local
	if err != nil {
		s.drop()
		if errors.Is(err, fence.ErrExists) {
			return nil, v.lost(ctx, lsn)
		}
		return nil, fmt.Errorf("commit %d of volume %s: %w", lsn, v.name, err)
	}
	v.failpoint("commit-put")
	if s.err != nil {
		return nil, s.err
	}
	if err := s.place(); err != nil {
		return nil, err
	}
	v.push(c)
	v.failpoint("head-updated")
	return c, nil
}

func (v *Volume) newCommit(lsn uint64, seg []byte, pages []Page, meta map[string]string) *Commit {
	sum := sha256.Sum256(seg)
	now := time.Now().UTC()
	c := &Commit{
		Version: commitVersion, Volume: v.name, LSN: lsn,
		Segment: SegmentRef{
			Key:  fmt.Sprintf("%s/segments/%s-%013d-%s", v.name, lsnName(lsn), now.UnixMilli(), v.writer),
			Size: int64(len(seg)), SHA256: hex.EncodeToString(sum[:]),
		},
		Ranges: rangesOf(pages), Pages: uint64(len(pages)), Meta: meta, Writer: v.writer, Time: now,
	}
	if lsn > 1 {
		c.Prev = v.commits[lsn-2].Hash()
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
			v.failpoint("segment-written")
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
	v.failpoint("segment-uploaded")
	return nil
}

// lost handles a commit race we lost: adopt the remote state and report the winner.
func (v *Volume) lost(ctx context.Context, lsn uint64) error {
	if err := v.refresh(ctx); err != nil {
		return fmt.Errorf("commit %d of volume %s lost a race; adopting the winner: %w", lsn, v.name, err)
	}
	if uint64(len(v.commits)) < lsn {
		return fmt.Errorf("commit %d of volume %s: refused as existing, but not found on refresh", lsn, v.name)
	}
	return &ConflictError{LSN: lsn, Winner: v.commits[lsn-1]}
}
