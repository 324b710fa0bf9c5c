package archive

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// A stream declares its retention policy in its queue's keyspace
// (stream.Keyspace.Policies), so every tool and every host applies the same
// one; `archiver run --all` applies each stream's and leaves the streams
// that declare none alone. The outcome of each application is recorded
// beside it (stream.Keyspace.PolicyRuns).

// Declared is a stream's declared retention policy.
type Declared struct {
	Policy
	// Exact trims exactly (XTRIM =) instead of approximately.
	Exact bool
	// Archive archives before it trims; false trims only (what goes is gone).
	Archive bool
	// At is when the policy was declared.
	At time.Time
}

// declaredJSON is how a policy is stored.
type declaredJSON struct {
	KeepLast int64     `json:"keep_last,omitempty"`
	KeepFor  string    `json:"keep_for,omitempty"`
	Exact    bool      `json:"exact,omitempty"`
	Archive  bool      `json:"archive"`
	At       time.Time `json:"declared_at"`
}

// MarshalJSON writes keep_for as a duration string ("24h0m0s").
func (d Declared) MarshalJSON() ([]byte, error) {
	j := declaredJSON{KeepLast: d.KeepLast, Exact: d.Exact, Archive: d.Archive, At: d.At}
	if d.KeepFor > 0 {
		j.KeepFor = d.KeepFor.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (d *Declared) UnmarshalJSON(b []byte) error {
	var j declaredJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*d = Declared{Policy: Policy{KeepLast: j.KeepLast}, Exact: j.Exact, Archive: j.Archive, At: j.At}
	if j.KeepFor != "" {
		var err error
		if d.KeepFor, err = time.ParseDuration(j.KeepFor); err != nil {
			return err
		}
	}
	return nil
}

// Same reports whether two policies say the same (their times aside).
func (d Declared) Same(o Declared) bool {
	return d.Policy == o.Policy && d.Exact == o.Exact && d.Archive == o.Archive
}

// Declare records stream name's policy in ks (replacing what was declared).
// A policy that sets neither KeepLast nor KeepFor is ErrNoPolicy.
func Declare(ctx context.Context, ps stream.PolicyStore, name string, d Declared) error {
	if err := stream.ValidateName("stream", name); err != nil {
		return err
	}
	if d.KeepLast < 0 || d.KeepFor < 0 || d.KeepLast == 0 && d.KeepFor == 0 {
		return fmt.Errorf("declare the policy of %s: %w", ps.Keyspace().Stream(name), ErrNoPolicy)
	}
	if d.At.IsZero() {
		d.At = time.Now().UTC()
	}
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	return ps.SetPolicy(ctx, name, b)
}

// DeclaredPolicy returns stream name's declared policy; ok is false when it
// declares none.
func DeclaredPolicy(ctx context.Context, ps stream.PolicyStore, name string) (d Declared, ok bool, err error) {
	b, ok, err := ps.Policy(ctx, name)
	if err != nil || !ok {
		return d, false, err
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, false, fmt.Errorf("policy of %s: %q: %w", ps.Keyspace().Stream(name), b, err)
	}
	return d, true, nil
}

// DeclaredPolicies returns every policy declared in ks, by stream name.
func DeclaredPolicies(ctx context.Context, ps stream.PolicyStore) (map[string]Declared, error) {
	m, err := ps.AllPolicies(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Declared, len(m))
	for name, b := range m {
		var d Declared
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("policy of %s: %q: %w", ps.Keyspace().Stream(name), b, err)
		}
		out[name] = d
	}
	return out, nil
}

// Undeclare removes stream name's policy; ok is false when it had none.
func Undeclare(ctx context.Context, ps stream.PolicyStore, name string) (ok bool, err error) {
	return ps.RemovePolicy(ctx, name)
}

// PolicyRun is the outcome of one application of a declared policy.
type PolicyRun struct {
	At       time.Time `json:"at"`
	Archived int64     `json:"archived"`
	Trimmed  int64     `json:"trimmed"`
	Error    string    `json:"error,omitempty"`
}

// RecordPolicyRun records the last application of stream name's policy.
func RecordPolicyRun(ctx context.Context, ps stream.PolicyStore, name string, r PolicyRun) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return ps.SetLastRun(ctx, name, b)
}

// LastPolicyRun returns the last recorded application of stream name's
// policy; ok is false when none is recorded.
func LastPolicyRun(ctx context.Context, ps stream.PolicyStore, name string) (r PolicyRun, ok bool, err error) {
	b, ok, err := ps.LastRun(ctx, name)
	if err != nil || !ok {
		return r, false, err
	}
	return r, true, json.Unmarshal(b, &r)
}

// TrimOnly applies a policy without archiving (a stream whose history is
// not worth keeping): what it removes is gone for good. It returns how many
// entries it removed. Those above the watermark Redis recorded (every one,
// for a stream never archived) are added to the stream's count in
// Keyspace.TrimmedUnarchived, so that Status attributes them rather than
// report them removed outside silt.
func TrimOnly(ctx context.Context, l *stream.Log, p Policy, exact bool) (removed int64, err error) {
	if p.KeepLast <= 0 && p.KeepFor <= 0 {
		return 0, ErrNoPolicy
	}
	w, err := recordedW(ctx, l)
	if err != nil {
		return 0, err
	}
	added0, above0, err := liveAbove(ctx, l, w)
	if err != nil {
		return 0, err
	}
	defer func() {
		// Entries appended meanwhile are in added1 - added0; the rest of
		// what left the part above w was this trim's.
		added1, above1, cerr := liveAbove(context.WithoutCancel(ctx), l, w)
		if cerr == nil {
			if gone := above0 + (added1 - added0) - above1; gone > 0 {
				cerr = l.Policies().AddTrimmedUnarchived(context.WithoutCancel(ctx), l.Name(), gone)
			}
		}
		if err == nil {
			err = cerr
		}
	}()
	if p.KeepLast > 0 {
		n, err := l.TrimMaxLen(ctx, p.KeepLast, exact)
		if err != nil {
			return removed, err
		}
		removed += n
	}
	if p.KeepFor > 0 {
		n, err := l.TrimBefore(ctx, time.Now().Add(-p.KeepFor), exact)
		if err != nil {
			return removed, err
		}
		removed += n
	}
	return removed, nil
}

// ErrWouldLoseUnarchived is wrapped by CheckTrimOnly's error: a trim
// without archiving would remove entries of an archived stream that its
// archive does not hold.
var ErrWouldLoseUnarchived = errors.New("the trim would remove entries that were never archived")

// CheckTrimOnly refuses a TrimOnly of p on a stream that is archived (Redis
// records its archive, or its declared policy archives) when the trim would
// remove entries above the watermark Redis recorded: those exist nowhere
// else. A stream neither archived nor declared passes.
func CheckTrimOnly(ctx context.Context, l *stream.Log, p Policy) error {
	rec, recorded, err := l.ArchiveRecord(ctx)
	if err != nil {
		return err
	}
	d, declared, err := DeclaredPolicy(ctx, l.Policies(), l.Name())
	if err != nil {
		return err
	}
	if !recorded && !(declared && d.Archive) {
		return nil
	}
	w, err := parseW(rec.W)
	if err != nil {
		return fmt.Errorf("archive record of %s: W %q: %w", l.Key(), rec.W, err)
	}
	n, err := unarchivedBy(ctx, l, p, w)
	if err != nil || n == 0 {
		return err
	}
	why := "its declared policy archives it, and nothing is archived yet"
	if recorded {
		why = fmt.Sprintf("it is archived up to %s (LSN %d)", wString(w), rec.LSN)
	}
	return fmt.Errorf("%s: %s; this trim would remove %d entries above that, which exist nowhere else: %w",
		l.Key(), why, n, ErrWouldLoseUnarchived)
}

// recordedW is the watermark Redis recorded for l's archive (zero: none).
func recordedW(ctx context.Context, l *stream.Log) (brand.StreamID, error) {
	rec, ok, err := l.ArchiveRecord(ctx)
	if err != nil || !ok {
		return brand.StreamID{}, err
	}
	w, err := parseW(rec.W)
	if err != nil {
		return w, fmt.Errorf("archive record of %s: W %q: %w", l.Key(), rec.W, err)
	}
	return w, nil
}

// liveAbove returns l's entries-added and how many of its live entries lie
// above w (all of them when w is zero), counted at one instant.
func liveAbove(ctx context.Context, l *stream.Log, w brand.StreamID) (added, above int64, err error) {
	c, err := l.CountLive(ctx, w)
	if err != nil {
		return 0, 0, err
	}
	return c.EntriesAdded, c.Length - c.Below, nil
}

// unarchivedBy counts the entries TrimOnly(p) would remove above w (every
// one it would remove when w is zero).
func unarchivedBy(ctx context.Context, l *stream.Log, p Policy, w brand.StreamID) (int64, error) {
	from := stream.First
	if !w.IsZero() {
		from, _ = w.Next()
	}
	var n int64
	if p.KeepLast > 0 {
		c, err := l.CountLive(ctx, w) // live at or below w: removed first, archived
		if err != nil {
			return 0, err
		}
		n = max(c.Length-p.KeepLast-c.Below, 0)
	}
	if p.KeepFor > 0 {
		to, ok := brand.WindowStart(time.Now().Add(-p.KeepFor)).Prev()
		if ok && from.Compare(to) <= 0 {
			old, err := l.ReadRaw(ctx, from, to, 1<<20)
			if err != nil {
				return 0, err
			}
			n = max(n, int64(len(old)))
		}
	}
	return n, nil
}

// Apply applies a declared policy to the archive's stream: archive then
// trim, or trim only, and records the outcome beside the policy. The
// archive's Exact is set from the policy.
func (a *Archive) Apply(ctx context.Context, d Declared, progress Progress) (Result, error) {
	if !d.Archive {
		n, err := ApplyTrimOnly(ctx, a.log, d)
		return Result{Trimmed: n}, err
	}
	a.Exact = d.Exact
	res, err := a.Run(ctx, d.Policy, progress)
	return res, recordRun(ctx, a.log, PolicyRun{Archived: res.Archived, Trimmed: res.Trimmed}, err)
}

// ApplyTrimOnly applies a declared trim-only policy to l's stream (no
// archive is needed) and records the outcome beside the policy.
func ApplyTrimOnly(ctx context.Context, l *stream.Log, d Declared) (int64, error) {
	n, err := TrimOnly(ctx, l, d.Policy, d.Exact)
	return n, recordRun(ctx, l, PolicyRun{Trimmed: n}, err)
}

// recordRun records one application of l's policy and returns err, or the
// recording's error when the application succeeded.
func recordRun(ctx context.Context, l *stream.Log, run PolicyRun, err error) error {
	run.At = time.Now().UTC()
	if err != nil {
		run.Error = err.Error()
	}
	if rerr := RecordPolicyRun(context.WithoutCancel(ctx), l.Policies(), l.Name(), run); err == nil && rerr != nil {
		return fmt.Errorf("record the run of the policy of %s: %w", l.Key(), rerr)
	}
	return err
}

// overdueScanCap bounds the entries Overdue reads to count a keep-for
// backlog: past it the figure means "at least this many".
const overdueScanCap = 100_000

// Overdue counts the live entries that p says should have left Redis: all
// but the newest KeepLast, minted before now minus KeepFor (both, when both
// are set). After a healthy run it is about zero (an approximate trim keeps
// a few); a growing figure means the archive or the trim is failing. A
// keep-for count reads the overdue entries, at most overdueScanCap of them.
func (a *Archive) Overdue(ctx context.Context, p Policy) (int64, error) {
	info, err := a.log.Info(ctx)
	if err != nil {
		return 0, err
	}
	n := info.Length
	if p.KeepLast > 0 {
		n = max(0, info.Length-p.KeepLast)
	}
	if p.KeepFor <= 0 || n == 0 {
		return n, nil
	}
	end, ok := brand.WindowStart(time.Now().Add(-p.KeepFor)).Prev()
	if !ok {
		return 0, nil
	}
	var count int64
	for cursor := stream.First; count < overdueScanCap; {
		page, err := a.log.ReadRaw(ctx, cursor, end, PageSize)
		if err != nil {
			return 0, err
		}
		count += int64(len(page))
		if len(page) < PageSize {
			break
		}
		if cursor, ok = page[len(page)-1].StreamID.Next(); !ok {
			break
		}
	}
	return min(n, count), nil
}
