package stream

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/silt-dev/silt/internal/ctxtime"
	"github.com/silt-dev/silt/pkg/brand"
)

// source says where a batch of deliveries came from.
type source int

const (
	fromPEL source = iota
	fromClaim
	fromNew
	// fromStaleNew: new entries read ahead that waited long enough for a
	// peer to have reclaimed them (a stalled run): checked like a claim.
	fromStaleNew
)

// blockStep bounds one blocking read, so a cancelled run never waits longer
// than this for Redis to answer.
const blockStep = 500 * time.Millisecond

// run is the state of one Consumer.Run.
type run struct {
	c        *Consumer
	h        Handler
	sum      Summary
	start    time.Time
	deadline time.Time // zero: no time budget
	cursor   string    // XAUTOCLAIM cursor, carried across beats
	lastBeat time.Time
	// ack sends every ack of the run (acker): carried with the next read,
	// early, fenced by ownership, flushed at the end.
	ack acker
	// history is Payloads as a History (nil: none), resolved once.
	history History
	// gaps is the state of the run's catch-up from the archive.
	gaps catchUpState
	// batch is the size of the next read (Consumer.Count, or adapted).
	batch int64
	// window is how many first handler starts are recorded in one round
	// trip (starts).
	window   int
	took     atomic.Int64 // how long the last handler to return took, in ns (0: none yet)
	windowed bool         // a window of first starts was recorded (dropped at the end)
	first    *firstStarts // the first step of the batch in hand, recorded before its read ahead
	// withRead is the first step of the batch just read, recorded in its
	// read's round trip (an open window, readNew); seen is the highest
	// stream id the run has had in hand, after which such a window opens.
	withRead  *firstStarts
	seen      brand.StreamID
	answered  atomic.Bool // a start record of the run was answered: later first steps need not wait for theirs
	oomWarned atomic.Bool
	// readAt is when the batch in hand was read; renewLost is set when a
	// renewal of its entries failed. Either past --min-idle or set, the
	// batch may have lost entries to a peer: its acks are fenced by
	// ownership (fenced).
	readAt    time.Time
	renewLost atomic.Bool
	// jobArray holds the batch in hand's jobs; spare is the array
	// of the batch before, cleared, which the next batch's jobs reuse: a
	// thousand jobs are over 200 KiB, fresh memory to fault in and zero at
	// each read. handlersOut is set when handlers outlived their batch
	// (Grace): they hold its jobs, which then go to the collector.
	jobArray, spare []job
	handlersOut     bool
}

// Bounds of an adaptive read size (Consumer.Count 0): entries per read, and
// the payload bytes of a batch past which reads stop growing.
const (
	autoCountMin = 100
	autoCountMax = 1000
	autoBytesMax = 4 << 20
)

func newRun(c *Consumer, h Handler) *run {
	r := &run{c: c, h: h, start: time.Now(), cursor: "0-0", batch: c.Count, window: 1}
	r.ack.r = r
	r.history, _ = c.Payloads.(History)
	if r.batch <= 0 {
		r.batch = autoCountMin
	}
	if c.MaxDuration > 0 {
		r.deadline = r.start.Add(c.MaxDuration)
	}
	return r
}

func (r *run) finish() {
	r.sum.Elapsed = time.Since(r.start)
	r.sum.ElapsedSeconds = r.sum.Elapsed.Seconds()
}

// loop is the worker loop of the design: group, stale consumers, own PEL,
// reclaim beat, new entries, until idle, budget or cancellation.
func (r *run) loop(ctx context.Context) error {
	if err := r.c.EnsureGroup(ctx); err != nil {
		return err
	}
	n, err := r.c.ForgetStale(ctx)
	r.sum.StaleConsumers = n
	if err != nil {
		return err
	}
	if err := r.checkGap(ctx); err != nil {
		return err
	}
	if err := r.drain(ctx); err != nil || r.stopped(ctx) {
		return err
	}
	if err := r.catchUp(ctx); err != nil || r.stopped(ctx) {
		return err
	}
	quiet := time.Now() // since when nothing was claimed or read
	for {
		claimed, err := r.beatIfDue(ctx)
		if err != nil || r.stopped(ctx) {
			return err
		}
		got, err := r.readNew(ctx, quiet.Add(r.c.Block))
		if err != nil || r.stopped(ctx) {
			return err
		}
		switch {
		case got > 0 || claimed > 0:
			quiet = time.Now()
		case time.Since(quiet) >= r.c.Block && r.gaps.leaseHeld:
			if err := r.waitLease(ctx); err != nil {
				return err
			}
		case time.Since(quiet) >= r.c.Block:
			r.sum.ExitReason = ExitIdle
			return nil
		}
	}
}

// waitLease retries the catch-up after a short pause, while another
// consumer holds the lease.
func (r *run) waitLease(ctx context.Context) error {
	if ctxtime.Sleep(ctx, leasePoll) != nil {
		return nil
	}
	return r.catchUp(ctx)
}

// leasePoll is how often a waiting run asks for the catch-up lease.
const leasePoll = 100 * time.Millisecond

// adapt sizes the next read after a batch of n entries (of asked) and
// size payload bytes took to handle. From its read until its acks a batch
// is pending on this consumer, and peers reclaim what stays idle MinIdle;
// so an adaptive read grows (doubling, up to autoCountMax) only while a
// full batch (n of asked: a batch read ahead asked for the size before
// the last doubling) takes under MinIdle/100 and holds under half of
// autoBytesMax, and shrinks (halving, down to autoCountMin) once one takes
// over MinIdle/10 or holds more than autoBytesMax. A fixed Count stays as
// it is.
func (r *run) adapt(n int, asked int64, size int, took time.Duration) {
	if r.c.Count > 0 {
		return
	}
	switch {
	case int64(n) >= asked && took < r.c.MinIdle/100 && size < autoBytesMax/2:
		r.batch = min(2*r.batch, autoCountMax)
	case took > r.c.MinIdle/10 || size > autoBytesMax:
		r.batch = max(r.batch/2, autoCountMin)
	}
}

// stopped reports whether the run must stop taking entries, and records why.
func (r *run) stopped(ctx context.Context) bool {
	switch {
	case r.sum.ExitReason != "":
	case ctx.Err() != nil:
		r.sum.ExitReason = ExitSignal
	case r.c.MaxEntries > 0 && r.sum.Handled()+r.sum.Abandoned >= r.c.MaxEntries:
		r.sum.ExitReason = ExitMaxEntries
	case !r.deadline.IsZero() && !time.Now().Before(r.deadline):
		r.sum.ExitReason = ExitMaxTime
	default:
		return false
	}
	return true
}

// count returns how many entries the next read may take under the budget.
func (r *run) count() int64 {
	n := r.batch
	if r.c.MaxEntries > 0 {
		n = min(n, r.c.MaxEntries-r.sum.Handled()-r.sum.Abandoned)
	}
	return max(n, 1)
}

// drain re-delivers this consumer's own pending entries, oldest first. The
// cursor moves past each batch, so an entry that fails again is not re-read
// in this pass.
func (r *run) drain(ctx context.Context) error {
	cursor := "0"
	for !r.stopped(ctx) {
		readAt, count := time.Now(), r.count()
		msgs, err := r.c.io.readPending(ctx, cursor, count)
		if err != nil || len(msgs) == 0 {
			return err
		}
		cursor = msgs[len(msgs)-1].ID
		if err := r.handle(ctx, msgs, nil, fromPEL, readAt, count); err != nil {
			return err
		}
	}
	return nil
}

// beatIfDue runs a reclaim sweep when ClaimEvery has passed since the last.
func (r *run) beatIfDue(ctx context.Context) (int, error) {
	if !r.lastBeat.IsZero() && time.Since(r.lastBeat) < r.c.ClaimEvery {
		return 0, nil
	}
	r.lastBeat = time.Now()
	if err := r.ack.flush(ctx); err != nil { // our own handled entries are not for reclaiming
		return 0, err
	}
	if err := r.checkGap(ctx); err != nil {
		return 0, err
	}
	return r.beat(ctx)
}

// beat moves entries idle longer than MinIdle (by the server's clock) to this
// consumer and handles them, sweeping the group's PEL once with the cursor.
// Entries the server reports deleted (trimmed while pending) are, with a
// History, recorded as gaps in the claim's own atomic step and caught up
// from the archive; without one they are dead-lettered as trimmed.
func (r *run) beat(ctx context.Context) (int, error) {
	history := r.history != nil
	total, recorded := 0, 0
	for !r.stopped(ctx) {
		readAt, count := time.Now(), r.count()
		c, err := r.c.io.autoclaim(ctx, r.c.MinIdle, r.cursor, count, history)
		if err != nil {
			return total, err
		}
		r.cursor = c.next
		recorded += c.recorded
		total += c.recorded + len(c.msgs) + len(c.deleted)
		msgs, next, deleted := c.msgs, c.next, c.deleted
		if err := r.handle(ctx, msgs, deleted, fromClaim, readAt, count); err != nil {
			return total, err
		}
		if next == "0-0" {
			break
		}
	}
	if recorded > 0 {
		return total, r.catchUp(ctx)
	}
	return total, nil
}

// readNew reads never-delivered entries, waiting in short steps until
// waitUntil, the deadline, or the next reclaim beat, whichever comes first.
func (r *run) readNew(ctx context.Context, waitUntil time.Time) (int, error) {
	if !r.deadline.IsZero() && r.deadline.Before(waitUntil) {
		waitUntil = r.deadline
	}
	for {
		// Always read once; block only while there is time left to wait.
		// Redis times a blocked read out on its next cron tick, so the BLOCK
		// is a tick shorter than the wait, and a wait shorter than a tick is
		// spent here after a read that does not block.
		wait := min(time.Until(waitUntil), blockStep, r.c.ClaimEvery-time.Since(r.lastBeat))
		block := wait - redisTick
		if block < time.Millisecond {
			block = -1 // no BLOCK: answer at once
		}
		readAt, count := time.Now(), r.count()
		msgs, err := r.readGroup(ctx, block, count)
		if err != nil {
			if ctx.Err() != nil {
				return 0, nil
			}
			return 0, err
		}
		if len(msgs) > 0 {
			n, err := r.handleNew(ctx, msgs, readAt, count)
			if err != nil {
				return n, err
			}
			return n, r.catchUp(ctx)
		}
		if block < 0 {
			ctxtime.Sleep(ctx, wait)
			return 0, nil
		}
		if ctx.Err() != nil || time.Since(r.lastBeat) >= r.c.ClaimEvery {
			return 0, nil
		}
	}
}

// handleNew handles a batch of new entries, and, while it is handled, reads
// the next one ahead (prefetch) when acks are carried (no dedupe markers, no
// history): the batches that follow are handled the same way until a read
// comes back empty, a beat is due or the run stops. Entries read ahead but
// not handled (the run stopped, or failed) stay pending for this consumer,
// counted as abandoned; its next run drains them first.
func (r *run) handleNew(ctx context.Context, msgs []message, readAt time.Time, asked int64) (int, error) {
	// A history's reads go through a script, and dedupe markers are written
	// before the ack: neither carries acks with the next read.
	r.ack.carrying = r.c.DedupeTTL == 0 && r.history == nil
	defer func() { r.ack.carrying = false }()
	total, src := 0, fromNew
	withRead := r.withRead
	r.withRead = nil
	for len(msgs) > 0 {
		var next <-chan prefetched
		if r.ack.carrying {
			closed := "" // the window recorded with the read, closed by the read ahead
			switch {
			case src != fromNew || r.c.HandlerBegins:
			case withRead != nil:
				r.first, withRead = withRead, nil
				closed = r.first.lo + " " + r.first.hi.String()
			default:
				// Before the read ahead goes out: written beside it, the
				// step waited in Redis behind the read of up to 1,000
				// entries (2 ms a batch in P1, against 0.1 ms alone).
				r.first = r.recordFirst(ctx, msgs)
			}
			// A batch shorter than it asked for emptied the stream as it
			// was then: a read ahead would most likely come back empty, a
			// round trip for nothing on a stream fed an entry at a time,
			// where the next entry's read then waited behind it. The read
			// after the batch carries its acks.
			if int64(len(msgs)) >= asked {
				next = r.prefetch(ctx, len(msgs), closed)
			}
		}
		err := r.handle(ctx, msgs, nil, src, readAt, asked)
		r.first = nil
		total += len(msgs)
		msgs, src = nil, fromNew
		if next != nil {
			p := <-next
			if err == nil {
				err = p.err
			}
			msgs, readAt, asked = p.msgs, p.at, p.count
			// Read before the batch above was handled: if that took long
			// enough for the entries to turn reclaimable (by our MinIdle, or
			// a peer's shorter one), a peer may own them now; only those
			// still pending for us are handled. One XPENDING after a batch
			// that took a second or more costs next to nothing.
			if time.Since(p.at) >= min(r.c.MinIdle/2, time.Second) {
				src = fromStaleNew
			}
		}
		if err != nil || (len(msgs) > 0 && r.stopped(ctx)) {
			r.sum.Abandoned += int64(len(msgs))
			return total, err
		}
	}
	return total, nil
}

// redisTick is how late Redis may time out a blocked read: it checks
// timeouts on its cron tick, every 100 ms at the default hz of 10. A BLOCK of
// 50 ms there takes about 100 ms; a reclaim beat waiting on it ran late by up
// to a tick: BenchmarkDeadPeerRecovery_Ratio measured 1.20 × MinIdle with
// MinIdle 500ms.
const redisTick = 100 * time.Millisecond

// readGroup reads new entries. With a History configured, a non-blocking
// read goes through the script that records gaps first; a blocking read
// only returns entries appended while it waits, after which no gap can hide.
// Without a History, the read records an open window of first starts in
// its round trip (openWindow); when that covers every entry it brings, it
// is their first step (r.withRead).
func (r *run) readGroup(ctx context.Context, block time.Duration, count int64) ([]message, error) {
	if r.history != nil {
		msgs, err := r.c.io.readNewRecordingGaps(ctx, count)
		if err != nil || len(msgs) > 0 || block < 0 {
			return msgs, err
		}
	}
	carried := r.ack.take()
	window, n := r.openWindow()
	msgs, ackErr, windowErr, err := r.c.io.readNewStarting(ctx, block, count, carried, window)
	if err := r.ack.sent(carried, ackErr); err != nil {
		return nil, err
	}
	if window != "" {
		r.windowed = true // dropped at the end of the run, used or not
		if windowErr == nil && err == nil && len(msgs) > 0 && len(msgs) <= n {
			r.answered.Store(true)
			if hi, perr := brand.ParseStreamID(msgs[len(msgs)-1].ID); perr == nil {
				r.withRead = &firstStarts{lo: msgs[0].ID, hi: hi}
			}
		}
	}
	return msgs, err
}

// openWindow returns the open window of first starts a read of new
// entries records in its own round trip (see resolveWindowsLua): the
// run's step of first starts (adapt), after the highest id the run has had
// in hand; "" when the read records none. The window is written before the
// read is served, so no write stands between the entries' arrival and
// their handlers, and a worker killed as they arrive has their starts
// counted. It is the batch's first step only when it covers every entry
// the read brings (readGroup): otherwise recordFirst writes the first step
// as a range before any handler starts, as without it, and acks or dead
// letters of its first entries cannot shift what an open window names
// onto entries not started.
//
// Only where a batch's first step would be recorded before the handlers
// (recordFirst: acks carried, no history, handlers that do not begin
// themselves), and never when a single start is all MaxAttempts allows:
// a read served to a worker that died waiting for it counts the step's
// starts, as a kill right after any step does, and with MaxAttempts 1
// that would dead-letter the entry unrun.
func (r *run) openWindow() (window string, n int) {
	if r.c.MaxAttempts <= 1 || r.c.HandlerBegins || r.c.DedupeTTL != 0 || r.history != nil {
		return "", 0
	}
	n = r.firstStep()
	return windowValue(r.seen.String(), n), n
}

// prefetched is the outcome of a read issued while a batch was handled.
type prefetched struct {
	msgs  []message
	at    time.Time // when the read was issued
	count int64     // the entries it asked for
	err   error
}

// prefetch reads the batch after one of inFlight entries, without blocking,
// while that one is handled: the client's work on a batch and the server's
// on the next overlap instead of waiting on each other. It takes the carried
// acks along. It returns nil when no read may go ahead: a beat is due, the
// run is stopping, or the budget holds no more entries.
//
// closed, when not "", is the window of first starts recorded with the
// read of the batch in hand, closed ("lo hi"): set ahead of the read in
// its round trip, so that the entries it reads are not counted by the
// open window (the first entries after an id still pending for this
// consumer, which these are once the batch in hand is acked).
func (r *run) prefetch(ctx context.Context, inFlight int, closed string) <-chan prefetched {
	count := r.batch
	if r.c.MaxEntries > 0 {
		count = min(count, r.c.MaxEntries-r.sum.Handled()-r.sum.Abandoned-int64(inFlight))
	}
	if count < 1 || r.stopped(ctx) || time.Since(r.lastBeat) >= r.c.ClaimEvery {
		return nil
	}
	acks := r.ack.take() // the prefetch sends them; a failure fails the run
	out := make(chan prefetched, 1)
	at := time.Now()
	go func() {
		// Not cancelled with the run: the acks it carries must get through
		// (bounded by WriteTimeout), and a read that does not block is quick.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.c.WriteTimeout)
		defer cancel()
		// A window not closed (a full Redis refuses it) leaves the batch
		// read ahead counted, should the worker be killed before its own
		// first step is recorded: a start too many, never one too few.
		msgs, ackErr, _, err := r.c.io.readNewStarting(wctx, -1, count, acks, closed)
		if ackErr != nil {
			err = ackErr
		}
		out <- prefetched{msgs, at, count, err}
	}()
	return out
}

// deletedMessages turns ids the server reported deleted into payload-less messages.
func deletedMessages(ids []string) []message {
	out := make([]message, len(ids))
	for i, id := range ids {
		out[i] = message{ID: id}
	}
	return out
}

// parseSID parses a stream id from the server; a bad one is a protocol error.
func parseSID(key, s string) (brand.StreamID, error) {
	sid, err := brand.ParseStreamID(s)
	if err != nil {
		return sid, fmt.Errorf("%s: server returned entry id %q: %w", key, s, err)
	}
	return sid, nil
}
