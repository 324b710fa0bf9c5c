package stream

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// acker owns a run's acks; the loop and settle only hand it ids. It
// decides how each set leaves, and every ack leaves through send or rides a
// read that took it (take):
//
//   - carried: while a run handles batches of new entries (no dedupe
//     markers, no history), a batch's successes wait for the next read,
//     which sends them in its own round trip; flush sends what no read took;
//   - early: a slow batch's successes go out as they come, or on a timer
//     ackEvery after the last early ack (earlyAcks), never waiting longer;
//   - fenced: once a batch has run for --min-idle since its read, or a
//     renewal of its entries fell short, it acks by ownership (ackOwned):
//     what a peer reclaimed meanwhile is not acked here but counted lost.
type acker struct {
	r        *run
	carrying bool   // hold the successes of new-entry batches for the next read
	carried  ackSet // held for the next read, or flush
}

// hold keeps set for the next read when carrying (and the batch holds its
// lease); it reports whether it did. The caller counts the acks now: a
// failed send later fails the run.
func (a *acker) hold(set ackSet) bool {
	if !a.carrying || len(set.ids) == 0 || a.r.fenced() {
		return false
	}
	a.carried.addAll(set)
	return true
}

// take hands the carried acks to a read that sends them in its round
// trip; sent then says whether they went through.
func (a *acker) take() ackSet {
	set := a.carried
	a.carried = ackSet{}
	return set
}

// sent reports the outcome of a read that took set: a failed ack fails
// the run (the acks were counted), and set is kept for flush to retry.
func (a *acker) sent(set ackSet, err error) error {
	if err != nil {
		a.carried.addAll(set)
	}
	return err
}

// flush sends the acks no read took (at the end of a run, also after
// cancellation, bounded by WriteTimeout).
func (a *acker) flush(ctx context.Context) error {
	if len(a.carried.ids) == 0 {
		return nil
	}
	wctx, cancel := a.r.writeCtx(ctx)
	defer cancel()
	set := a.take()
	lost, err := a.send(wctx, set)
	if err != nil {
		a.carried.addAll(set)
		return err
	}
	a.r.sum.Acked -= int64(len(lost)) // counted when carried
	a.r.sum.LostLease += int64(len(lost))
	return nil
}

// send is the one send of acks: a plain pipelined XACK while the batch
// holds its entries, fenced by ownership once it may not. It returns the
// ids a peer had reclaimed, which were not acked (the peer handles and
// acks them), and says so.
func (a *acker) send(ctx context.Context, set ackSet) ([]string, error) {
	r := a.r
	if !r.fenced() {
		return nil, r.c.io.ack(ctx, set)
	}
	lost, err := r.c.io.ackOwned(ctx, set)
	if len(lost) > 0 {
		r.c.Logger.Warn(fmt.Sprintf("%d finished entries were reclaimed by a peer while this batch ran past its MinIdle %s: not acked here, the peer handles them (lengthen Consumer.MinIdle, worker run --min-idle, beyond the longest handler)",
			len(lost), r.c.MinIdle), "first", lost[0])
	}
	return lost, err
}

// early returns the early acks of a batch starting now.
func (a *acker) early(ctx context.Context) *earlyAcks {
	now := time.Now()
	return &earlyAcks{a: a, ctx: ctx, start: now, last: now}
}

// ackEvery is how long a success may wait for its ack once a batch is
// slow. A batch is acked whole when it is done; but a batch of slow
// handlers can take minutes, and a worker killed then would leave every
// success of it unacked: handled again by the next run, and each of them
// counting a start without a settle. So once ackEvery has passed since the
// batch began (or since the last ack), a success is acked at once, with
// those that waited: quick batches keep their single ack.
const ackEvery = 20 * time.Millisecond

// earlyAcks acks a slow batch's successes as they come: a success that
// arrives within ackEvery of the batch's start or of the last early ack is
// held, and a timer sends what is held ackEvery after that, so no success
// waits longer than about ackEvery for its ack while the batch runs on.
type earlyAcks struct {
	a       *acker
	ctx     context.Context
	mu      sync.Mutex
	last    time.Time // the batch's start, then the last early ack
	start   time.Time // when the batch began
	waiting []*job
	timer   *time.Timer // sends what waits; nil when none is armed
	closed  bool        // the batch goes to settle: a handler finishing later is abandoned
}

// close stops early acks; settle then reads job.acked without a race, and
// acks what still waits with the batch.
func (e *earlyAcks) close() {
	e.mu.Lock()
	e.closed = true
	if e.timer != nil {
		e.timer.Stop()
	}
	e.mu.Unlock()
}

// add takes a success: it is acked now when ackEvery has passed since the
// batch began and since the last early ack, else when the timer fires (a
// quick batch closes first and acks it with the rest, in one round trip).
// While the timer is armed a success waits for it, due or not: it fires
// at the due time and sends all that waits, and no clock is read here.
func (e *earlyAcks) add(j *job) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	e.waiting = append(e.waiting, j)
	if e.timer != nil {
		return // armed: it sends this one with the rest when it fires
	}
	due := e.last.Add(ackEvery) // last starts as the batch's start and only moves on
	if wait := time.Until(due); wait > 0 {
		e.timer = time.AfterFunc(wait, e.fire)
		return
	}
	e.flush()
}

// fire is the timer's: it sends what waits unless the batch closed.
func (e *earlyAcks) fire() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.timer = nil
	if !e.closed && len(e.waiting) > 0 {
		e.flush()
	}
}

// flush acks the waiting successes, with e.mu held. A failed ack is left
// to the batch's settle.
func (e *earlyAcks) flush() {
	var set ackSet
	for _, w := range e.waiting {
		set.add(w)
	}
	wctx, cancel := e.a.r.writeCtx(e.ctx)
	defer cancel()
	lost, err := e.a.send(wctx, set)
	if err != nil {
		e.a.r.c.Logger.Warn("could not ack finished entries early; the batch's ack retries", "entries", len(set.ids), "error", err.Error())
		return
	}
	for _, w := range e.waiting {
		w.acked, w.lost = true, slices.Contains(lost, w.sid)
	}
	e.waiting, e.last = e.waiting[:0], time.Now()
}
