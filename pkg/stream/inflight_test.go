package stream_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

const attemptsKey = "emq:{cm}:attempts:events:billing"

// A batch whose handlers take longer than WriteTimeout in total is still
// acked: the ack's deadline starts when the ack is sent.
func TestConsumer_SlowBatchIsAckedPastWriteTimeout(t *testing.T) {
	f := newFixture(t, 8)
	c := f.consumer(t, "w1")
	c.WriteTimeout = 100 * time.Millisecond
	c.DedupeTTL = time.Minute // markers and acks both written after the handlers
	slow := func(context.Context, stream.Delivery) error { time.Sleep(40 * time.Millisecond); return nil }
	sum := run(t, c, slow)
	if sum.Acked != 8 || sum.ExitReason != stream.ExitIdle {
		t.Fatalf("summary %+v", sum)
	}
	if p := f.pending(t); p != 0 {
		t.Fatalf("%d pending after the batch was handled", p)
	}
}

// A live worker whose handlers run longer than MinIdle keeps its entries:
// a peer beating all the while claims none of them, and every entry is
// handled once. (The negative-control build silt_negative_lease turns the
// renewals off: this test must then fail.)
func TestConsumer_LiveWorkerKeepsItsEntriesFromPeers(t *testing.T) {
	f := newFixture(t, 12)
	const minIdle = 300 * time.Millisecond
	var mu sync.Mutex
	calls := map[string]int{}
	started := make(chan struct{})
	var once sync.Once
	h := func(_ context.Context, d stream.Delivery) error {
		once.Do(func() { close(started) })
		mu.Lock()
		calls[d.StreamID.String()]++
		mu.Unlock()
		time.Sleep(150 * time.Millisecond) // 12 × 150 ms: the batch takes 6 × MinIdle
		return nil
	}
	slow := f.consumer(t, "slow")
	slow.MinIdle, slow.Count = minIdle, 12
	if err := slow.EnsureGroup(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := make(chan stream.Summary)
	go func() { done <- run(t, slow, h) }()
	<-started // the slow worker holds all 12 now

	var peerClaimed atomic.Int64
	stopPeer := make(chan struct{})
	peerDone := make(chan struct{})
	go func() {
		defer close(peerDone)
		for {
			select {
			case <-stopPeer:
				return
			default:
			}
			p := f.consumer(t, "peer")
			p.MinIdle, p.Block = minIdle, 50*time.Millisecond
			sum, _ := p.Run(context.Background(), h)
			peerClaimed.Add(sum.Claimed)
		}
	}()
	sum := <-done
	close(stopPeer)
	<-peerDone
	if n := peerClaimed.Load(); n != 0 {
		t.Fatalf("work in progress stolen: a peer claimed %d entries from a live worker", n)
	}
	for id, n := range calls {
		if n != 1 {
			t.Fatalf("%s handled %d times", id, n)
		}
	}
	if sum.Acked != 12 || len(calls) != 12 {
		t.Fatalf("slow worker %+v, %d entries handled", sum, len(calls))
	}
}

// A stopped worker's entries are still reclaimed: renewal happens only while
// the worker runs.
func TestConsumer_DeadWorkersEntriesAreStillReclaimed(t *testing.T) {
	f := newFixture(t, 4)
	ctx, cancel := context.WithCancel(context.Background())
	c := f.consumer(t, "stuck")
	c.MinIdle, c.Grace = 200*time.Millisecond, 50*time.Millisecond
	stuck := func(hctx context.Context, _ stream.Delivery) error { cancel(); <-hctx.Done(); return hctx.Err() }
	c.Run(ctx, stuck) // abandons its batch after Grace: the entries stay pending for "stuck"
	time.Sleep(300 * time.Millisecond)
	p := f.consumer(t, "peer")
	p.MinIdle = 200 * time.Millisecond
	sum := run(t, p, newRecorder(nil).handle)
	if sum.Claimed != 4 || sum.Acked != 4 {
		t.Fatalf("peer %+v: the stopped worker's entries should be reclaimed", sum)
	}
}

const windowsKey = "emq:{cm}:windows:events:billing"

// Attempts count handler starts: while the tenth of 20 slow handlers runs,
// the consumer's window of first starts reaches the tenth entry and no
// further (what a kill would leave), though all 20 were read; every handler
// finds its entry in the window, whether the batch's first step is written
// as its handlers start (dedupe markers: no read ahead) or before its read
// ahead. A clean end leaves no record.
func TestConsumer_StartsAreRecordedBeforeEachHandler(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dedupe time.Duration
	}{{"with the handlers", time.Hour}, {"before the read ahead", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 20)
			c := f.consumer(t, "w1")
			c.Count, c.DedupeTTL = 20, tc.dedupe
			var window string
			var n atomic.Int64
			h := func(ctx context.Context, d stream.Delivery) error {
				w := f.rdb.HGet(ctx, windowsKey, "w1").Val()
				if !windowHolds(w, d.StreamID) {
					t.Errorf("%s started outside the recorded window %q", d.StreamID, w)
				}
				if n.Add(1) == 10 {
					window = w
				}
				time.Sleep(2 * time.Millisecond)
				if d.Attempts != 1 || d.Deliveries != 1 {
					t.Errorf("%s: attempts %d, deliveries %d, want 1 and 1", d.ID, d.Attempts, d.Deliveries)
				}
				return nil
			}
			run(t, c, h)
			if want := f.ids[0].StreamID.String() + " " + f.ids[9].StreamID.String(); window != want {
				t.Fatalf("window of first starts while the tenth handler ran: %q, want %q", window, want)
			}
			ctx := context.Background()
			if left := f.rdb.HLen(ctx, attemptsKey).Val() + f.rdb.HLen(ctx, windowsKey).Val(); left != 0 {
				t.Fatalf("%d start records left after every entry was acked", left)
			}
		})
	}
}

// Concurrent slow handlers ask for their records all at once as a batch
// begins: that is no sign they are quick. While they run, the window of
// first starts never reaches past the entries whose handlers started by
// more than the workers about to start theirs (a kill would count a start
// for each entry it reaches unstarted), and each handler finds its own.
func TestConsumer_ConcurrentSlowHandlersKeepTheWindowAtTheirStarts(t *testing.T) {
	const entries, workers = 48, 8
	f := newFixture(t, entries)
	c := f.consumer(t, "w1")
	c.Count, c.Concurrency = entries, workers
	var mu sync.Mutex
	started := map[string]bool{}
	worst := 0
	h := func(ctx context.Context, d stream.Delivery) error {
		mu.Lock()
		started[d.StreamID.String()] = true
		mu.Unlock()
		w := f.rdb.HGet(ctx, windowsKey, "w1").Val()
		if !windowHolds(w, d.StreamID) {
			t.Errorf("%s started outside the recorded window %q", d.StreamID, w)
		}
		mu.Lock()
		unstarted := 0
		for _, id := range f.ids {
			if windowHolds(w, id.StreamID) && !started[id.StreamID.String()] {
				unstarted++
			}
		}
		worst = max(worst, unstarted)
		mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		return nil
	}
	if sum := run(t, c, h); sum.Acked != entries {
		t.Fatalf("summary %+v", sum)
	}
	if worst >= workers {
		t.Fatalf("the window of first starts held %d entries whose handlers had not started (%d workers)", worst, workers)
	}
}

// windowHolds reports whether a window "lo hi" holds id.
func windowHolds(w string, id brand.StreamID) bool {
	lo, hi, ok := strings.Cut(w, " ")
	l, lerr := brand.ParseStreamID(lo)
	h, herr := brand.ParseStreamID(hi)
	return ok && lerr == nil && herr == nil && id.Compare(l) >= 0 && id.Compare(h) <= 0
}

// A slow batch acks each success as it comes, not all at the end: a kill
// in the middle of it leaves only the running entry unsettled.
func TestConsumer_SlowBatchAcksAsItGoes(t *testing.T) {
	f := newFixture(t, 10)
	c := f.consumer(t, "w1")
	c.Count = 10
	var pendingAtLast int64
	h := func(ctx context.Context, d stream.Delivery) error {
		if d.ID == f.ids[9] {
			pendingAtLast = f.pending(t)
		}
		time.Sleep(30 * time.Millisecond)
		return nil
	}
	if sum := run(t, c, h); sum.Acked != 10 {
		t.Fatalf("summary %+v", sum)
	}
	if pendingAtLast != 1 {
		t.Fatalf("%d pending while the last of ten 30 ms handlers ran, want 1 (the nine before it acked)", pendingAtLast)
	}
}

// Entries read but never started (the run stopped) do not lose an attempt,
// and deliveries that Redis counted do not turn into attempts.
func TestConsumer_UnstartedEntriesKeepTheirAttempts(t *testing.T) {
	f := newFixture(t, 10)
	for range 3 { // three runs, each stopped after the first handler
		ctx, cancel := context.WithCancel(context.Background())
		c := f.consumer(t, "w1")
		c.Count, c.MaxAttempts = 10, 2
		var first sync.Once
		h := func(_ context.Context, d stream.Delivery) error {
			first.Do(cancel)
			return errors.New("not yet")
		}
		c.Run(ctx, h)
		cancel()
	}
	ctx := context.Background()
	if got := f.rdb.HGetAll(ctx, attemptsKey).Val(); len(got) != 1 || got[f.ids[1].StreamID.String()] != "1" {
		t.Fatalf("start records after three stopped runs: %v, want only the second entry's single start", got)
	}
	rec := newRecorder(nil)
	c := f.consumer(t, "w1")
	c.MaxAttempts = 2
	sum := run(t, c, rec.handle)
	// The first entry failed in runs 1 and 2 (dead-lettered on its second
	// failure); the second one failed once in run 3; the others never started.
	if sum.Acked != 9 || sum.DeadLettered != 0 || len(rec.calls) != 9 {
		t.Fatalf("after three stopped runs: %+v, %d handled", sum, len(rec.calls))
	}
	if dl := f.deadLetters(t); len(dl) != 1 || dl[0].Values["attempts"] != "2" {
		t.Fatalf("dead letters %v", dl)
	}
}

// An entry whose handler was started MaxAttempts times without settling
// (each start killed its worker) is dead-lettered before a further start.
func TestConsumer_StartedTooOftenIsDeadLetteredUnstarted(t *testing.T) {
	f := newFixture(t, 2)
	ctx := context.Background()
	c := f.consumer(t, "w1")
	c.MaxAttempts = 3
	c.EnsureGroup(ctx)
	// A worker read both, started the first three times and died each time.
	f.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "w1", Streams: []string{f.log.Key(), ">"}, Count: 10})
	f.rdb.HSet(ctx, attemptsKey, f.ids[0].StreamID.String(), 3)
	rec := newRecorder(nil)
	sum := run(t, c, rec.handle)
	if sum.DeadLettered != 1 || sum.Acked != 1 || rec.calls[f.ids[0]] != 0 {
		t.Fatalf("summary %+v, calls %v", sum, rec.calls)
	}
	dl := f.deadLetters(t)
	if len(dl) != 1 || dl[0].Values["attempts"] != "3" || !strings.Contains(dl[0].Values["reason"].(string), "started 3 times") {
		t.Fatalf("dead letter %v", dl)
	}
	if left := f.rdb.HLen(ctx, attemptsKey).Val(); left != 0 {
		t.Fatalf("%d start records left", left)
	}
}

// With DedupeTTL the marker is written as soon as the handler succeeds,
// before the batch is acked: a kill in between leaves it behind.
func TestConsumer_DedupeMarkerPrecedesTheAck(t *testing.T) {
	f := newFixture(t, 3)
	c := f.consumer(t, "w1")
	c.DedupeTTL, c.Count = time.Minute, 3
	var markedBeforeAck []bool
	h := func(ctx context.Context, d stream.Delivery) error {
		if d.ID == f.ids[2] { // the first two have succeeded, none is acked yet
			for _, id := range f.ids[:2] {
				key := "emq:{cm}:done:events:billing:" + id.String()
				markedBeforeAck = append(markedBeforeAck, f.rdb.Exists(ctx, key).Val() == 1)
			}
			if p := f.pending(t); p != 3 {
				t.Errorf("%d pending, want 3", p)
			}
		}
		return nil
	}
	run(t, c, h)
	if len(markedBeforeAck) != 2 || !markedBeforeAck[0] || !markedBeforeAck[1] {
		t.Fatalf("markers of handled, unacked entries: %v, want both written", markedBeforeAck)
	}
}

// A window left by a killed worker counts one start for each entry in it
// still pending, and none for the others.
func TestConsumer_AWindowLeftByAKillCountsOneStart(t *testing.T) {
	f := newFixture(t, 6)
	ctx := context.Background()
	c := f.consumer(t, "w1")
	c.MaxAttempts = 2
	c.EnsureGroup(ctx)
	// w1 read all six and was killed with the first four recorded as started.
	f.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "w1", Streams: []string{f.log.Key(), ">"}, Count: 10})
	f.rdb.HSet(ctx, windowsKey, "w1", f.ids[0].StreamID.String()+" "+f.ids[3].StreamID.String())
	attempts := map[string]int64{}
	var mu sync.Mutex
	h := func(_ context.Context, d stream.Delivery) error {
		mu.Lock()
		attempts[d.ID.String()] = d.Attempts
		mu.Unlock()
		return errors.New("still failing")
	}
	sum := run(t, c, h)
	for i, id := range f.ids {
		want := int64(1)
		if i < 4 {
			want = 2
		}
		if attempts[id.String()] != want {
			t.Fatalf("entry %d started as attempt %d, want %d", i, attempts[id.String()], want)
		}
	}
	if sum.DeadLettered != 4 || sum.Failed != 2 {
		t.Fatalf("summary %+v: the four in the window reach max-attempts 2, the others fail once", sum)
	}
}

// A handler that says when it begins (HandlerBegins) has its start
// recorded there and not before, on its own, whatever order concurrent
// handlers get ready in: at each Begin, every start on record is one whose
// handler began (or returned), and none is in a window. A handler that
// returns without calling Begin has its start recorded as it returns: it
// counts against MaxAttempts like any other.
func TestConsumer_AHandlerThatBeginsItselfIsCountedFromItsBegin(t *testing.T) {
	const entries = 24
	f := newFixture(t, entries)
	c := f.consumer(t, "w1")
	c.Count, c.Concurrency, c.HandlerBegins, c.MaxAttempts = entries, 4, true, 3
	var mu sync.Mutex
	begun := map[string]bool{}
	checkRecords := func(ctx context.Context, when string) {
		recs := f.rdb.HGetAll(ctx, attemptsKey).Val()
		mu.Lock()
		defer mu.Unlock()
		for sid := range recs {
			if !begun[sid] {
				t.Errorf("%s: a start of %s is on record, whose handler has not begun", when, sid)
			}
		}
		if w := f.rdb.HGet(ctx, windowsKey, "w1").Val(); w != "" {
			t.Errorf("%s: a window of first starts %q", when, w)
		}
	}
	fails := func(d stream.Delivery) bool { return d.Fields["n"] == "3" || d.Fields["n"] == "17" }
	attempts := map[string]int64{}
	h := func(ctx context.Context, d stream.Delivery) error {
		sid := d.StreamID.String()
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond) // getting ready
		checkRecords(ctx, "before "+sid+" began")
		mu.Lock()
		attempts[sid] = d.Attempts
		begun[sid] = true // a record of it may appear from here on
		mu.Unlock()
		if fails(d) {
			return errors.New("fails before it begins")
		}
		if err := d.Begin(); err != nil {
			return err
		}
		if got := f.rdb.HGet(ctx, attemptsKey, sid).Val(); got != fmt.Sprint(d.Attempts) {
			t.Errorf("%s began as attempt %d, recorded %q", sid, d.Attempts, got)
		}
		return nil
	}
	if sum := run(t, c, h); sum.Acked != entries-2 || sum.Failed != 2 {
		t.Fatalf("summary %+v", sum)
	}
	for sid, n := range attempts {
		if n != 1 {
			t.Errorf("%s: attempts %d, want 1", sid, n)
		}
	}
	ctx := context.Background()
	if recs := f.rdb.HGetAll(ctx, attemptsKey).Val(); len(recs) != 2 {
		t.Fatalf("start records after the run: %v, want the two failed entries at 1", recs)
	}
	// Each failed start was counted though it never called Begin: the
	// third is their last.
	for want := int64(2); want <= 3; want++ {
		clear(attempts)
		sum := run(t, c, h)
		for sid, n := range attempts {
			if n != want {
				t.Errorf("%s: started as attempt %d, want %d", sid, n, want)
			}
		}
		if len(attempts) != 2 || (want == 3) != (sum.DeadLettered == 2) {
			t.Fatalf("run %d: %d handlers, summary %+v", want, len(attempts), sum)
		}
	}
}
