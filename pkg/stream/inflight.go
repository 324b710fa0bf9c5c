package stream

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/brand"
)

// Attempts are handler starts, not deliveries. Redis counts a delivery when
// an entry is read, and a run reads (and reads ahead) up to 1,000 entries:
// killed with 10 handlers started, it would burn an attempt on all 1,000.
// So a run records each start before the handler runs, and MaxAttempts is
// judged on those records:
//
//   - an entry started before (a failure, or a worker that died with it)
//     has its own record in the attempts hash, set to its new count alone,
//     right before its handler starts: a poison entry that kills the worker
//     each time counts every start, and nothing else does;
//   - first starts are recorded as a window: one field per consumer (the
//     windows hash) saying "every entry of this batch from lo to hi that is
//     still pending was started once", extended in steps that grow ×4 up to
//     maxStartWindow entries while handlers are quick (under fastStart an
//     entry) and shrink to one entry once they are slow (over slowStart), or
//     when MaxAttempts is 1. One O(1) write a step; a kill counts a start
//     for the unstarted rest of the current step, once in an entry's life
//     (its next start is recorded alone); the first step of a batch of
//     new entries read ahead is written before its read ahead is sent;
//   - at settle, a windowed entry left pending (failed, or abandoned while it
//     ran) gets its own record, since the next batch's window replaces this
//     one; a run that ends drops its window.
//
// Acks remove an entry's own record.
const (
	maxStartWindow = 1024
	fastStart      = 100 * time.Microsecond
	slowStart      = time.Millisecond
)

// starts records the handler starts of one batch (see above).
type starts struct {
	r     *run
	jobs  []*job       // runnable, in the order they start
	first *firstStarts // the batch's first step, recorded before its read ahead

	mu      sync.Mutex
	pending func() error // reads the first step's reply, written without waiting for it
	next    int          // jobs[:next] are recorded
	lo      string       // the first windowed job's stream id, once there is one
	lastAt  time.Time    // when the last step was recorded
	lastN   int          // and how many it held
	err     error        // a failed record: no further handler starts
}

func (r *run) newStarts(jobs []*job, first *firstStarts) *starts {
	return &starts{r: r, jobs: jobs, first: first}
}

// firstStarts is the first step of a batch of new entries (lo to hi, all
// first starts), recorded before the batch's read ahead is sent
// (run.recordFirst): beside it, the record would wait in Redis behind the
// read of up to a full batch.
type firstStarts struct {
	lo    string
	hi    brand.StreamID
	err   error        // the record's outcome, when its reply was waited for
	reply func() error // else reads its outcome: the record is written, its reply not read
}

// recordFirst records the first step of a batch of new entries: as many
// as the run's window. A malformed id is left for jobs to report. Once a
// record of the run was answered (the client may write them), the step is
// sent without waiting for its reply: the handlers start as soon as it is
// written (startSender), and the reply is read before the next record or
// at the batch's end.
func (r *run) recordFirst(ctx context.Context, msgs []message) *firstStarts {
	n := min(len(msgs), r.firstStep())
	hi, err := brand.ParseStreamID(msgs[n-1].ID)
	if err != nil {
		return nil
	}
	r.windowed = true // dropped at the end of the run, used or not
	f := &firstStarts{lo: msgs[0].ID, hi: hi}
	wctx, cancel := r.writeCtx(ctx)
	if r.answered.Load() {
		if reply, ok := r.c.io.sendWindow(wctx, cancel, f.lo, msgs[n-1].ID); ok {
			f.reply = reply
			return f
		}
	}
	defer cancel()
	if f.err = r.c.io.recordWindow(wctx, f.lo, msgs[n-1].ID); f.err == nil {
		r.answered.Store(true)
	}
	return f
}

// firstStep is the size of a batch's first step of first starts: the
// run's window, set to one entry first when MaxAttempts allows a single
// start or handlers take their turns slowly (see adapt).
func (r *run) firstStep() int {
	if r.c.MaxAttempts <= 1 || r.turn() > slowStart {
		r.window = 1
	}
	return r.window
}

// takeFirst marks the jobs the batch's first step covers as started once
// (or counts them in memory when Redis was full). Called with s.mu held,
// before the first record. A step sent without waiting for its reply
// counts as recorded: it was written; its reply is read before the next
// record.
func (s *starts) takeFirst() error {
	f := s.first
	s.first = nil
	s.pending = f.reply
	full := isOOM(f.err)
	switch {
	case full:
		s.r.warnOOM(f.err)
	case f.err != nil:
		return f.err
	default:
		s.lo = f.lo
	}
	n := 0
	for ; n < len(s.jobs) && s.jobs[n].d.StreamID.Compare(f.hi) <= 0; n++ {
		j := s.jobs[n]
		if full {
			j.d.Attempts = j.prior + 1
		} else {
			j.d.Attempts, j.recorded, j.windowed = 1, true, true
		}
	}
	s.next, s.lastAt, s.lastN = n, time.Now(), n
	return nil
}

// settlePending reads the reply of a first step sent without waiting for
// it. A refused record stops further starts, as it would have before the
// first one; a full Redis is said once, the starts counted in memory.
// Called with s.mu held.
func (s *starts) settlePending() {
	if s.pending == nil {
		return
	}
	err := s.pending()
	s.pending = nil
	switch {
	case isOOM(err):
		s.r.warnOOM(err)
	case err != nil && s.err == nil:
		s.err = err
	}
}

// finish reads a reply still due at the batch's end and returns the
// error that stopped its starts, if one did.
func (s *starts) finish() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settlePending()
	return s.err
}

// record makes sure jobs[i]'s start is recorded before its handler runs,
// and sets its Attempts. An error means the handler must not run.
//
// Steps are recorded in job order, from the first job not yet recorded:
// handlers take their jobs in order, but may reach here in another (the
// handler of job 5 before those of 2, 3 and 4), and a step begun at 5 would
// count 2, 3 and 4 as recorded (jobs[:next]) with no start of theirs
// written.
func (s *starts) record(ctx context.Context, i int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.first != nil && s.err == nil {
		s.err = s.takeFirst()
	}
	for s.err == nil && s.next <= i {
		s.err = s.step(ctx)
	}
	return s.err
}

// step records the starts of the next step, from jobs[next]. Called with
// s.mu held.
func (s *starts) step(ctx context.Context) error {
	// The step written without its reply is answered before the next: the
	// window's later extent must not land before its earlier one.
	if s.settlePending(); s.err != nil {
		return s.err
	}
	s.adapt()
	start := s.next
	end := start + 1
	if s.jobs[start].prior == 0 { // a first start: a step of first starts
		for end < len(s.jobs) && end-start < s.r.window && s.jobs[end].prior == 0 {
			end++
		}
	}
	wctx, cancel := s.r.writeCtx(ctx)
	defer cancel()
	if err := s.write(wctx, s.jobs[start:end]); isOOM(err) {
		// A full Redis refuses the record (HSET is a write it denies) but
		// still takes acks: the run goes on draining, counting these starts
		// in memory only, and says so.
		s.r.warnOOM(err)
		for _, j := range s.jobs[start:end] {
			j.d.Attempts = j.prior + 1
		}
	} else if err != nil {
		return err
	}
	s.next, s.lastAt, s.lastN = end, time.Now(), end-start
	return nil
}

// begin records j's start on its own, when its handler says its work
// begins (Consumer.HandlerBegins; j.d.Attempts is already prior+1): no
// window, so no entry counts as started before its handler was ready,
// whatever order the handlers get ready in. No handler begins once ctx is
// cancelled or a record failed.
func (s *starts) begin(ctx context.Context, j *job) error {
	if err := s.failed(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("handler not begun: %w", context.Cause(ctx))
	}
	if err := s.recordOwn(ctx, j); err != nil {
		s.mu.Lock()
		if s.err == nil {
			s.err = err
		}
		s.mu.Unlock()
		return err
	}
	j.started.Store(true)
	return nil
}

// afterReturn records the start of a job whose handler returned without
// calling Delivery.Begin (Consumer.HandlerBegins): whatever the handler did
// is done, so the record is written even after cancellation; a failure
// leaves this start counted in memory only.
func (s *starts) afterReturn(ctx context.Context, j *job) {
	j.started.Store(true)
	if err := s.recordOwn(ctx, j); err != nil {
		s.r.c.Logger.Warn("could not record a handler start", "id", j.d.ID.String(), "error", err.Error())
	}
}

// recordOwn writes j's start as a record of its own (a repeated start, or
// one a handler begins). A full Redis counts it in memory only (j's
// Attempts, set by the caller) and is no error.
func (s *starts) recordOwn(ctx context.Context, j *job) error {
	wctx, cancel := s.r.writeCtx(ctx)
	defer cancel()
	switch err := s.r.c.io.setStarts(wctx, map[string]int64{j.sid: j.prior + 1}); {
	case isOOM(err):
		s.r.warnOOM(err)
	case err != nil:
		return err
	default:
		j.recorded = true
	}
	return nil
}

// failed returns the error of a start that could not be recorded: no
// handler starts after it.
func (s *starts) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// isOOM reports whether err is Redis's answer when it is full.
func isOOM(err error) bool { return err != nil && strings.Contains(err.Error(), "OOM ") }

// warnOOM says once per run that Redis is full and starts go unrecorded.
func (r *run) warnOOM(err error) {
	if r.oomWarned.CompareAndSwap(false, true) {
		r.c.Logger.Warn("redis is full: handler starts are not recorded while it is (a worker killed now may not count them against MaxAttempts)", "error", err.Error())
	}
}

// adapt sizes the next step from how quickly the last one was started and
// how quickly handlers take their turns (how long the last one to return
// took, shared among the Concurrency workers): four times larger while
// both are under fastStart, half as large once starts come slower than
// slowStart, one entry once turns do (a step's unstarted rest waits its
// turn that long). One entry too when a single start is all MaxAttempts
// allows (a start counted for an entry that never ran would dead-letter it
// unrun).
//
// A step grows only once a handler of the run has returned: with
// Concurrency above 1 a batch's first handlers all ask for their records
// at once, however long they take, and that pace alone grew steps over
// entries that then waited for a free worker.
func (s *starts) adapt() {
	s.r.window = s.r.nextWindow(s.lastAt, s.lastN)
}

// nextWindow is the size of the next step of first starts, the last one
// of n taken at last (n 0: none yet). See adapt.
func (r *run) nextWindow(last time.Time, n int) int {
	turn := r.turn()
	if r.c.MaxAttempts <= 1 || turn > slowStart {
		return 1
	}
	if n == 0 {
		return r.window
	}
	per := time.Since(last) / time.Duration(n)
	switch {
	case per < fastStart && turn > 0 && turn < fastStart:
		return min(4*r.window, maxStartWindow)
	case per > slowStart:
		return max(r.window/2, 1)
	}
	return r.window
}

// turn is how long the last handler to return took, shared among the
// workers: the time between turns while they all run such handlers (0
// until one returns).
func (r *run) turn() time.Duration {
	return time.Duration(r.took.Load()) / time.Duration(max(r.c.Concurrency, 1))
}

// write records the starts of a step: a repeated start alone, first starts
// by extending the consumer's window to the step's last entry.
func (s *starts) write(ctx context.Context, w []*job) error {
	if len(w) == 1 && w[0].prior > 0 {
		w[0].d.Attempts = w[0].prior + 1
		return s.recordOwn(ctx, w[0])
	}
	lo := s.lo
	if lo == "" {
		lo = w[0].sid
	}
	if err := s.r.c.io.recordWindow(ctx, lo, w[len(w)-1].sid); err != nil {
		return err
	}
	s.r.answered.Store(true)
	s.lo, s.r.windowed = lo, true
	for _, j := range w {
		j.d.Attempts, j.recorded, j.windowed = 1, true, true
	}
	return nil
}

// keepStarts gives the windowed jobs that stay pending (failed, or
// abandoned while running) a record of their own: the next batch's window
// replaces this one. Best effort: a failure leaves one start uncounted.
func (r *run) keepStarts(ctx context.Context, jobs []*job) {
	keep := map[string]int64{}
	for _, j := range jobs {
		if j.windowed && j.started.Load() && (j.fate == fatePending || j.fate == fateAbandoned) {
			keep[j.sid] = 1
		}
	}
	if len(keep) == 0 {
		return
	}
	if err := r.c.io.setStarts(ctx, keep); err != nil {
		r.c.Logger.Warn("could not record the starts of entries left pending", "entries", len(keep), "error", err.Error())
	}
}

// dropWindow removes the run's window at its end: every entry it covered
// is acked, or has a record of its own (keepStarts).
func (r *run) dropWindow(ctx context.Context) {
	if !r.windowed {
		return
	}
	wctx, cancel := r.writeCtx(ctx)
	defer cancel()
	if err := r.c.io.dropWindow(wctx); err != nil {
		r.c.Logger.Debug("could not drop the start window", "error", err.Error())
	}
}

// priorStarts reads how many times each job's handler was started before
// (0 for entries without a record). New entries were never delivered to
// the group and have none.
func (r *run) priorStarts(ctx context.Context, jobs []*job) error {
	if len(jobs) == 0 {
		return nil
	}
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		ids[i] = j.sid
	}
	_, starts, err := r.c.io.counts(ctx, ids, false)
	if err != nil {
		return err
	}
	for _, j := range jobs {
		j.prior = starts[j.sid]
	}
	return nil
}

// renewScript keeps this consumer's in-flight entries from looking idle:
// XCLAIM ... JUSTID to itself resets an entry's idle time and leaves its
// delivery count alone. Only entries still pending for this consumer and
// still in the stream are touched: XCLAIM would take a peer's entry, and on
// Redis 7 it drops a deleted entry from the PEL without a word.
//
// KEYS: stream. ARGV: group, consumer, ids... Returns how many it renewed.
var renewScript = redis.NewScript(`
local args = {'XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0}
for i = 3, #ARGV do
  local id = ARGV[i]
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2])
  if #p > 0 and #redis.call('XRANGE', KEYS[1], id, id) > 0 then args[#args + 1] = id end
end
if #args == 5 then return 0 end
local n = #args - 5
args[#args + 1] = 'JUSTID'
redis.call(unpack(args))
return n
`)

// renewEvery is the period of in-flight renewals as a fraction of MinIdle:
// a quarter leaves three chances before a peer may reclaim. Below
// minRenewIdle no renewal could keep up (a MinIdle of 1ms means "reclaim
// anything at once", as a final sweep asks), and none is tried.
const (
	renewEvery   = 4
	minRenewIdle = 100 * time.Millisecond
)

// keepOwnership renews the batch's entries while its handlers run, so that
// peers reclaim only what a dead or stopped worker holds. It starts with a
// renewal at once when the batch was read long enough ago; stop ends it.
func (r *run) keepOwnership(ctx context.Context, jobs []*job, readAt time.Time) (stop func()) {
	if leasesOff || r.c.MinIdle < minRenewIdle {
		return func() {}
	}
	var ids []string // built when the first renewal is due: most batches end before
	every := r.c.MinIdle / renewEvery
	return repeat(ctx, every-time.Since(readAt), every, func(ctx context.Context) {
		if ids == nil {
			for _, j := range jobs {
				if j.inPEL {
					ids = append(ids, j.sid)
				}
			}
		}
		if len(ids) > 0 {
			r.renew(ctx, ids)
		}
	})
}

// repeat calls fn after first, then every period, with a context that
// outlives ctx's cancellation; stop ends it and waits for a call under way.
// It runs on a timer: no goroutine exists until a call is due, and most
// batches end before their first renewal (a goroutine started and ended
// with each batch of one was a wake-up of another thread on the path to
// its handler).
func repeat(ctx context.Context, first, period time.Duration, fn func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var mu sync.Mutex // held while fn runs
	var t *time.Timer
	stopped := false
	mu.Lock() // the first call waits until t is set
	t = time.AfterFunc(max(first, 0), func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		fn(ctx)
		t.Reset(period)
	})
	mu.Unlock()
	return func() {
		cancel() // a call under way gives up its requests
		t.Stop()
		mu.Lock() // waits for a call under way
		stopped = true
		mu.Unlock()
	}
}

// renew runs renewScript over ids; a failure is logged, not fatal: the
// worst it allows is a peer handling an entry this run also handles.
func (r *run) renew(ctx context.Context, ids []string) {
	wctx, cancel := context.WithTimeout(ctx, r.c.MinIdle/2)
	defer cancel()
	n, err := r.c.io.renew(wctx, ids)
	if err != nil && ctx.Err() == nil {
		r.c.Logger.Warn("could not renew in-flight entries", "entries", len(ids), "error", err.Error())
	}
	if err != nil || n < int64(len(ids)) {
		r.renewLost.Store(true) // the batch's acks are fenced by ownership
	}
}
