package archive

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/graft"
	"github.com/silt-dev/silt/pkg/stream"
)

// Defaults of an Archive's slice bounds.
const (
	DefaultSliceEntries = 10000
	DefaultSliceBytes   = 4 << 20
)

// Archive is one stream's archive: the live log and its graft volume.
type Archive struct {
	// Compact bounds the compaction each Run does after its slices (zero:
	// graft's defaults, 64 MiB segments and at most 256 MiB merged a run);
	// NoCompact turns it off.
	Compaction graft.CompactOptions
	NoCompact  bool
	// HistoryKeepFor, when positive, is the archive's own retention: each
	// Run ends by pruning the archived segments whose entries are all older
	// than this (a prune commit and a checkpoint through the fence; gc
	// deletes the objects after its grace). Zero keeps history forever.
	HistoryKeepFor time.Duration
	// SliceEntries and SliceBytes bound one fold (one commit);
	// DefaultSliceEntries and DefaultSliceBytes unless set.
	SliceEntries int64
	SliceBytes   int64
	// MaxEntryBytes, when positive, stops a run at an entry larger than
	// this (stream.EntryBytes), naming it, before anything of its slice is
	// committed or trimmed.
	MaxEntryBytes int
	// Exact trims with XTRIM MINID = instead of ~ (which may keep a few
	// archived entries longer, never drops an unarchived one).
	Exact bool
	// Failpoint, when set, is called at each step boundary of a slice:
	// failpoint.AfterFold, the volume's commit steps, then AfterCommit and
	// AfterTrim (package failpoint lists them all).
	Failpoint failpoint.Func
	// RemoteName names the remote (without secrets) in the archive's record
	// in Redis and in errors.
	RemoteName string
	// Adopt lets Run take a remote's archive that this Redis has no record
	// of as the stream's own (a Redis restored from a backup taken before
	// the archive's first commit, or an archive from before records were
	// kept). Without it such a run refuses to trim or commit.
	Adopt bool
	// ConsistencyWait is how long a remote behind Redis's record is
	// refreshed before it is refused (DefaultConsistencyWait).
	ConsistencyWait time.Duration
	// ArchiveOnly reads the archive alone, without Redis's record (an
	// auditor's copy of a system whose Redis is gone): CheckRemote passes
	// and nothing is proven. Never set it on a run.
	ArchiveOnly bool

	log      *stream.Log
	vol      *graft.Volume
	warn     func(msg string)
	identity string             // the archive's identity, settled by checkIdentity or CheckRemote
	proven   brand.StreamID     // the highest watermark proven against Redis's record: trims stop there
	anchor   uint64             // the LSN of the commit proven last
	arenas   arenas             // blocks a created slice's pages were cut from
	flat     *stream.FlatReader // a run's folds read on it
	holds    holds              // what the run's trims found of the entries they remove
	openedAt time.Time          // when the open's refresh ended; zero once a run has used it
}

var escaper = strings.NewReplacer("_", "_5F", ".", "_2E")

// VolumeName names the volume of a stream: prefix, queue and stream joined
// by '.', each with '_' and '.' escaped so that distinct streams never share
// a volume.
func VolumeName(ks stream.Keyspace, name string) string {
	return escapeVolume(ks.Prefix) + "." + escapeVolume(ks.Queue) + "." + escapeVolume(name)
}

// escapeVolume escapes '_' and '.', and any byte a key segment cannot hold
// (a queue taken from a stream key's hash tag may hold ':'), as _XX.
func escapeVolume(s string) string {
	s = escaper.Replace(s)
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "_%02X", c)
		}
	}
	return b.String()
}

// volumeOf names the volume of a log: a group's dead letters get
// "<stream volume>.dead.<group>".
func volumeOf(l *stream.Log) string {
	v := VolumeName(l.Keyspace(), l.Name())
	if g := l.DeadGroup(); g != "" {
		v += ".dead." + escaper.Replace(g)
	}
	return v
}

// Open opens the archive of log's stream with local files under dataDir and
// the remote in store, refreshed to the remote's latest commit.
func Open(ctx context.Context, log *stream.Log, dataDir string, store fence.Store) (*Archive, error) {
	return OpenWith(ctx, log, dataDir, store, OpenOptions{})
}

// OpenOptions tune OpenWith; the zero value is Open's behaviour.
type OpenOptions struct {
	// Warn receives what the archive worked around, such as a checkpoint it
	// could not use and the commit chain it read instead.
	Warn func(msg string)
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, log *stream.Log, dataDir string, store fence.Store, opt OpenOptions) (*Archive, error) {
	a := &Archive{SliceEntries: DefaultSliceEntries, SliceBytes: DefaultSliceBytes, ConsistencyWait: DefaultConsistencyWait,
		log: log, warn: opt.Warn}
	gopt := graft.Options{KeepMeta: []string{metaW}, Warn: opt.Warn, Failpoint: a.failpoint}
	vol, err := graft.OpenWith(ctx, dataDir, volumeOf(log), store, gopt)
	if errors.Is(err, graft.ErrForeignRemote) {
		vol, err = a.setLocalAside(ctx, dataDir, store, gopt, err)
	}
	if err != nil {
		return nil, err
	}
	a.vol, a.openedAt = vol, time.Now()
	return a, nil
}

// freshOpen is how soon after the open a run may take the open's look at
// the remote for its own (a command's open and run, back to back): the
// run's refresh would read the same commit again, a round trip to a
// remote in another region for nothing. (A variable for the tests.)
var freshOpen = 100 * time.Millisecond

// justOpened reports whether the run starting now may take the open's look
// at the remote for its own: it is the archive's first run, started within
// freshOpen of the open. A commit made since is met as any made after a
// refresh is, by the create-only fence (a lost race), the proof's own
// refresh when Redis records a newer commit (reach), and the identity
// check before each trim (provenTrim).
func (a *Archive) justOpened() bool {
	opened := a.openedAt
	a.openedAt = time.Time{}
	return !opened.IsZero() && time.Since(opened) < freshOpen
}

// setLocalAside handles a local volume that disagrees with the remote
// (foreign: graft.ErrForeignRemote). When Redis records this stream's
// archive and the remote, opened cold, is proven against that record, the
// remote is the archive and the local copy is what is wrong: a commit a
// refused run adopted and was killed before it forgot, or a copy from
// elsewhere. The local volume directory is then moved aside (renamed,
// kept), with a warning, and the volume opened anew from the remote.
// Otherwise the refusal stands.
func (a *Archive) setLocalAside(ctx context.Context, dataDir string, store fence.Store, gopt graft.Options, foreign error) (*graft.Volume, error) {
	if _, recorded, err := a.log.ArchiveRecord(ctx); err != nil || !recorded {
		return nil, foreign
	}
	tmp, err := os.MkdirTemp("", "silt-proof-")
	if err != nil {
		return nil, foreign
	}
	defer os.RemoveAll(tmp)
	cold, err := graft.OpenWith(ctx, tmp, volumeOf(a.log), store, gopt)
	if err != nil {
		return nil, foreign
	}
	a.vol = cold
	wait := a.ConsistencyWait
	a.ConsistencyWait = 0 // the refusal stands unless the remote is proven now
	err = a.CheckRemote(ctx)
	a.ConsistencyWait, a.vol, a.identity = wait, nil, ""
	if err != nil {
		return nil, foreign
	}
	local := filepath.Join(dataDir, volumeOf(a.log))
	aside := fmt.Sprintf("%s.disagreed-%d", local, time.Now().UnixNano())
	if err := os.Rename(local, aside); err != nil {
		return nil, errors.Join(foreign, err)
	}
	if a.warn != nil {
		a.warn(fmt.Sprintf("the local volume disagreed with the remote, which Redis's record of the archive proves: the local copy was moved aside to %s and the volume opened from the remote (%v)", aside, foreign))
	}
	return graft.OpenWith(ctx, dataDir, volumeOf(a.log), store, gopt)
}

// Volume returns the archive's graft volume.
func (a *Archive) Volume() *graft.Volume { return a.vol }

// Identity returns the archive's identity as its newest commit carries it
// ("" before the first commit). Two Redis exporting streams of one name
// tell their histories apart by it.
func (a *Archive) Identity() string {
	if c := a.vol.Latest(); c != nil {
		return c.Meta[metaIdentity]
	}
	return ""
}

// Log returns the live stream's log.
func (a *Archive) Log() *stream.Log { return a.log }

func (a *Archive) failpoint(step failpoint.Name) {
	if a.Failpoint != nil {
		a.Failpoint(step)
	}
}

// state is what the latest commit's metadata says.
type state struct {
	W         brand.StreamID // last archived stream id; zero when nothing is
	Archived  int64          // records archived in all
	Malformed int64
	Bytes     int64  // record bytes archived
	NextPage  uint64 // ordinal of the next record page
}

// Metadata keys of a commit.
const (
	metaW         = "w"
	metaFirst     = "first"
	metaArchived  = "archived"
	metaMalformed = "malformed"
	metaBytes     = "bytes"
	metaNextPage  = "next_page"
)

func stateOf(c *graft.Commit) (state, error) {
	var s state
	if c == nil {
		return s, nil
	}
	var err error
	if s.W, err = brand.ParseStreamID(c.Meta[metaW]); err != nil {
		return s, fmt.Errorf("volume %s: commit %d: watermark: %w", c.Volume, c.LSN, err)
	}
	nums := []struct {
		key string
		dst *int64
	}{{metaArchived, &s.Archived}, {metaMalformed, &s.Malformed}, {metaBytes, &s.Bytes}}
	for _, n := range nums {
		if *n.dst, err = strconv.ParseInt(c.Meta[n.key], 10, 64); err != nil {
			return s, fmt.Errorf("volume %s: commit %d: %s %q: not a number", c.Volume, c.LSN, n.key, c.Meta[n.key])
		}
	}
	if s.NextPage, err = strconv.ParseUint(c.Meta[metaNextPage], 10, 64); err != nil {
		return s, fmt.Errorf("volume %s: commit %d: next page %q: not a number", c.Volume, c.LSN, c.Meta[metaNextPage])
	}
	return s, nil
}

func (s state) meta(first brand.StreamID, identity string) map[string]string {
	return map[string]string{metaIdentity: identity,
		metaW: s.W.String(), metaFirst: first.String(),
		metaArchived: strconv.FormatInt(s.Archived, 10), metaMalformed: strconv.FormatInt(s.Malformed, 10),
		metaBytes: strconv.FormatInt(s.Bytes, 10), metaNextPage: strconv.FormatUint(s.NextPage, 10),
	}
}

// Watermark returns the last archived stream id as of the latest commit known
// (refreshing first), and false when nothing is archived.
func (a *Archive) Watermark(ctx context.Context) (brand.StreamID, bool, error) {
	if err := a.vol.Refresh(ctx); err != nil {
		return brand.StreamID{}, false, err
	}
	s, err := stateOf(a.vol.Latest())
	return s.W, a.vol.Head() > 0, err
}
