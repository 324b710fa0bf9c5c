package archive

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/graft"
	"github.com/silt-dev/silt/pkg/stream"
)

// Policy is the retention boundary: what stays live. At least one is set;
// with both, an entry is archived only when both allow it.
type Policy struct {
	KeepLast int64         // keep the newest N entries live (0: not set)
	KeepFor  time.Duration // keep entries younger than D live (0: not set)
}

// ErrNoPolicy: a run needs a retention policy.
var ErrNoPolicy = errors.New("no retention policy: set keep-last or keep-for")

// Result is what one Run did.
type Result struct {
	Archived   int64         `json:"archived"`  // records committed by this run
	Commits    int64         `json:"commits"`   // commits this run created
	Bytes      int64         `json:"bytes"`     // record bytes committed by this run
	Malformed  int64         `json:"malformed"` // of Archived, entries with a bad id, archived as they are
	Trimmed    int64         `json:"trimmed"`   // entries XTRIM removed
	LostRaces  int64         `json:"lost_races"`
	W          string        `json:"w"` // the watermark after the run
	LSN        uint64        `json:"lsn"`
	Elapsed    time.Duration `json:"-"`
	ElapsedSec float64       `json:"elapsed_seconds"`
}

// Progress, when set, is called after each commit with the run's result so far.
type Progress func(Result)

// Run archives what the policy says need not stay live, slice by slice:
// fold, commit behind the fence, then trim below the new watermark. It
// never trims above what is committed. A lost commit race adopts the
// winner's watermark and goes on from there.
func (a *Archive) Run(ctx context.Context, p Policy, progress Progress) (res Result, err error) {
	start := time.Now()
	defer func() { res.Elapsed = time.Since(start); res.ElapsedSec = res.Elapsed.Seconds() }()
	if p.KeepLast <= 0 && p.KeepFor <= 0 {
		return res, ErrNoPolicy
	}
	if err := a.vol.Refresh(ctx); err != nil {
		return res, err
	}
	var st state
	if st, err = stateOf(a.vol.Latest()); err != nil {
		return res, err
	}
	// A crash between commit and trim leaves archived entries live: trim them.
	if err := a.trim(ctx, st, &res); err != nil {
		return res, err
	}
	// One run archives up to the stream's top as it is now; what producers
	// append meanwhile waits for the next run, so a run always ends.
	info, err := a.log.Info(ctx)
	if err != nil {
		return res, err
	}
	top, err := brand.ParseStreamID(info.LastGeneratedID)
	if err != nil && info.LastGeneratedID != "" {
		return res, fmt.Errorf("archive %s: last-generated-id: %w", a.log.Key(), err)
	}
	for ctx.Err() == nil {
		slice, err := a.nextSlice(ctx, p, st, top)
		if err != nil || len(slice) == 0 {
			return res, err
		}
		next, err := a.commit(ctx, st, slice, &res)
		if err != nil {
			return res, err
		}
		st = next
		if err := a.trim(ctx, st, &res); err != nil {
			return res, err
		}
		if progress != nil {
			progress(res)
		}
	}
	return res, ctx.Err()
}

// nextSlice returns the next entries to fold: after W, inside the policy,
// at most SliceEntries and about SliceBytes.
func (a *Archive) nextSlice(ctx context.Context, p Policy, st state, top brand.StreamID) ([]stream.RawEntry, error) {
	from, ok := st.W.Next()
	if !ok {
		return nil, nil
	}
	to := top
	if p.KeepFor > 0 {
		if to, ok = brand.WindowStart(time.Now().Add(-p.KeepFor)).Prev(); !ok {
			return nil, nil
		}
	}
	count := a.SliceEntries
	if p.KeepLast > 0 {
		n, err := a.archivable(ctx, st, p.KeepLast)
		if err != nil {
			return nil, err
		}
		count = min(count, n)
	}
	if count <= 0 || from.Compare(to) > 0 {
		return nil, nil
	}
	entries, err := a.log.ReadRaw(ctx, from, to, count)
	if err != nil {
		return nil, err
	}
	return cutBytes(entries, a.SliceBytes), nil
}

// archivable counts how many entries after W may go while keeping the
// newest keep live: XLEN minus keep minus what is still live at or below W.
func (a *Archive) archivable(ctx context.Context, st state, keep int64) (int64, error) {
	info, err := a.log.Info(ctx)
	if err != nil {
		return 0, err
	}
	var below int64
	if !st.W.IsZero() {
		left, err := a.log.ReadRaw(ctx, stream.First, st.W, info.Length+1)
		if err != nil {
			return 0, err
		}
		below = int64(len(left))
	}
	return info.Length - below - keep, nil
}

// cutBytes keeps a prefix of entries of at most about limit bytes (at least one).
func cutBytes(entries []stream.RawEntry, limit int64) []stream.RawEntry {
	var size int64
	for i, e := range entries {
		for k, v := range e.Fields {
			size += int64(len(k) + len(v))
		}
		if size > limit && i > 0 {
			return entries[:i]
		}
	}
	return entries
}

// commit folds a slice into record pages and commits them. A lost race
// returns the winner's state instead.
func (a *Archive) commit(ctx context.Context, st state, slice []stream.RawEntry, res *Result) (state, error) {
	next := st
	pages := make([]graft.Page, len(slice))
	var bytes int64
	for i, e := range slice {
		if n := stream.EntryBytes(e.Fields); a.MaxEntryBytes > 0 && n > a.MaxEntryBytes {
			return st, fmt.Errorf("entry %s of %s is %d bytes, over the limit of %d (raise --max-entry-bytes, or remove the entry): %w",
				e.StreamID, a.log.Key(), n, a.MaxEntryBytes, stream.ErrOversized)
		}
		_, derr := a.log.Decode(e)
		malformed := errors.Is(derr, stream.ErrMalformed)
		if malformed {
			next.Malformed++
		}
		data := encodeRecord(Record{StreamID: e.StreamID, Fields: e.Fields, Malformed: malformed})
		pages[i] = graft.Page{No: RecordBase + next.NextPage + uint64(i), Data: data}
		bytes += int64(len(data))
	}
	next.W = slice[len(slice)-1].StreamID
	next.Archived += int64(len(slice))
	next.Bytes += bytes
	next.NextPage += uint64(len(slice))
	a.failpoint("after-fold")
	c, err := a.vol.Commit(ctx, pages, next.meta(slice[0].StreamID))
	var ce *graft.ConflictError
	if errors.As(err, &ce) {
		res.LostRaces++
		won, serr := stateOf(a.vol.Latest())
		return won, serr
	}
	if err != nil {
		return st, fmt.Errorf("archive %s: %w", a.log.Key(), err)
	}
	a.failpoint("after-commit")
	res.Archived += int64(len(slice))
	res.Commits++
	res.Bytes += bytes
	res.Malformed += next.Malformed - st.Malformed
	res.W, res.LSN = next.W.String(), c.LSN
	return next, nil
}

// trim removes live entries at or below the committed watermark, never above.
func (a *Archive) trim(ctx context.Context, st state, res *Result) error {
	if st.W.IsZero() {
		return nil
	}
	min, _ := st.W.Next()
	if negativeTrim {
		min, _ = min.Next() // the negative control: one entry above W goes too
	}
	n, err := a.log.TrimMinID(ctx, min, a.Exact)
	if err != nil {
		return err
	}
	res.Trimmed += n
	res.W = st.W.String()
	res.LSN = a.vol.Head()
	a.failpoint("after-trim")
	return nil
}
