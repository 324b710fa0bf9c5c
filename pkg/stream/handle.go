package stream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/failpoint"
)

// fate is what becomes of one delivery.
type fate int

const (
	fateRun       fate = iota // to be handed to the handler
	fateAck                   // handled (or a duplicate): ack
	fatePending               // failed: leave pending for a later attempt
	fateDead                  // dead-letter and ack
	fateAbandoned             // not finished at shutdown: leave pending
)

// job is one delivery of a batch and what became of it.
type job struct {
	d      Delivery
	sid    string // d.StreamID as the server wrote it
	rawID  string // the entry's "id" field as stored when it is malformed (else entryID formats d.ID)
	fate   fate
	err    error
	reason string // why it is dead-lettered

	prior    int64       // handler starts recorded before this delivery (Keyspace.Attempts)
	inPEL    bool        // the entry is pending for this consumer (not read from the archive)
	recorded bool        // this start is recorded (starts)
	windowed bool        // recorded as a first start in the consumer's window
	started  atomic.Bool // the handler was called
	finished atomic.Bool // the handler returned; err is set
	acked    bool        // acked as soon as it succeeded (earlyAcks), under earlyAcks.mu
	lost     bool        // of acked: a peer had reclaimed it, so it was not acked here
}

// handle takes one batch through prepare, dedupe, handlers and settle.
// readAt is when the batch was read (its entries' idle time starts there),
// asked how many entries the read asked for.
func (r *run) handle(ctx context.Context, msgs []message, deleted []string, src source, readAt time.Time, asked int64) error {
	start := time.Now()
	wctx, cancel := r.writeCtx(ctx)
	jobs, err := r.jobs(wctx, msgs, deleted, src)
	cancel()
	if err != nil {
		return err
	}
	size := batchBytes(msgs)
	err = r.process(ctx, jobs, readAt)
	r.recycleJobs()
	r.adapt(len(msgs), asked, size, time.Since(start))
	if r.c.Progress != nil {
		r.c.Progress(r.sum, len(jobs))
	}
	return err
}

// writeCtx returns the context of one round of Redis writes: it outlives
// the run's cancellation, so work that finished is acked even during
// shutdown, and its WriteTimeout starts now. A context made before the
// handlers ran would be spent by slow handlers before the ack is sent.
func (r *run) writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), r.c.WriteTimeout)
}

// process takes built jobs through prepare, dedupe, handlers and settle.
// The writes before the handlers and those after them each get their own
// bounded context.
func (r *run) process(ctx context.Context, jobs []*job, readAt time.Time) error {
	if err := r.before(ctx, jobs); err != nil {
		return err
	}
	r.readAt = readAt
	r.renewLost.Store(false)
	xerr := r.execute(ctx, jobs, readAt)
	r.c.failpoint(failpoint.AfterHandle)
	wctx, cancel := r.writeCtx(ctx)
	defer cancel()
	r.keepStarts(wctx, jobs)
	err := r.settle(wctx, jobs)
	r.c.failpoint(failpoint.AfterAck)
	if xerr != nil {
		return xerr
	}
	return err
}

// before runs what precedes the handlers: payload recovery, the fates of
// what cannot run, and the dedupe check.
func (r *run) before(ctx context.Context, jobs []*job) error {
	wctx, cancel := r.writeCtx(ctx)
	defer cancel()
	if negativeAck {
		r.ackEarly(wctx, jobs)
	}
	r.c.failpoint(failpoint.AfterRead)
	r.prepare(wctx, jobs)
	return r.dedupe(wctx, jobs)
}

// jobs builds the batch's deliveries with their server-side delivery counts
// and the handler starts recorded for them. Entries no longer pending for us
// (a peer reclaimed or acked them since) are dropped.
func (r *run) jobs(ctx context.Context, msgs []message, deleted []string, src source) ([]*job, error) {
	var deliveries, starts map[string]int64
	if src != fromNew {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		var err error
		if deliveries, starts, err = r.c.io.counts(ctx, ids, true); err != nil {
			return nil, err
		}
	}
	all := r.newJobs(len(msgs) + len(deleted))
	jobs := make([]*job, 0, len(all))
	for i, m := range append(msgs, deletedMessages(deleted)...) {
		sid, err := parseSID(r.c.log.key, m.ID)
		if err != nil {
			return nil, err
		}
		if sid.Compare(r.seen) > 0 {
			r.seen = sid
		}
		n, ok := deliveries[m.ID]
		switch {
		case src == fromNew:
			n = 1
		case i >= len(msgs): // deleted: the server dropped its PEL entry and its count
			n = 0
		case !ok: // no longer pending for us
			continue
		}
		j := &all[len(jobs)]
		j.sid = m.ID
		j.d = Delivery{StreamID: sid, Deliveries: n, Group: r.c.group, Consumer: r.c.name}
		j.inPEL = i < len(msgs)
		j.prior = starts[m.ID]
		if m.Fields == nil {
			j.fate = fatePending // marked for recovery in prepare
		} else {
			j.d.ID, j.d.Fields, j.rawID, j.err = r.decode(sid, m.Fields)
		}
		jobs = append(jobs, j)
	}
	if len(deleted) > 0 { // the read above counted the claimed ones only
		if err := r.priorStarts(ctx, jobs[len(jobs)-len(deleted):]); err != nil {
			return nil, err
		}
	}
	switch src {
	case fromPEL:
		r.sum.Drained += int64(len(jobs))
	case fromClaim:
		r.sum.Claimed += int64(len(jobs))
	case fromNew, fromStaleNew:
		r.sum.New += int64(len(jobs))
	}
	return jobs, nil
}

// batchBytes is about the payload bytes of a batch read (Consumer.Count 0
// adapts to it): counted as the reply was parsed, else from the fields.
func batchBytes(msgs []message) int {
	n := 0
	for _, m := range msgs {
		if m.bytes > 0 {
			n += m.bytes
		} else {
			n += EntryBytes(m.Fields)
		}
	}
	return n
}

// newJobs returns n zeroed jobs in one array: the spare one when it is large
// enough, else a new one.
func (r *run) newJobs(n int) []job {
	all := r.spare
	r.spare = nil
	if cap(all) < n {
		all = make([]job, n)
	}
	r.jobArray = all[:n]
	return r.jobArray
}

// recycleJobs keeps the batch's job array for the next batch, cleared (so
// it holds no payload of this one), unless handlers still hold its jobs.
func (r *run) recycleJobs() {
	all := r.jobArray
	r.jobArray = nil
	if all == nil || r.handlersOut {
		return
	}
	all = all[:cap(all)]
	clear(all)
	r.spare = all
}

// decode checks an entry's fields, decoded once from the reply; its "id"
// field is taken out of them in place.
func (r *run) decode(sid brand.StreamID, f Fields) (brand.ID, Fields, string, error) {
	e, err := r.c.log.decodeFields(sid, f)
	if me, ok := errors.AsType[*MalformedError](err); ok {
		return e.ID, e.Fields, me.RawID, err
	}
	return e.ID, e.Fields, "", err
}

// entryID is the entry's "id" field as stored, for dead letters and logs.
func (j *job) entryID() string {
	if j.rawID == "" && j.d.ID != (brand.ID{}) {
		return j.d.ID.String()
	}
	return j.rawID
}

// prepare recovers trimmed payloads and decides the fate of what cannot run:
// malformed entries and entries past MaxAttempts are dead-lettered.
func (r *run) prepare(ctx context.Context, jobs []*job) {
	for _, j := range jobs {
		me, malformed := errors.AsType[*MalformedError](j.err)
		switch {
		case j.fate == fatePending:
			r.recover(ctx, j)
		case malformed:
			j.fate, j.reason = fateDead, "malformed entry: "+me.Reason
			r.sum.Malformed++
		case r.c.MaxEntryBytes > 0 && EntryBytes(j.d.Fields) > r.c.MaxEntryBytes:
			// The payload stays out of the dead letter (it would be as
			// large); it is still in the stream, or in the archive.
			j.fate = fateDead
			j.reason = fmt.Sprintf("oversized entry: %d bytes in %d fields, over the limit of %d bytes (Consumer.MaxEntryBytes: worker run --max-entry-bytes); payload left in the stream",
				EntryBytes(j.d.Fields), len(j.d.Fields), r.c.MaxEntryBytes)
			j.d.Fields = nil
			r.sum.Oversized++
		case j.prior >= r.c.MaxAttempts:
			// Started that often and never settled: it failed, or it took
			// its worker down each time.
			j.fate, j.d.Attempts = fateDead, j.prior
			j.reason = fmt.Sprintf("handler started %d times without success (max attempts %d)", j.prior, r.c.MaxAttempts)
		}
	}
}

// recover fetches the payload of an entry trimmed while pending.
func (r *run) recover(ctx context.Context, j *job) {
	j.fate = fateDead
	j.reason = "payload trimmed"
	if r.c.Payloads == nil {
		r.sum.PayloadLost++
		return
	}
	id, fields, err := r.c.Payloads.Payload(ctx, j.d.StreamID)
	switch {
	case errors.Is(err, ErrPayloadNotFound):
		j.reason = "payload trimmed and not in the archive"
		r.sum.PayloadLost++
	case errors.Is(err, ErrMalformed):
		j.reason, j.d.ID, j.d.Fields = "malformed entry (recovered from the archive): "+err.Error(), id, fields
		r.sum.Malformed++
	case err != nil:
		j.fate, j.err = fatePending, fmt.Errorf("recover payload of %s: %w", j.d.StreamID, err)
	default:
		j.fate, j.reason, j.rawID = fateRun, "", id.String()
		j.d.ID, j.d.Fields, j.d.Recovered = id, fields, true
		r.sum.PayloadRecovered++
	}
}

// dedupe acks, without calling the handler, entries the group already
// handled within DedupeTTL.
func (r *run) dedupe(ctx context.Context, jobs []*job) error {
	if r.c.DedupeTTL <= 0 {
		return nil
	}
	var check []*job
	var ids []string
	for _, j := range jobs {
		if j.fate == fateRun {
			check, ids = append(check, j), append(ids, j.d.ID.String())
		}
	}
	if len(check) == 0 {
		return nil
	}
	done, err := r.c.io.marked(ctx, ids)
	if err != nil {
		return err
	}
	for i, j := range check {
		if done[i] {
			j.fate = fateAck
			r.sum.DuplicatesSkipped++
		}
	}
	return nil
}

// execute runs the handlers, at most Concurrency at a time, in batch order,
// each start recorded before the handler runs (starts) and the batch's
// entries kept from looking idle meanwhile (keepOwnership). Once ctx is
// cancelled no handler starts; running ones get Grace, then their context is
// cancelled and the run stops waiting: unfinished jobs are abandoned (left
// pending). An error means a start could not be recorded: no handler started
// after it.
func (r *run) execute(ctx context.Context, jobs []*job, readAt time.Time) error {
	var runnable []*job
	for _, j := range jobs {
		if j.fate == fateRun {
			runnable = append(runnable, j)
		}
	}
	if len(runnable) == 0 {
		return nil
	}
	defer r.keepOwnership(ctx, jobs, readAt)()
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()
	graceOver := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		time.AfterFunc(r.c.Grace, func() { close(graceOver); hcancel() })
	})
	defer stop()

	st := r.newStarts(runnable, r.first) // handleNew clears r.first after the batch
	early := r.ack.early(ctx)
	// Workers take jobs by index: no channel operation per delivery. The
	// last to finish says all are done: no goroutine waits for them (one
	// started with each batch was, for a batch of one, a wake-up of
	// another thread on the path to its handler).
	var next atomic.Int64
	workers := min(r.c.Concurrency, len(runnable))
	var left atomic.Int64
	left.Store(int64(workers))
	allDone := make(chan struct{})
	for range workers {
		go func() {
			defer func() {
				if left.Add(-1) == 0 {
					close(allDone)
				}
			}()
			for ctx.Err() == nil {
				if r.c.Admit != nil && r.c.Admit(ctx) != nil {
					return
				}
				i := next.Add(1) - 1
				if i >= int64(len(runnable)) {
					return
				}
				if r.c.HandlerBegins {
					if st.failed() != nil {
						return
					}
					r.runBegun(ctx, hctx, runnable[i], early, st)
					continue
				}
				if st.record(ctx, int(i)) != nil {
					return
				}
				r.runOne(ctx, hctx, runnable[i], early)
			}
		}()
	}
	select {
	case <-allDone:
	case <-graceOver:
	}
	early.close()
	for _, j := range runnable {
		if j.finished.Load() {
			r.judge(j)
		} else {
			j.fate = fateAbandoned
		}
	}
	// After Grace the handlers' context is cancelled: an exec handler's
	// process group is being killed. Give them a moment to be gone, so the
	// worker does not exit with its handlers still running. (A timer only
	// then: a select evaluates every case's channel, and one made for each
	// batch, nearly always already done, was a timer a batch.)
	select {
	case <-allDone:
	default:
		reap := time.NewTimer(handlerReap)
		defer reap.Stop()
		select {
		case <-allDone:
		case <-reap.C:
			r.handlersOut = true // they hold their jobs: the batch's array is not reused
		}
	}
	return st.finish()
}

// handlerReap is how long a run waits, after Grace, for cancelled handlers
// to return (an exec handler's WaitDelay is 1 s).
const handlerReap = 2 * time.Second

// runOne calls the handler for a job whose start is recorded.
func (r *run) runOne(ctx, hctx context.Context, j *job, early *earlyAcks) {
	j.started.Store(true)
	r.callTimed(hctx, j)
	r.complete(ctx, j, early)
}

// callTimed calls the handler for j, sets j.err, and keeps how long it
// took as the run's last turn (took). The turn is timed as two readings of
// the time since the run began, by the monotonic clock alone: time.Now
// reads the wall clock as well (in a profile of P11 here, 65 ns a call
// against 40, beside about 2 µs of the worker's own time an entry).
func (r *run) callTimed(hctx context.Context, j *job) {
	began := time.Since(r.start)
	j.err = call(hctx, r.h, j.d)
	r.took.Store(int64(max(time.Since(r.start)-began, 1)))
}

// complete finishes a job whose handler returned: with DedupeTTL, a
// success writes the job's marker at once, before and apart from the ack:
// a worker killed between the two leaves the marker, and the redelivery is
// skipped.
func (r *run) complete(ctx context.Context, j *job, early *earlyAcks) {
	if j.err == nil && r.c.DedupeTTL > 0 {
		wctx, cancel := r.writeCtx(ctx)
		if err := r.c.io.mark(wctx, j.d.ID.String(), r.c.DedupeTTL); err != nil {
			r.c.Logger.Warn("could not write dedupe marker", "id", j.d.ID.String(), "error", err.Error())
		}
		cancel()
	}
	r.c.failpoint(failpoint.MidBatch)
	j.finished.Store(true)
	if j.err == nil && j.inPEL {
		early.add(j)
	}
}

// runBegun calls the handler of a Consumer with HandlerBegins: the job's
// start is recorded when the handler calls Delivery.Begin. A handler
// refused there did no work: its job is left unfinished (abandoned:
// pending, this start uncounted). One that returns without having called
// Begin did whatever it did: its start is recorded then, as well as it can
// be, and its outcome taken.
func (r *run) runBegun(ctx, hctx context.Context, j *job, early *earlyAcks, st *starts) {
	var once sync.Once
	var err error
	begun := false
	j.d.Attempts = j.prior + 1
	j.d.begin = func() error {
		once.Do(func() { begun, err = true, st.begin(ctx, j) })
		return err
	}
	r.callTimed(hctx, j)
	once.Do(func() { st.afterReturn(ctx, j) })
	if begun && err != nil {
		return
	}
	r.complete(ctx, j, early)
}

// call runs the handler, turning a panic into a *PanicError.
func call(ctx context.Context, h Handler, d Delivery) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v}
		}
	}()
	return h(ctx, d)
}

// judge decides the fate of a finished handler call.
func (r *run) judge(j *job) {
	if pe, ok := errors.AsType[*PanicError](j.err); ok {
		r.sum.Panics++
		r.c.Logger.Warn("handler panicked", "id", j.d.ID.String(), "panic", fmt.Sprint(pe.Value))
	}
	switch {
	case j.err == nil:
		j.fate = fateAck
	case IsPermanent(j.err):
		j.fate, j.reason = fateDead, "permanent error: "+j.err.Error()
	case j.d.Attempts >= r.c.MaxAttempts:
		j.fate = fateDead
		j.reason = fmt.Sprintf("attempt %d of %d failed: %v", j.d.Attempts, r.c.MaxAttempts, j.err)
	default:
		j.fate = fatePending
	}
}

// settle acks the handled entries in one round trip (their start records
// removed with them), dead-letters the poison ones, and counts every fate.
func (r *run) settle(ctx context.Context, jobs []*job) error {
	acks := ackSet{ids: make([]string, 0, len(jobs))}
	for _, j := range jobs {
		switch {
		case j.fate == fateAck && j.acked && j.lost:
			r.sum.LostLease++
		case j.fate == fateAck && j.acked:
			r.sum.Acked++
		case j.fate == fateAck:
			acks.add(j)
		case j.fate == fatePending:
			r.sum.Failed++
			// Loud at the default level: a scheduled run that only counts
			// its failures hides why they failed.
			r.c.Logger.Warn("handler failed, entry left pending", "id", j.d.ID.String(), "stream_id", j.d.StreamID.String(),
				"attempt", j.d.Attempts, "max_attempts", r.c.MaxAttempts, "error", fmt.Sprint(j.err))
		case j.fate == fateAbandoned:
			r.sum.Abandoned++
		}
	}
	if n := int64(len(acks.ids)); r.ack.hold(acks) { // counted now; a failed send fails the run
		r.sum.Acked += n
	} else if n > 0 {
		lost, err := r.ack.send(ctx, acks)
		if err != nil {
			return err
		}
		r.sum.Acked += n - int64(len(lost))
		r.sum.LostLease += int64(len(lost))
	}
	for _, j := range jobs {
		if j.fate != fateDead {
			continue
		}
		if err := r.deadLetter(ctx, j); err != nil {
			return err
		}
		r.sum.DeadLettered++
	}
	return nil
}

// fenced reports whether the batch in hand may have lost entries to a
// peer: it has run for --min-idle since its read (a frozen or slow worker),
// or a renewal failed. Its acks then go through ackOwned.
func (r *run) fenced() bool {
	return r.renewLost.Load() || (r.c.MinIdle > 0 && !r.readAt.IsZero() && time.Since(r.readAt) >= r.c.MinIdle)
}

// deadLetter writes the entry to the group's dead-letter stream and acks it
// in one MULTI, so a crash cannot do one without the other.
func (r *run) deadLetter(ctx context.Context, j *job) error {
	payload, err := json.Marshal(j.d.Fields)
	if err != nil {
		return fmt.Errorf("dead-letter %s: %w", j.d.StreamID, err)
	}
	rec := Fields{
		"entry_id":        j.entryID(),
		"entry_stream_id": j.sid,
		"group":           r.c.group,
		"consumer":        r.c.name,
		"attempts":        strconv.FormatInt(max(j.d.Attempts, j.prior), 10),
		"deliveries":      strconv.FormatInt(j.d.Deliveries, 10),
		"reason":          j.reason,
		"time":            time.Now().UTC().Format(time.RFC3339Nano),
		"payload":         string(payload),
	}
	if j.d.Fields == nil { // trimmed, or oversized: nothing a retry could hand a handler
		rec["no_payload"] = "1"
	}
	if err := r.c.io.deadLetter(ctx, rec, j.sid); err != nil {
		return err
	}
	r.c.Logger.Info("dead-lettered", "entry", j.entryID(), "stream_id", j.d.StreamID.String(), "reason", j.reason)
	return nil
}

// ackEarly acks every job before it runs: the negative control's broken
// order (see negativeAck). Never called in a real build.
func (r *run) ackEarly(ctx context.Context, jobs []*job) {
	var ids ackSet
	for _, j := range jobs {
		ids.add(j)
	}
	if len(ids.ids) > 0 {
		r.c.io.ack(ctx, ids)
	}
}
