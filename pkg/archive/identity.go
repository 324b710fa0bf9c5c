package archive

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/graft"
	"github.com/silt-dev/silt/pkg/stream"
)

// No trim without proof. A remote's latest commit says up to where the
// stream is archived (W), and a run trims the live stream up to W. Before
// it does, the run proves the remote's history is this stream's: the
// archive's identity, chosen at its first commit, is carried by every commit
// and recorded in Redis (stream.ArchiveRecord), and the two must agree; and
// W must be at or below the stream's last generated id. Two Redis sharing a
// bucket prefix, a Redis restored from a backup or flushed, or a forged
// commit each fail one of the two, with nothing trimmed.

// ErrNotThisArchive is wrapped by a run's error when the remote's history
// cannot be proven to be this stream's; nothing was trimmed or committed.
var ErrNotThisArchive = errors.New("the remote's archive is not proven to be this stream's")

// metaIdentity is the commit metadata key of the archive's identity.
const metaIdentity = "identity"

// checkIdentity compares the remote's latest commit with Redis's record
// and settles the identity this run commits under.
func (a *Archive) checkIdentity(ctx context.Context) error {
	if noProof { // the negative control: take any remote as ours
		var err error
		a.identity, err = a.log.ClaimArchiveIdentity(ctx, newIdentity(), a.vol.Name(), a.RemoteName)
		return err
	}
	rec, recorded, latest, err := a.recordAndLatest(ctx)
	if err != nil {
		return err
	}
	switch {
	case recorded && latest != nil && latest.Meta[metaIdentity] != rec.Identity:
		return fmt.Errorf("archive %s: this Redis recorded its archive as %s on %s (volume %s, LSN %d); the remote's volume %s holds archive %q at LSN %d: %w; nothing trimmed",
			a.log.Key(), rec.Identity, rec.Remote, rec.Volume, rec.LSN, a.vol.Name(), latest.Meta[metaIdentity], latest.LSN, ErrNotThisArchive)
	case recorded && latest == nil && rec.LSN > 0:
		return fmt.Errorf("archive %s: this Redis recorded %d commits of its archive on %s (volume %s); this remote holds none: wrong remote? %w",
			a.log.Key(), rec.LSN, rec.Remote, rec.Volume, ErrNotThisArchive)
	case recorded:
		a.identity = rec.Identity
		return nil
	case latest != nil && !a.Adopt:
		return fmt.Errorf("archive %s: the remote's volume %s holds an archive (LSN %d, W %s) that this Redis never recorded: another Redis's stream of the same name (a shared prefix), or this Redis was restored or flushed; %w; nothing trimmed (adopt it only if it is this stream's history)",
			a.log.Key(), a.vol.Name(), latest.LSN, latest.Meta[metaW], ErrNotThisArchive)
	case latest != nil: // adopted
		a.identity = latest.Meta[metaIdentity]
		if a.identity == "" { // an archive from before identities: it gets one now
			a.identity = newIdentity()
		}
		st, err := stateOf(latest)
		if err != nil {
			return err
		}
		got, err := a.log.ClaimArchiveIdentity(ctx, a.identity, a.vol.Name(), a.RemoteName)
		if err != nil {
			return err
		}
		if got != a.identity {
			return fmt.Errorf("archive %s: another run recorded archive %q while this one adopted %q: %w", a.log.Key(), got, a.identity, ErrNotThisArchive)
		}
		return a.record(ctx, latest.LSN, st.W)
	}
	a.identity, err = a.log.ClaimArchiveIdentity(ctx, newIdentity(), a.vol.Name(), a.RemoteName)
	return err
}

// recordAndLatest reads Redis's record of the archive, then the remote's
// latest commit as of that read. A run records a commit after making it, so
// a record above the volume's head (another archiver committed since this
// one last looked: its first commit, say) is first looked for on the
// remote; only what is still missing after that is a wrong remote.
func (a *Archive) recordAndLatest(ctx context.Context) (rec stream.ArchiveRecord, recorded bool, latest *graft.Commit, err error) {
	if rec, recorded, err = a.log.ArchiveRecord(ctx); err != nil {
		return rec, false, nil, err
	}
	if recorded && a.vol.Head() < rec.LSN {
		if err := a.vol.Refresh(ctx); err != nil {
			return rec, recorded, nil, err
		}
	}
	return rec, recorded, a.vol.Latest(), nil
}

// record updates the archive's record in Redis to lsn and w. A record
// gone meanwhile stops the run before any trim.
func (a *Archive) record(ctx context.Context, lsn uint64, w brand.StreamID) error {
	ws := ""
	if !w.IsZero() {
		ws = w.String()
	}
	err := a.log.RecordArchive(ctx, stream.ArchiveRecord{Identity: a.identity, Volume: a.vol.Name(), Remote: a.RemoteName, LSN: lsn, W: ws})
	if errors.Is(err, stream.ErrRecordLost) {
		return fmt.Errorf("archive %s: %w: %w; nothing trimmed", a.log.Key(), err, ErrNotThisArchive)
	}
	return err
}

// provenTrim checks, right before a trim up to w, that the remote's latest
// commit is still under this archive's identity (a lost race adopts the
// winner's state) and that w is at or below the stream's last generated id.
func (a *Archive) provenTrim(ctx context.Context, w brand.StreamID) error {
	if noProof {
		return nil
	}
	if c := a.vol.Latest(); c != nil && c.Meta[metaIdentity] != a.identity && !(a.Adopt && c.Meta[metaIdentity] == "") {
		return fmt.Errorf("archive %s: commit %d on the remote carries archive %q, not this stream's %q: %w; nothing trimmed",
			a.log.Key(), c.LSN, c.Meta[metaIdentity], a.identity, ErrNotThisArchive)
	}
	info, err := a.log.Info(ctx)
	if err != nil {
		return err
	}
	top, err := brand.ParseStreamID(info.LastGeneratedID)
	if err != nil || w.Compare(top) > 0 {
		return fmt.Errorf("archive %s: the remote's watermark %s is above the stream's last generated id %q: %w; nothing trimmed",
			a.log.Key(), w, info.LastGeneratedID, ErrNotThisArchive)
	}
	return nil
}

func newIdentity() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// CheckRemote tells a reader (a merged read, a status, a worker recovering
// payloads) that its remote is not where this stream's archive is, rather
// than let it see only the live tail: when Redis recorded commits of the
// archive and this remote holds none, or holds another archive, the error
// names the remote Redis recorded (without secrets). A stream never
// archived, or archived before records were kept, passes.
func (a *Archive) CheckRemote(ctx context.Context) error {
	rec, recorded, latest, err := a.recordAndLatest(ctx)
	if err != nil || !recorded {
		return err
	}
	switch {
	case latest == nil && rec.LSN > 0:
		return fmt.Errorf("%s was archived to %s (volume %s, %d commits, W %s); this remote holds none of it: point the remote there: %w",
			a.log.Key(), rec.Remote, rec.Volume, rec.LSN, rec.W, ErrNotThisArchive)
	case latest != nil && latest.Meta[metaIdentity] != rec.Identity:
		return fmt.Errorf("%s was archived to %s (volume %s); this remote holds another archive (%q): %w",
			a.log.Key(), rec.Remote, rec.Volume, latest.Meta[metaIdentity], ErrNotThisArchive)
	}
	return nil
}
