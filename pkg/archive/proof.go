package archive

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/graft"
	"github.com/silt-dev/silt/pkg/stream"
)

// No trim without proof, and the proof lives in the system being trimmed.
// Redis holds the archive's record (stream.ArchiveRecord): its identity,
// chosen at the first commit, and the anchor, the LSN, watermark and chain
// hash of the newest commit a run read back from the remote. The record
// only moves forward. Before a run commits or trims, and before a reader
// merges, the remote must reach the anchor (its chain holds, at the
// recorded LSN, the commit of the recorded hash) and any commit above the
// anchor must carry the recorded identity. A run trims only up to a
// watermark so proven: the anchor's, a commit above it whose watermark is
// its segment's last record, or a commit of its own read back. A remote
// restored from a backup or lagging (behind the anchor), a forged commit
// (another hash), another Redis's archive under a shared prefix (another
// identity or no record) and an archive adopted by someone else (a new
// identity above the anchor) each fail one of these, with nothing
// committed, trimmed or read.

// ErrNotThisArchive is wrapped by a run's or a reader's error when the
// remote's history cannot be proven to be this stream's; nothing was
// trimmed or committed.
var ErrNotThisArchive = errors.New("the remote's archive is not proven to be this stream's")

// ErrRemoteBehind is wrapped by a run's or a reader's error when the remote
// holds fewer commits than Redis recorded: a bucket restored from a backup,
// a region that has not seen the newest writes, commits deleted, or the
// wrong prefix. Nothing was committed or trimmed.
var ErrRemoteBehind = errors.New("the remote is behind Redis's record of the archive")

// ErrNeverRecorded is wrapped (with ErrNotThisArchive) by the refusal of a
// remote that holds an archive of the stream's volume which Redis never
// recorded: another Redis's stream of the same name, or this Redis
// restored or flushed. Such an archive can be read alone (ArchiveOnly) or,
// if it is this stream's history, adopted by a run (Adopt).
var ErrNeverRecorded = errors.New("an archive this Redis never recorded")

// DefaultConsistencyWait is how long a remote behind Redis's record is
// refreshed before the refusal: an eventually consistent store catches up.
const DefaultConsistencyWait = 5 * time.Second

// metaIdentity is the commit metadata key of the archive's identity.
const metaIdentity = "identity"

// prove reads Redis's record and proves the remote against it: the remote
// reaches the anchor and holds there the recorded commit, and the newest
// commit above it carries the recorded identity. recorded is false when
// Redis holds no record (the caller decides what an unrecorded archive
// means).
func (a *Archive) prove(ctx context.Context) (rec stream.ArchiveRecord, recorded bool, err error) {
	if rec, recorded, err = a.log.ArchiveRecord(ctx); err != nil || !recorded {
		return rec, recorded, err
	}
	if err := a.reach(ctx, rec); err != nil {
		return rec, true, err
	}
	if rec.LSN > 0 {
		if err := a.matchAnchor(ctx, rec); err != nil {
			return rec, true, a.refuse(err)
		}
	}
	if c := a.vol.Latest(); c != nil && c.LSN > rec.LSN && c.Meta[metaIdentity] != rec.Identity {
		return rec, true, a.refuse(a.foreignHead(rec, c))
	}
	return rec, true, nil
}

// refuse returns err, a refusal of commits the volume read from the
// remote; their local copies are forgotten (graft.Volume.ForgetLocal), so
// that once the remote is repaired the data directory does not hold the
// refused commit as if it were the remote's.
func (a *Archive) refuse(err error) error {
	if errors.Is(err, ErrNotThisArchive) && !errors.Is(err, ErrRemoteBehind) {
		if ferr := a.vol.ForgetLocal(); ferr != nil {
			a.warnf("%v", ferr)
		}
	}
	return err
}

// reach refreshes the volume until its head is at or above the record's
// LSN, for at most ConsistencyWait, and refuses a remote still behind.
// A run records a commit after making it, so a record above the volume's
// head (a peer's commit made since this volume last looked) is looked for
// on the remote before anything is concluded.
func (a *Archive) reach(ctx context.Context, rec stream.ArchiveRecord) error {
	deadline, pause := time.Now().Add(a.ConsistencyWait), 100*time.Millisecond
	for a.vol.Head() < rec.LSN {
		if err := a.vol.Refresh(ctx); err != nil {
			return err
		}
		if a.vol.Head() >= rec.LSN {
			return nil
		}
		if time.Now().Add(pause).After(deadline) {
			return a.behind(rec)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
	return nil
}

// behind is the refusal of a remote whose head is below the anchor.
func (a *Archive) behind(rec stream.ArchiveRecord) error {
	if a.vol.Head() == 0 {
		return fmt.Errorf("%s was archived to %s (volume %s, %d commits, W %s); this remote holds none of it: point the remote there "+
			"(or, if it is that remote, it lost its history: restore it from a copy holding commit %d): %w: %w; nothing committed or trimmed",
			a.log.Key(), rec.Remote, rec.Volume, rec.LSN, rec.W, rec.LSN, ErrRemoteBehind, ErrNotThisArchive)
	}
	return fmt.Errorf("%s: Redis recorded commit %d (W %s) of its archive on %s; this remote's newest commit of volume %s is %d "+
		"(still after %s): %w: a bucket restored from an older copy, a region that has not seen the newest writes, commits deleted, "+
		"or the wrong prefix; nothing committed or trimmed. Repair: copy commits %d-%d back from a warm data directory or a replica "+
		"(docs/operations.md, \"The remote is behind Redis's record\"), or read the remote that holds commit %d",
		a.log.Key(), rec.LSN, rec.W, rec.Remote, a.vol.Name(), a.vol.Head(), a.ConsistencyWait, ErrRemoteBehind,
		a.vol.Head()+1, rec.LSN, rec.LSN)
}

// matchAnchor checks that the remote's chain holds, at the record's LSN,
// the commit Redis recorded: its hash (a record of an older build, without
// one: its watermark).
func (a *Archive) matchAnchor(ctx context.Context, rec stream.ArchiveRecord) error {
	c, err := a.vol.CommitAt(ctx, rec.LSN)
	if errors.Is(err, graft.ErrUnreachable) || errors.Is(err, graft.ErrCorrupt) {
		return fmt.Errorf("%s: the commit Redis recorded (%d, W %s) cannot be found on this remote's chain: %w: %w; nothing committed or trimmed",
			a.log.Key(), rec.LSN, rec.W, err, ErrNotThisArchive)
	}
	if err != nil {
		return err
	}
	plain := c.Replaces == nil && c.PruneBelow == 0
	switch {
	case rec.Hash != "" && c.Hash() != rec.Hash:
		return fmt.Errorf("%s: commit %d of volume %s on the remote has hash %.16s, Redis recorded %.16s (W %s): "+
			"the remote's commit was rewritten, or this is another archive; %w; nothing committed or trimmed",
			a.log.Key(), rec.LSN, a.vol.Name(), c.Hash(), rec.Hash, rec.W, ErrNotThisArchive)
	case rec.Hash == "" && plain && c.Meta[metaW] != rec.W:
		return fmt.Errorf("%s: commit %d of volume %s on the remote says W %s, Redis recorded W %s: %w; nothing committed or trimmed",
			a.log.Key(), rec.LSN, a.vol.Name(), c.Meta[metaW], rec.W, ErrNotThisArchive)
	}
	return nil
}

// foreignHead is the refusal of a newest commit, above the anchor, under
// another identity.
func (a *Archive) foreignHead(rec stream.ArchiveRecord, c *graft.Commit) error {
	return fmt.Errorf("%s: this Redis recorded its archive as %s on %s (volume %s, LSN %d); the remote's commit %d of volume %s "+
		"carries archive %q: another Redis writes here (a shared prefix, or it adopted this archive): %w; nothing committed or trimmed",
		a.log.Key(), rec.Identity, rec.Remote, rec.Volume, rec.LSN, c.LSN, a.vol.Name(), c.Meta[metaIdentity], ErrNotThisArchive)
}

// checkIdentity proves the remote for a run and settles the identity this
// run commits under and the watermark it may trim to.
func (a *Archive) checkIdentity(ctx context.Context) error {
	if noProof { // the negative control: take any remote as ours
		var err error
		a.identity, err = a.log.ClaimArchiveIdentity(ctx, newIdentity(), a.vol.Name(), a.RemoteName)
		if st, serr := stateOf(a.vol.Latest()); serr == nil {
			a.proven = st.W
		}
		return err
	}
	rec, recorded, err := a.prove(ctx)
	if err != nil {
		return err
	}
	latest := a.vol.Latest()
	switch {
	case recorded:
		a.identity = rec.Identity
		return a.proveHead(ctx, rec)
	case latest != nil && !a.Adopt:
		return a.refuse(fmt.Errorf("archive %s: the remote's volume %s holds %w (LSN %d, W %s): another Redis's stream of the same name (a shared prefix), or this Redis was restored or flushed; %w; nothing trimmed (adopt it only if it is this stream's history)",
			a.log.Key(), a.vol.Name(), ErrNeverRecorded, latest.LSN, latest.Meta[metaW], ErrNotThisArchive))
	case latest != nil:
		return a.refuse(a.adopt(ctx, latest))
	}
	a.identity, err = a.log.ClaimArchiveIdentity(ctx, newIdentity(), a.vol.Name(), a.RemoteName)
	return err
}

// proveHead settles the watermark a run may trim to before its own
// commits: the anchor's, or, when the remote is ahead of the record (a
// crash between a commit and its record, or compaction since), the head's
// once proveAbove accepts it; the record then moves up to the head.
func (a *Archive) proveHead(ctx context.Context, rec stream.ArchiveRecord) error {
	head := a.vol.Latest()
	if head == nil || head.LSN == rec.LSN {
		w, err := parseW(rec.W)
		a.proven, a.anchor = w, rec.LSN
		return err
	}
	w, err := a.proveAbove(ctx, rec)
	if err != nil {
		return a.refuse(err)
	}
	// A refused run changes nothing: the record moves only for a
	// watermark the run may trim to.
	if err := a.belowTop(ctx, w); err != nil {
		return err
	}
	recovered, err := a.neverHeld(ctx, rec)
	if err != nil {
		return err
	}
	if recovered > 0 {
		a.warnf("Redis's record of the archive of %s was at commit %d (W %s), the remote's head is %d (W %s): %d entries the commits above hold "+
			"were never in this Redis (a promoted replica, a split brain, a Redis restored from a backup); they are read from the archive, and the record moves to %d",
			a.log.Key(), rec.LSN, rec.W, head.LSN, w, recovered, head.LSN)
	}
	return a.recordWith(ctx, head, w, recovered)
}

// ProveHead proves the remote as a run would and moves Redis's record up to
// the remote's head: archiver gc does it before it drops old commits, so
// that the commit the record names is never among them.
func (a *Archive) ProveHead(ctx context.Context) error {
	if noProof {
		return nil
	}
	rec, recorded, err := a.prove(ctx)
	if err != nil || !recorded {
		return err
	}
	a.identity = rec.Identity
	return a.proveHead(ctx, rec)
}

// proveAbove checks the commits above the anchor, which no record names
// yet: the newest that wrote pages must end at the record its watermark
// names, and the head's watermark must be that one, at or above the
// anchor's. It returns the head's watermark. (Their chain to the anchor
// was checked as the volume linked them.)
func (a *Archive) proveAbove(ctx context.Context, rec stream.ArchiveRecord) (brand.StreamID, error) {
	head := a.vol.Latest()
	st, err := stateOf(head)
	if err != nil {
		return st.W, err
	}
	recW, err := parseW(rec.W)
	if err != nil {
		return st.W, fmt.Errorf("archive record of %s: W %q: %w", a.log.Key(), rec.W, err)
	}
	for lsn := head.LSN; lsn > rec.LSN; lsn-- {
		c, err := a.vol.CommitAt(ctx, lsn)
		if err != nil {
			return st.W, err
		}
		if c.Replaces != nil || c.PruneBelow > 0 || len(c.Ranges) == 0 {
			continue
		}
		if err := a.checkLastRecord(ctx, c); err != nil {
			return st.W, err
		}
		if c.Meta[metaW] != st.W.String() {
			return st.W, fmt.Errorf("%s: the remote's head %d says W %s, its newest commit of pages %d ends at %s: %w; nothing committed or trimmed",
				a.log.Key(), head.LSN, st.W, c.LSN, c.Meta[metaW], ErrNotThisArchive)
		}
		break
	}
	if st.W.Compare(recW) < 0 {
		return st.W, fmt.Errorf("%s: the remote's head %d says W %s, below the W %s Redis recorded at %d: %w; nothing committed or trimmed",
			a.log.Key(), head.LSN, st.W, rec.W, rec.LSN, ErrNotThisArchive)
	}
	return st.W, nil
}

// checkLastRecord checks that commit c's watermark is the stream id of the
// last record its pages hold: a forged W (with its checksum recomputed)
// names an entry the segment does not end with.
func (a *Archive) checkLastRecord(ctx context.Context, c *graft.Commit) error {
	last := c.Ranges[len(c.Ranges)-1].Hi
	b, err := a.vol.ReadAt(ctx, c.LSN, last)
	if err != nil {
		return fmt.Errorf("archive %s: commit %d, page %d: %w", a.log.Key(), c.LSN, last, err)
	}
	sid, err := streamIDOf(b)
	if err != nil {
		return fmt.Errorf("archive %s: commit %d, page %d: %w", a.log.Key(), c.LSN, last, err)
	}
	if sid.String() != c.Meta[metaW] {
		return fmt.Errorf("%s: commit %d of volume %s says W %s, its last record is %s: the commit was rewritten; %w; nothing committed or trimmed",
			a.log.Key(), c.LSN, a.vol.Name(), c.Meta[metaW], sid, ErrNotThisArchive)
	}
	return nil
}

// adopt takes the remote's archive, which this Redis has no record of, as
// the stream's, under a new identity: the previous owner (another Redis,
// or this one before a flush) is refused once a commit carries it.
func (a *Archive) adopt(ctx context.Context, latest *graft.Commit) error {
	st, err := stateOf(latest)
	if err != nil {
		return err
	}
	if err := a.belowTop(ctx, st.W); err != nil {
		return err
	}
	old := latest.Meta[metaIdentity]
	a.identity = newIdentity()
	err = a.log.AdoptArchive(ctx, stream.ArchiveRecord{Identity: a.identity, Volume: a.vol.Name(), Remote: a.RemoteName,
		LSN: latest.LSN, W: wString(st.W), Hash: latest.Hash(), AdoptedFrom: old})
	if errors.Is(err, stream.ErrRecorded) {
		return fmt.Errorf("archive %s: another run recorded the archive while this one adopted it: %w", a.log.Key(), ErrNotThisArchive)
	}
	if err != nil {
		return err
	}
	a.warnf("adopted the archive of volume %s at commit %d (W %s): its identity was %q, this Redis now records %q; commits from here on carry the new one, and the previous owner's runs are refused",
		a.vol.Name(), latest.LSN, st.W, old, a.identity)
	a.proven, a.anchor = st.W, latest.LSN
	return nil
}

// record moves the archive's record in Redis forward to commit c, whose
// watermark is w and which is proven (read back, or checked above the
// anchor): the run may trim up to w from now on. A record gone meanwhile
// stops the run before any trim.
func (a *Archive) record(ctx context.Context, c *graft.Commit, w brand.StreamID) error {
	return a.recordWith(ctx, c, w, 0)
}

// recordWith is record, counting recovered entries this Redis never held
// (stream.ArchiveRecord.Recovered) with the move.
func (a *Archive) recordWith(ctx context.Context, c *graft.Commit, w brand.StreamID, recovered int64) error {
	_, err := a.log.RecordArchive(ctx, stream.ArchiveRecord{Identity: a.identity, Volume: a.vol.Name(), Remote: a.RemoteName,
		LSN: c.LSN, W: wString(w), Hash: c.Hash(), AddRecovered: recovered})
	if errors.Is(err, stream.ErrRecordLost) {
		return fmt.Errorf("archive %s: %w: %w; nothing trimmed", a.log.Key(), err, ErrNotThisArchive)
	}
	if err != nil {
		return err
	}
	a.proven, a.anchor = w, max(a.anchor, c.LSN)
	return nil
}

// recordHead records the volume's head (a compaction or prune commit of
// this run: the watermark stays), so the anchor stays near the head and
// gc --drop-old-commits never drops the commit it names.
func (a *Archive) recordHead(ctx context.Context) error {
	if a.identity == "" || noProof {
		return nil
	}
	head := a.vol.Latest()
	if head == nil || head.LSN <= a.anchor || head.Meta[metaIdentity] != a.identity {
		return nil
	}
	st, err := stateOf(head)
	if err != nil {
		return err
	}
	if err := a.readBack(ctx, head); err != nil {
		return err
	}
	return a.record(ctx, head, st.W)
}

// readBack reads commit c back from the remote before it is recorded and
// trimmed by: a remote that acknowledged a create it does not keep (or
// returns another commit) is refused here.
func (a *Archive) readBack(ctx context.Context, c *graft.Commit) error {
	if noProof {
		return nil
	}
	synced := make(chan error, 1) // the local record's directory, synced beside the create and the read
	go func() { synced <- a.vol.Sync() }()
	back, err := a.vol.ReadBack(ctx, c)
	if serr := <-synced; serr != nil {
		return fmt.Errorf("archive %s: commit %d: %w; nothing trimmed", a.log.Key(), c.LSN, serr)
	}
	if err != nil {
		return fmt.Errorf("archive %s: commit %d was created but does not read back from the remote: %w; nothing trimmed", a.log.Key(), c.LSN, err)
	}
	if back.Hash() != c.Hash() {
		return fmt.Errorf("archive %s: commit %d reads back from the remote with hash %.16s, this run created %.16s: %w; nothing trimmed",
			a.log.Key(), c.LSN, back.Hash(), c.Hash(), ErrNotThisArchive)
	}
	return nil
}

// provenTrim checks, right before a trim up to w, that the remote's latest
// commit is still under this archive's identity (a lost race adopts the
// winner's state) and that w is at or below the stream's last generated id.
func (a *Archive) provenTrim(ctx context.Context, w brand.StreamID) error {
	if noProof {
		return nil
	}
	if c := a.vol.Latest(); c != nil && c.LSN > a.anchor && c.Meta[metaIdentity] != a.identity {
		return fmt.Errorf("archive %s: commit %d on the remote carries archive %q, not this stream's %q: %w; nothing trimmed",
			a.log.Key(), c.LSN, c.Meta[metaIdentity], a.identity, ErrNotThisArchive)
	}
	return a.belowTop(ctx, w)
}

// belowTop refuses a watermark above the stream's last generated id.
func (a *Archive) belowTop(ctx context.Context, w brand.StreamID) error {
	info, err := a.log.Info(ctx)
	if err != nil {
		return err
	}
	top, err := brand.ParseStreamID(info.LastGeneratedID)
	if err != nil || w.Compare(top) > 0 {
		return fmt.Errorf("archive %s: the remote's watermark %s is above the stream's last generated id %q: this Redis never held the "+
			"newest archived entries (a replica promoted before it received them, a Redis restored from an older backup) or the archive is "+
			"another's: %w; nothing committed, trimmed or recorded (once producers write past %s, a run goes on; docs/operations.md, \"After a failover\")",
			a.log.Key(), w, info.LastGeneratedID, ErrNotThisArchive, w)
	}
	return nil
}

func newIdentity() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func wString(w brand.StreamID) string {
	if w.IsZero() {
		return ""
	}
	return w.String()
}

func parseW(s string) (brand.StreamID, error) {
	if s == "" {
		return brand.StreamID{}, nil
	}
	return brand.ParseStreamID(s)
}

func (a *Archive) warnf(format string, args ...any) {
	if a.warn != nil {
		a.warn(fmt.Sprintf(format, args...))
	}
}

// CheckRemote proves the remote for a reader (a merged read, a status, an
// export, a worker recovering payloads) before it merges anything: the
// remote must reach Redis's record of the stream's archive and hold the
// recorded commit there, and an archive Redis never recorded is refused
// (another Redis's stream of the same name, or this Redis restarted empty:
// ArchiveOnly reads it alone). The error names the remote Redis recorded
// (without secrets). A stream never archived passes.
func (a *Archive) CheckRemote(ctx context.Context) error {
	if a.ArchiveOnly {
		return nil
	}
	rec, recorded, err := a.prove(ctx)
	if err != nil {
		return err
	}
	latest := a.vol.Latest()
	if recorded && latest != nil && latest.LSN > rec.LSN {
		if _, err := a.proveAbove(ctx, rec); err != nil {
			return a.refuse(err)
		}
	}
	if !recorded && latest != nil {
		return a.refuse(fmt.Errorf("%s: this remote's volume %s holds %w (%d commits, W %s, identity %q): "+
			"another Redis's stream of the same name (a shared prefix), or this Redis was restored empty or from a backup: %w "+
			"(it can be read alone, without Redis's record; adopt it as this stream's history only if it is)",
			a.log.Key(), a.vol.Name(), ErrNeverRecorded, latest.LSN, latest.Meta[metaW], latest.Meta[metaIdentity], ErrNotThisArchive))
	}
	a.identity = rec.Identity
	return nil
}
