package archive

import (
	"context"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/silt-dev/silt/pkg/stream"
)

// Status is the archive's account of one stream.
type Status struct {
	Stream         string `json:"stream"`
	Volume         string `json:"volume"`
	W              string `json:"w"`
	LSN            uint64 `json:"lsn"`
	Archived       int64  `json:"archived"`
	ArchivedBytes  int64  `json:"archived_bytes"`
	Malformed      int64  `json:"malformed"`
	Live           int64  `json:"live"`            // XLEN
	LiveUnarchived int64  `json:"live_unarchived"` // live entries above the watermark
	EntriesAdded   int64  `json:"entries_added"`   // XINFO STREAM entries-added
	// TrimmedUnarchived: entries archiver trim (or a trim-only policy)
	// removed above the watermark, recorded by TrimOnly: gone for good,
	// on purpose.
	TrimmedUnarchived int64 `json:"trimmed_unarchived"`
	LostOutside       int64 `json:"lost_outside"` // entries-added - (archived - recovered) - live unarchived - live below W unarchived - trimmed unarchived
	// LiveBelowUnarchived counts the live entries at or below W that the
	// archive lacks (or holds with other fields): another Redis node wrote
	// them (a failover, a split brain) or the record was restored or
	// forged. Runs keep them live and readers merge them; FirstBelowUnarchived
	// is the lowest.
	LiveBelowUnarchived  int64  `json:"live_below_w_unarchived"`
	FirstBelowUnarchived string `json:"first_below_w_unarchived,omitempty"`
	// Recovered counts the archived entries this Redis never held (another
	// node's commits, stream.ArchiveRecord.Recovered): the archive
	// recovered them for this Redis, whose entries-added never counted them.
	Recovered int64 `json:"recovered_never_held"`
	// RecordLSN is the commit Redis's record names; below LSN, the remote
	// holds commits this Redis has not recorded (RecordBehind): a run died
	// between a commit and its record, or this Redis is a promoted replica
	// or restored from a backup that did not see them. The next run proves
	// and records them.
	RecordLSN    uint64 `json:"record_lsn"`
	RecordBehind bool   `json:"record_behind,omitempty"`
	// AwaitingRecord: completeness is not judged (LostOutside, Recreated
	// and Complete left zero) because the record is behind and the archive
	// holds more than this Redis could have added: entries of another
	// node's commits, which the next run counts (Recovered) as it records.
	AwaitingRecord bool `json:"awaiting_record,omitempty"`
	// Settled: the counts and the remote's commit were read as one view.
	// When an archiver committed and trimmed between the two in every read,
	// they were not: LostOutside, Recreated and Complete are then not
	// judged (left zero), since the entries trimmed meanwhile would read as
	// lost.
	Settled  bool `json:"settled"`
	Complete bool `json:"complete"` // settled, nothing trimmed unarchived or lost outside, and not Recreated
	// Recreated: entries-added is below archived + live above W, which only
	// a new stream under the same key explains (Redis restarted without
	// persistence, FLUSHALL, DEL): how much was lost cannot be known.
	Recreated        bool    `json:"stream_recreated"`
	OldestUnarchived string  `json:"oldest_unarchived,omitempty"`
	OldestAgeSec     float64 `json:"oldest_unarchived_age_seconds,omitempty"`
	RemoteBytes      int64   `json:"remote_bytes"`   // live segments (after compaction and history retention)
	Segments         int64   `json:"segments"`       // live segments
	CheckpointLSN    uint64  `json:"checkpoint_lsn"` // the newest checkpoint this handle uses (0: none yet)
	// Policy is the stream's declared retention policy, PolicyLastRun its
	// last application (nil: none declared, never ran).
	Policy        *Declared  `json:"policy,omitempty"`
	PolicyLastRun *PolicyRun `json:"policy_last_run,omitempty"`
	LocalBytes    int64      `json:"local_bytes"` // files under the volume's local directory
}

// Status reports the watermark, counts and completeness: entries-added must
// equal archived + live above the watermark, unless archiver trim removed
// unarchived entries (TrimmedUnarchived, recorded) or something outside
// silt did (a producer's MAXLEN, XDEL): the rest of the difference is
// LostOutside.
func (a *Archive) Status(ctx context.Context, dataDir string) (Status, error) {
	s := Status{Stream: a.log.Key(), Volume: a.vol.Name()}
	st, lsn, c, settled, err := a.countAtHead(ctx)
	if err != nil {
		return s, err
	}
	s.Settled = settled
	s.W, s.LSN, s.Archived, s.ArchivedBytes, s.Malformed = st.W.String(), lsn, st.Archived, st.Bytes, st.Malformed
	s.Live, s.EntriesAdded, s.LiveUnarchived = c.Length, c.EntriesAdded, c.Length-c.Below
	from, _ := st.W.Next()
	if st.W.IsZero() {
		from = stream.First
	}
	first, err := a.log.ReadRaw(ctx, from, stream.Last, 1)
	if err != nil {
		return s, err
	}
	if len(first) == 1 {
		s.OldestUnarchived = first[0].StreamID.String()
		s.OldestAgeSec = time.Since(first[0].StreamID.Time()).Seconds()
	}
	if s.TrimmedUnarchived, err = a.log.Policies().TrimmedUnarchived(ctx, a.log.Name()); err != nil {
		return s, err
	}
	if rec, ok, err := a.log.ArchiveRecord(ctx); err != nil {
		return s, err
	} else if ok {
		s.Recovered, s.RecordLSN, s.RecordBehind = rec.Recovered, rec.LSN, rec.LSN < lsn
	}
	if c.Below > 0 { // live entries at or below W: each compared with the archive
		n, first, err := a.Unarchived(ctx)
		if err != nil {
			return s, err
		}
		if s.LiveBelowUnarchived = n; n > 0 {
			s.FirstBelowUnarchived = first.String()
		}
	}
	if s.Settled {
		s.LostOutside = s.EntriesAdded - (s.Archived - s.Recovered) - s.LiveUnarchived - s.LiveBelowUnarchived - s.TrimmedUnarchived
		switch {
		case s.LostOutside < 0 && s.RecordBehind:
			// The commits above the record may hold entries this Redis
			// never had (a failover): a run counts them as it records.
			s.AwaitingRecord, s.LostOutside = true, 0
		case s.LostOutside < 0:
			s.Recreated, s.LostOutside = true, 0
		}
		s.Complete = s.LostOutside == 0 && s.TrimmedUnarchived == 0 && s.LiveBelowUnarchived == 0 && !s.Recreated && !s.AwaitingRecord
	}
	if a.log.DeadGroup() == "" {
		ps, name := a.log.Policies(), a.log.Name()
		if d, ok, err := DeclaredPolicy(ctx, ps, name); err != nil {
			return s, err
		} else if ok {
			s.Policy = &d
		}
		if r, ok, err := LastPolicyRun(ctx, ps, name); err != nil {
			return s, err
		} else if ok {
			s.PolicyLastRun = &r
		}
	}
	vs := a.vol.Stats()
	s.RemoteBytes, s.Segments, s.CheckpointLSN = vs.Bytes, vs.Entries, vs.Base
	filepath.WalkDir(filepath.Join(dataDir, a.vol.Name()), func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				s.LocalBytes += fi.Size()
			}
		}
		return nil
	})
	return s, nil
}

// countAtHead reads the remote's newest commit and counts the live stream
// against its watermark, as one view: a running archiver can commit,
// prove and trim above the watermark between the remote's read and
// Redis's counts, and entries trimmed above the watermark read would count
// as lost. So the remote is read again after the counts and, when it moved
// on, all is read again, up to statusReads times. It returns the commit's
// state and LSN with the counts, and whether they are one view (settled):
// when the archiver moved on during every read, they are the last read's,
// off by the slices it trimmed meanwhile.
func (a *Archive) countAtHead(ctx context.Context) (st state, lsn uint64, c stream.LiveCount, settled bool, err error) {
	if err := a.vol.Refresh(ctx); err != nil {
		return st, 0, c, false, err
	}
	for range statusReads {
		lsn = a.vol.Head()
		if st, err = stateOf(a.vol.Latest()); err != nil {
			return st, lsn, c, false, err
		}
		c, err = a.log.CountLive(ctx, st.W) // at one instant: a trim between two counts would read as a loss
		if err != nil {
			return st, lsn, c, false, err
		}
		if err := a.vol.Refresh(ctx); err != nil {
			return st, lsn, c, false, err
		}
		if a.vol.Head() == lsn {
			return st, lsn, c, true, nil
		}
	}
	return st, lsn, c, false, nil
}

// statusReads bounds the reads of Status's view while an archiver moves it.
const statusReads = 5
