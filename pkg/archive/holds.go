package archive

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// A trim removes only entries whose id and content the archive holds.
// Redis's record of the archive is a guide, not the proof: replication can
// roll it back (a promoted replica inherits an older record, a split brain
// lets two masters accept writes), a record can be restored or forged, and
// a producer whose clock is behind, or one giving explicit ids, can write
// below a watermark another node committed. So before each trim the run
// looks at what the trim would remove:
//
//   - entries in the slices the run folded itself (read live, committed,
//     read back) are the archive's by construction;
//   - every other live entry at or below the watermark (below the run's
//     first slice: left by a crash between commit and trim, by an
//     approximate trim, or written on another node; or between the run's
//     last slice and a watermark it did not write) is compared, id and
//     fields, with the archived record of the same id.
//
// An entry the archive lacks, or holds with other fields, is kept: the
// trim stops below the first such entry, readers merge it from the live
// stream (Read), and the run reports it (Result.KeptUnarchived).

// ErrKeptUnarchived is wrapped by a run's error when live entries at or
// below the watermark were found that the archive lacks: they were kept
// live (not trimmed) and are read from there; nothing was lost. Another
// Redis node wrote them (a failover, a split brain) or Redis's record was
// restored or forged (docs/operations.md, "After a failover").
var ErrKeptUnarchived = errors.New("live entries at or below the watermark that the archive lacks were kept live")

// covered is the run's own part of the history: (lo, hi], the slices it
// folded and proved, one after another.
type covered struct {
	lo, hi brand.StreamID
	set    bool
}

// add extends the covered range by a slice the run proved, (from, to]; a
// slice that does not follow on (a race lost to a peer in between) starts
// the range anew.
func (c *covered) add(from, to brand.StreamID) {
	if c.set && c.hi == from {
		c.hi = to
		return
	}
	*c = covered{lo: from, hi: to, set: true}
}

// holds is what the run's checks of the entries its trims remove found.
type holds struct {
	node     string // the Redis node the run's slices were read from (stream.Log.Node)
	own      covered
	checked  brand.StreamID // live entries at or below this were compared (or are the run's own)
	kept     int64          // live entries found at or below W that the archive lacks
	firstGap brand.StreamID // the lowest of them: no trim reaches it
	gap      bool
}

// trimBound returns the exclusive bound (XTRIM MINID) of a trim up to w
// once every live entry below it is known to be archived: w's successor,
// or the first live entry the archive lacks.
func (a *Archive) trimBound(ctx context.Context, w brand.StreamID) (brand.StreamID, error) {
	min, _ := w.Next()
	if node := a.log.Node(ctx); node != a.holds.node {
		// Another node now (a failover mid-run): it may hold other
		// entries than the run read, in its own slices too.
		a.warnf("archive %s: the run now talks to another Redis node (a failover?): every live entry at or below W %s is compared with the archive before the trim", a.log.Key(), w)
		a.holds.own, a.holds.checked, a.holds.node = covered{}, brand.StreamID{}, node
	}
	if err := a.checkBelow(ctx, w); err != nil {
		return min, err
	}
	if a.holds.gap && a.holds.firstGap.Compare(min) < 0 {
		return a.holds.firstGap, nil
	}
	return min, nil
}

// checkBelow compares the live entries at or below w that the run has not
// compared yet and that are not its own with the archive.
func (a *Archive) checkBelow(ctx context.Context, w brand.StreamID) error {
	h := &a.holds
	if noCompare || w.Compare(h.checked) <= 0 {
		return nil
	}
	from, _ := h.checked.Next() // no entry has id 0-0: (0-0, w] is every entry up to w
	if h.own.set && h.own.lo.Compare(w) < 0 {
		// Below the run's own slices, then above them.
		if err := a.compareLive(ctx, from, h.own.lo); err != nil {
			return err
		}
		if above, _ := h.own.hi.Next(); above.Compare(from) > 0 {
			from = above
		}
		if from.Compare(w) > 0 {
			h.checked = w
			return nil
		}
	}
	if err := a.compareLive(ctx, from, w); err != nil {
		return err
	}
	h.checked = w
	return nil
}

// compareChunk is how many live entries one comparison reads at a time.
const compareChunk = 1000

// compareLive compares every live entry with from <= id <= to with the
// archived record of the same id, chunk by chunk, and counts those the
// archive lacks or holds with other fields in a.holds.
func (a *Archive) compareLive(ctx context.Context, from, to brand.StreamID) error {
	_, err := a.compareLiveN(ctx, from, to)
	return err
}

// compareLiveN is compareLive, returning how many live entries it compared.
func (a *Archive) compareLiveN(ctx context.Context, from, to brand.StreamID) (n int64, err error) {
	for !to.IsZero() && from.Compare(to) <= 0 {
		live, err := a.log.ReadFlat(ctx, from, to, compareChunk)
		if err != nil {
			return n, err
		}
		n += int64(len(live))
		if len(live) == 0 {
			return n, nil
		}
		missing, err := a.lacking(ctx, live)
		if err != nil {
			return n, err
		}
		for _, sid := range missing {
			a.keep(sid)
		}
		if len(live) < compareChunk {
			return n, nil
		}
		next, ok := live[len(live)-1].StreamID.Next()
		if !ok {
			return n, nil
		}
		from = next
	}
	return n, nil
}

// keep records a live entry the archive lacks: no trim of the run reaches it.
func (a *Archive) keep(sid brand.StreamID) {
	h := &a.holds
	h.kept++
	if !h.gap || sid.Compare(h.firstGap) < 0 {
		h.firstGap, h.gap = sid, true
	}
}

// lacking returns the stream ids of the live entries (in id order) that
// the archive does not hold with the same fields.
func (a *Archive) lacking(ctx context.Context, live []stream.FlatEntry) ([]brand.StreamID, error) {
	var missing []brand.StreamID
	i := 0
	err := a.walkRecords(ctx, live[0].StreamID, live[len(live)-1].StreamID, func(rec Record) bool {
		for i < len(live) && live[i].StreamID.Compare(rec.StreamID) < 0 {
			missing = append(missing, live[i].StreamID)
			i++
		}
		if i < len(live) && live[i].StreamID == rec.StreamID {
			if !sameFields(live[i], rec.Fields) {
				missing = append(missing, live[i].StreamID)
			}
			i++
		}
		return i < len(live)
	})
	if err != nil {
		return nil, fmt.Errorf("archive %s: comparing the live entries a trim would remove with the archive: %w; nothing trimmed", a.log.Key(), err)
	}
	for ; i < len(live); i++ {
		missing = append(missing, live[i].StreamID)
	}
	return missing, nil
}

// sameFields reports whether a live entry's fields (a name given twice
// keeps its last value) are exactly an archived record's.
func sameFields(e stream.FlatEntry, f map[string]string) bool {
	n := 0
	for i := 0; i+1 < len(e.Pairs); i += 2 {
		v, ok := f[e.Pairs[i]]
		if !ok {
			return false
		}
		if last, _ := e.Get(e.Pairs[i]); last != v {
			return false
		}
		if first := firstIndex(e.Pairs, e.Pairs[i]); first == i {
			n++
		}
	}
	return n == len(f)
}

// firstIndex is the index in pairs of name's first occurrence as a name.
func firstIndex(pairs []string, name string) int {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i] == name {
			return i
		}
	}
	return -1
}

// Unarchived returns the live entries at or below the watermark that the
// archive lacks (or holds with other fields): how many, and the lowest. A
// status reads it; it compares every live entry at or below W.
func (a *Archive) Unarchived(ctx context.Context) (n int64, first brand.StreamID, err error) {
	st, err := stateOf(a.vol.Latest())
	if err != nil || st.W.IsZero() {
		return 0, first, err
	}
	defer a.aside()()
	if err := a.compareLive(ctx, stream.First, st.W); err != nil {
		return 0, first, err
	}
	return a.holds.kept, a.holds.firstGap, nil
}

// first is the lowest kept entry's id ("" when none was kept).
func (h holds) first() string {
	if !h.gap {
		return ""
	}
	return h.firstGap.String()
}

// neverHeld counts the entries the commits above Redis's record (rec)
// archived, in (rec.W, head's W], that this Redis does not hold live with
// the same fields: after a crash between a commit and its record they are
// all still live (none: the trim follows the record); after a failover or
// a restore they were another node's.
func (a *Archive) neverHeld(ctx context.Context, rec stream.ArchiveRecord) (int64, error) {
	head, err := stateOf(a.vol.Latest())
	if err != nil {
		return 0, err
	}
	recW, err := parseW(rec.W)
	if err != nil {
		return 0, err
	}
	from, _ := recW.Next()
	var archived int64
	if err := a.walkRecords(ctx, from, head.W, func(Record) bool { archived++; return true }); err != nil {
		return 0, fmt.Errorf("archive %s: the commits above Redis's record: %w", a.log.Key(), err)
	}
	defer a.aside()() // the run's trims compare these entries again, and count what they keep
	n, err := a.compareLiveN(ctx, from, head.W)
	if err != nil {
		return 0, err
	}
	return max(archived-(n-a.holds.kept), 0), nil
}

// TrimLacks compares the entries a trim without archiving (TrimOnly) of p
// would remove, the oldest of the stream, with the archive, and returns how
// many of them the archive lacks (or holds with other fields) and the
// lowest. A trim-only that removed them would lose them: archiver trim
// refuses it without --force, whatever Redis's record says (it may be
// gone, restored or rolled back).
func (a *Archive) TrimLacks(ctx context.Context, p Policy) (n int64, first brand.StreamID, err error) {
	if p.KeepLast <= 0 && p.KeepFor <= 0 {
		return 0, first, ErrNoPolicy
	}
	info, err := a.log.Info(ctx)
	if err != nil {
		return 0, first, err
	}
	limit := int64(-1) // entries KeepLast removes
	if p.KeepLast > 0 {
		limit = max(info.Length-p.KeepLast, 0)
	}
	var cutoff brand.StreamID // KeepFor removes the entries below it
	if p.KeepFor > 0 {
		cutoff = brand.WindowStart(time.Now().Add(-p.KeepFor))
	}
	removed := func(i int64, sid brand.StreamID) bool {
		return (limit >= 0 && i < limit) || (p.KeepFor > 0 && sid.Compare(cutoff) < 0)
	}
	defer a.aside()()
	from, seen := stream.First, int64(0)
	for {
		live, err := a.log.ReadFlat(ctx, from, stream.Last, compareChunk)
		if err != nil {
			return 0, first, err
		}
		k := 0
		for k < len(live) && removed(seen+int64(k), live[k].StreamID) {
			k++
		}
		if k > 0 {
			missing, err := a.lacking(ctx, live[:k])
			if err != nil {
				return 0, first, err
			}
			for _, sid := range missing {
				a.keep(sid)
			}
		}
		seen += int64(k)
		if k < len(live) || len(live) < compareChunk {
			return a.holds.kept, a.holds.firstGap, nil
		}
		if from, _ = live[len(live)-1].StreamID.Next(); from.IsZero() {
			return a.holds.kept, a.holds.firstGap, nil
		}
	}
}

// aside sets the run's holds aside for a count of its own (a status, a
// trim's check, the commits above the record) and returns what puts them
// back.
func (a *Archive) aside() (restore func()) {
	saved := a.holds
	a.holds = holds{}
	return func() { a.holds = saved }
}
