package stream_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/stream"
)

// fixture is a stream with n appended entries and a consumer on it.
type fixture struct {
	log *stream.Log
	rdb *redis.Client
	ids []brand.ID
}

func newFixture(t *testing.T, n int) *fixture {
	t.Helper()
	l, rdb := newLog(t)
	f := &fixture{log: l, rdb: rdb}
	f.append(t, n)
	return f
}

func (f *fixture) append(t *testing.T, n int) {
	t.Helper()
	batch := make([]stream.Fields, n)
	for i := range batch {
		batch[i] = stream.Fields{"n": fmt.Sprint(len(f.ids) + i)}
	}
	ids, err := f.log.AppendBatch(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	f.ids = append(f.ids, ids...)
}

func (f *fixture) consumer(t *testing.T, name string) *stream.Consumer {
	t.Helper()
	c, err := stream.NewConsumer(f.log, "billing", name)
	if err != nil {
		t.Fatal(err)
	}
	c.Block = 100 * time.Millisecond
	c.MinIdle = time.Hour
	return c
}

func (f *fixture) pending(t *testing.T) int64 {
	t.Helper()
	p, err := f.rdb.XPending(context.Background(), f.log.Key(), "billing").Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

func (f *fixture) deadLetters(t *testing.T) []redis.XMessage {
	t.Helper()
	return f.rdb.XRange(context.Background(), "emq:{cm}:dead:events:billing", "-", "+").Val()
}

// recorder is a handler that records every call and fails as told.
type recorder struct {
	mu    sync.Mutex
	calls map[brand.ID]int
	fail  func(d stream.Delivery) error
}

func newRecorder(fail func(stream.Delivery) error) *recorder {
	return &recorder{calls: map[brand.ID]int{}, fail: fail}
}

func (r *recorder) handle(_ context.Context, d stream.Delivery) error {
	r.mu.Lock()
	r.calls[d.ID]++
	r.mu.Unlock()
	if r.fail != nil {
		return r.fail(d)
	}
	return nil
}

func run(t *testing.T, c *stream.Consumer, h stream.Handler) stream.Summary {
	t.Helper()
	sum, err := c.Run(context.Background(), h)
	if err != nil {
		t.Fatalf("Run: %v (summary %+v)", err, sum)
	}
	return sum
}

func TestConsumer_HandlesEverythingAndExitsIdle(t *testing.T) {
	f := newFixture(t, 250)
	rec := newRecorder(nil)
	sum := run(t, f.consumer(t, "w1"), rec.handle)
	if sum.New != 250 || sum.Acked != 250 || sum.ExitReason != stream.ExitIdle {
		t.Fatalf("summary %+v", sum)
	}
	for _, id := range f.ids {
		if rec.calls[id] != 1 {
			t.Fatalf("%s handled %d times", id, rec.calls[id])
		}
	}
	if p := f.pending(t); p != 0 {
		t.Fatalf("%d pending after a clean run", p)
	}
}

func TestConsumer_FailuresStayPendingAndAreDrainedNextRun(t *testing.T) {
	f := newFixture(t, 20)
	first := newRecorder(func(d stream.Delivery) error {
		if d.Fields["n"] == "3" || d.Fields["n"] == "7" {
			return errors.New("flaky")
		}
		return nil
	})
	sum := run(t, f.consumer(t, "w1"), first.handle)
	if sum.Acked != 18 || sum.Failed != 2 || f.pending(t) != 2 {
		t.Fatalf("first run %+v, pending %d", sum, f.pending(t))
	}
	var attempts []int64
	second := newRecorder(nil)
	sum = run(t, f.consumer(t, "w1"), func(ctx context.Context, d stream.Delivery) error {
		attempts = append(attempts, d.Attempts)
		return second.handle(ctx, d)
	})
	if sum.Drained != 2 || sum.Acked != 2 || f.pending(t) != 0 {
		t.Fatalf("second run %+v", sum)
	}
	if attempts[0] != 2 || attempts[1] != 2 {
		t.Fatalf("attempts on redelivery = %v, want the server's count 2", attempts)
	}
}

func TestConsumer_PoisonIsDeadLetteredAfterExactlyMaxAttempts(t *testing.T) {
	f := newFixture(t, 3)
	poison := f.ids[1]
	rec := newRecorder(func(d stream.Delivery) error {
		if d.ID == poison {
			return errors.New("cannot parse amount")
		}
		return nil
	})
	for i := range 5 {
		c := f.consumer(t, "w1")
		c.MaxAttempts = 3
		sum := run(t, c, rec.handle)
		if i == 2 && sum.DeadLettered != 1 {
			t.Fatalf("run %d: %+v, want the dead letter on the third delivery", i, sum)
		}
	}
	if rec.calls[poison] != 3 {
		t.Fatalf("poison handled %d times, want 3", rec.calls[poison])
	}
	dl := f.deadLetters(t)
	if len(dl) != 1 {
		t.Fatalf("%d dead letters", len(dl))
	}
	v := dl[0].Values
	if v["entry_id"] != poison.String() || v["attempts"] != "3" || !strings.Contains(fmt.Sprint(v["reason"]), "cannot parse amount") ||
		v["consumer"] != "w1" || v["payload"] != `{"n":"1"}` {
		t.Fatalf("dead letter %v", v)
	}
	if _, err := brand.Parse(fmt.Sprint(v["id"])); err != nil {
		t.Fatalf("dead letter has no branded id of its own: %v", err)
	}
	if f.pending(t) != 0 {
		t.Fatal("poison still pending after dead-lettering")
	}
}

func TestConsumer_PermanentErrorDeadLettersAtOnce(t *testing.T) {
	f := newFixture(t, 2)
	rec := newRecorder(func(d stream.Delivery) error {
		if d.ID == f.ids[0] {
			return stream.Permanent(errors.New("unknown account"))
		}
		return nil
	})
	sum := run(t, f.consumer(t, "w1"), rec.handle)
	if sum.DeadLettered != 1 || sum.Acked != 1 || rec.calls[f.ids[0]] != 1 || f.pending(t) != 0 {
		t.Fatalf("summary %+v", sum)
	}
}

func TestConsumer_ReclaimsDeadPeerAfterMinIdleNotBefore(t *testing.T) {
	f := newFixture(t, 10)
	ctx := context.Background()
	peer := f.consumer(t, "peer")
	if err := peer.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	// The peer reads everything and dies before handling it.
	f.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "peer", Streams: []string{f.log.Key(), ">"}, Count: 100})
	rec := newRecorder(nil)
	c := f.consumer(t, "w2")
	c.MinIdle = 700 * time.Millisecond
	sum := run(t, c, rec.handle)
	if sum.Claimed != 0 || len(rec.calls) != 0 {
		t.Fatalf("claimed before min-idle: %+v", sum)
	}
	time.Sleep(800 * time.Millisecond)
	c = f.consumer(t, "w2")
	c.MinIdle = 700 * time.Millisecond
	sum = run(t, c, rec.handle)
	if sum.Claimed != 10 || sum.Acked != 10 || len(rec.calls) != 10 || f.pending(t) != 0 {
		t.Fatalf("after min-idle: %+v", sum)
	}
}

func TestConsumer_ReclaimBeatRunsDuringLongRuns(t *testing.T) {
	f := newFixture(t, 5)
	ctx := context.Background()
	c := f.consumer(t, "w1")
	c.EnsureGroup(ctx)
	f.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "peer", Streams: []string{f.log.Key(), ">"}, Count: 100})
	f.append(t, 5)
	c.MinIdle = 300 * time.Millisecond
	c.ClaimEvery = 100 * time.Millisecond
	c.Block = time.Second
	c.MaxEntries = 10
	rec := newRecorder(nil)
	sum := run(t, c, rec.handle)
	if sum.New != 5 || sum.Claimed != 5 || sum.ExitReason != stream.ExitMaxEntries {
		t.Fatalf("summary %+v: the beat should reclaim the peer's entries once idle", sum)
	}
}

func TestConsumer_TrimmedWhilePending(t *testing.T) {
	for _, tc := range []struct {
		name     string
		source   stream.PayloadSource
		byPeer   bool
		lost     int64
		recovers int64
	}{
		{"own PEL, no source", nil, false, 3, 0},
		{"peer PEL via xautoclaim deleted ids, no source", nil, true, 3, 0},
		{"own PEL, recovered", archiveStub{}, false, 0, 3},
		{"peer PEL, recovered", archiveStub{}, true, 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 5)
			ctx := context.Background()
			c := f.consumer(t, "w1")
			c.EnsureGroup(ctx)
			reader := "w1"
			if tc.byPeer {
				reader = "peer"
				c.MinIdle = time.Millisecond
			}
			f.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: reader, Streams: []string{f.log.Key(), ">"}, Count: 100})
			f.log.TrimMinID(ctx, f.ids[3].StreamID, true) // the first 3 are gone while pending
			time.Sleep(5 * time.Millisecond)
			var recovered []stream.Delivery
			c.Payloads = tc.source
			sum := run(t, c, func(_ context.Context, d stream.Delivery) error {
				if d.Recovered {
					recovered = append(recovered, d)
				}
				return nil
			})
			if sum.PayloadLost != tc.lost || sum.PayloadRecovered != tc.recovers || sum.DeadLettered != tc.lost || sum.Acked != 5-tc.lost {
				t.Fatalf("summary %+v", sum)
			}
			if tc.recovers > 0 && (recovered[0].ID != f.ids[0] || recovered[0].Fields["n"] != "recovered") {
				t.Fatalf("recovered delivery %+v, want %s", recovered[0], f.ids[0])
			}
			for _, dl := range f.deadLetters(t) {
				if !strings.Contains(fmt.Sprint(dl.Values["reason"]), "payload trimmed") {
					t.Fatalf("dead letter reason %v", dl.Values["reason"])
				}
			}
			if p := f.pending(t); p != 0 {
				t.Fatalf("%d still pending", p)
			}
		})
	}
}

// archiveStub recovers any entry, as an archive holding everything would.
type archiveStub struct{}

func (archiveStub) Payload(_ context.Context, sid brand.StreamID) (brand.ID, stream.Fields, error) {
	id, err := brand.New(brand.EVT, sid)
	return id, stream.Fields{"n": "recovered"}, err
}

func TestConsumer_MalformedEntriesAreDeadLetteredAndTheLoopGoesOn(t *testing.T) {
	f := newFixture(t, 1)
	ctx := context.Background()
	base := f.ids[0].MS
	usr, _ := brand.New(brand.USR, brand.StreamID{MS: base + 3})
	for i, v := range [][]string{{"a", "no id"}, {"id", "EVT_garbage"}, {"id", usr.String()}} {
		f.rdb.XAdd(ctx, &redis.XAddArgs{Stream: f.log.Key(), ID: fmt.Sprintf("%d-0", base+uint64(i)+1), Values: v})
	}
	f.append(t, 1)
	rec := newRecorder(nil)
	sum := run(t, f.consumer(t, "w1"), rec.handle)
	// The entry without an "id" field is another producer's: handled
	// under the id its stream id maps to.
	if sum.Malformed != 2 || sum.DeadLettered != 2 || sum.Acked != 3 || len(rec.calls) != 3 {
		t.Fatalf("summary %+v", sum)
	}
	var reasons []string
	for _, dl := range f.deadLetters(t) {
		reasons = append(reasons, fmt.Sprint(dl.Values["reason"]))
	}
	for i, want := range []string{"EVT_garbage", "kind USR"} {
		if !strings.Contains(reasons[i], want) {
			t.Errorf("reason %d = %q, want it to name %q", i, reasons[i], want)
		}
	}
}

func TestConsumer_PanicIsRecoveredAndLeftPending(t *testing.T) {
	f := newFixture(t, 3)
	sum := run(t, f.consumer(t, "w1"), func(_ context.Context, d stream.Delivery) error {
		if d.ID == f.ids[1] {
			panic("nil map")
		}
		return nil
	})
	if sum.Panics != 1 || sum.Failed != 1 || sum.Acked != 2 || f.pending(t) != 1 {
		t.Fatalf("summary %+v", sum)
	}
}

func TestConsumer_MaxEntriesBudget(t *testing.T) {
	f := newFixture(t, 100)
	c := f.consumer(t, "w1")
	c.MaxEntries = 30
	c.Count = 7
	sum := run(t, c, newRecorder(nil).handle)
	if sum.Acked != 30 || sum.ExitReason != stream.ExitMaxEntries || f.pending(t) != 0 {
		t.Fatalf("summary %+v, pending %d: the budget must not over-read", sum, f.pending(t))
	}
}

func TestConsumer_MaxDuration(t *testing.T) {
	f := newFixture(t, 1)
	c := f.consumer(t, "w1")
	c.Block = time.Hour
	c.MaxDuration = 300 * time.Millisecond
	start := time.Now()
	sum := run(t, c, newRecorder(nil).handle)
	if sum.ExitReason != stream.ExitMaxTime || time.Since(start) > 5*time.Second {
		t.Fatalf("summary %+v after %v", sum, time.Since(start))
	}
}

func TestConsumer_CancelFinishesOrAbandonsInFlight(t *testing.T) {
	f := newFixture(t, 6)
	ctx, cancel := context.WithCancel(context.Background())
	c := f.consumer(t, "w1")
	c.Concurrency = 2
	c.Grace = 200 * time.Millisecond
	var acked sync.Map
	started := make(chan struct{}, 6)
	sum, err := c.Run(ctx, func(hctx context.Context, d stream.Delivery) error {
		started <- struct{}{}
		if d.ID == f.ids[0] { // finishes within the grace period
			for len(started) < 2 {
				time.Sleep(time.Millisecond)
			}
			cancel()
			time.Sleep(50 * time.Millisecond)
			acked.Store(d.ID, true)
			return nil
		}
		<-hctx.Done() // ignores nothing: gives up when its context ends
		time.Sleep(time.Second)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if sum.ExitReason != stream.ExitSignal || sum.Acked != 1 || sum.Abandoned != 5 || len(started) != 2 {
		t.Fatalf("summary %+v, %d started", sum, len(started))
	}
	if p := f.pending(t); p != 5 {
		t.Fatalf("%d pending, want the 5 unfinished", p)
	}
}

// A handler that ignores its context does not hold the run: after Grace
// its entry is abandoned (left pending) and Run returns once the handlers
// have had their moment to be gone, with the handler still running.
func TestConsumer_HandlerThatIgnoresItsContextDoesNotHoldTheRun(t *testing.T) {
	f := newFixture(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	c := f.consumer(t, "w1")
	c.Grace = 100 * time.Millisecond
	release := make(chan struct{})
	time.AfterFunc(6*time.Second, func() { close(release) }) // a run that waits for it fails below, not hangs
	start := time.Now()
	sum, err := c.Run(ctx, func(context.Context, stream.Delivery) error {
		cancel()
		<-release // past Grace and the reap, whatever its context says
		return nil
	})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Abandoned != 1 || sum.Acked != 0 || took > 4*time.Second {
		t.Fatalf("summary %+v after %v; want the entry abandoned and Run back after Grace and the reap (about 2.1 s)", sum, took)
	}
	if p := f.pending(t); p != 1 {
		t.Fatalf("%d pending, want the abandoned entry", p)
	}
}

func TestConsumer_DedupeSkipsWhatTheGroupHandled(t *testing.T) {
	f := newFixture(t, 4)
	ctx := context.Background()
	c := f.consumer(t, "w1")
	c.DedupeTTL = time.Minute
	rec := newRecorder(nil)
	run(t, c, rec.handle)
	// Rewind the group: every entry is delivered again, as after a lost ack.
	if err := f.rdb.XGroupSetID(ctx, f.log.Key(), "billing", "0").Err(); err != nil {
		t.Fatal(err)
	}
	c = f.consumer(t, "w2")
	c.DedupeTTL = time.Minute
	sum := run(t, c, rec.handle)
	if sum.DuplicatesSkipped != 4 || sum.Acked != 4 || len(rec.calls) != 4 || rec.calls[f.ids[0]] != 1 {
		t.Fatalf("summary %+v, calls %v", sum, rec.calls)
	}
}

func TestConsumer_ForgetsStaleConsumersWithNothingPending(t *testing.T) {
	f := newFixture(t, 2)
	ctx := context.Background()
	c := f.consumer(t, "w1")
	c.EnsureGroup(ctx)
	f.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "holder", Streams: []string{f.log.Key(), ">"}, Count: 1})
	f.rdb.XGroupCreateConsumer(ctx, f.log.Key(), "billing", "gone")
	// Each left a window of first starts: killed while it waited in a
	// read (an open window), or after a batch.
	windows := f.log.Keyspace().StartWindows(f.log.Name(), "billing")
	f.rdb.HSet(ctx, windows, "gone", "next 0-0 1", "holder", f.ids[0].StreamID.String()+" "+f.ids[0].StreamID.String())
	time.Sleep(30 * time.Millisecond)
	c.ForgetAfter = 20 * time.Millisecond
	n, err := c.ForgetStale(ctx)
	if err != nil || n != 1 {
		t.Fatalf("ForgetStale = %d, %v; want 1", n, err)
	}
	var names []string
	for _, k := range f.rdb.XInfoConsumers(ctx, f.log.Key(), "billing").Val() {
		names = append(names, k.Name)
	}
	if fmt.Sprint(names) != "[holder]" {
		t.Fatalf("consumers left: %v, want the one with a pending entry", names)
	}
	if left := f.rdb.HKeys(ctx, windows).Val(); fmt.Sprint(left) != "[holder]" {
		t.Fatalf("windows left for %v, want the window of the consumer kept (a forgotten one has nothing pending for it to count)", left)
	}
}

func TestConsumer_ConcurrencyIsBounded(t *testing.T) {
	f := newFixture(t, 40)
	c := f.consumer(t, "w1")
	c.Concurrency = 4
	var now, peak atomic.Int64
	sum := run(t, c, func(context.Context, stream.Delivery) error {
		n := now.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
		now.Add(-1)
		return nil
	})
	if sum.Acked != 40 || peak.Load() != 4 {
		t.Fatalf("acked %d, peak concurrency %d, want 4", sum.Acked, peak.Load())
	}
}

func TestNewConsumer_BadNames(t *testing.T) {
	l, _ := newLog(t)
	if _, err := stream.NewConsumer(l, "bad group", "w"); !errors.Is(err, stream.ErrBadName) {
		t.Fatalf("bad group: %v", err)
	}
	if _, err := stream.NewConsumer(l, "g", "w{1}"); !errors.Is(err, stream.ErrBadName) {
		t.Fatalf("bad consumer: %v", err)
	}
}

func TestConsumer_DeadLettersListAndRetry(t *testing.T) {
	f := newFixture(t, 3)
	ctx := context.Background()
	c := f.consumer(t, "w1")
	run(t, c, func(_ context.Context, d stream.Delivery) error {
		return stream.Permanent(fmt.Errorf("bad %s", d.Fields["n"]))
	})
	var listed []stream.DeadLetter
	for dl, err := range c.DeadLetters(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, dl)
	}
	if len(listed) != 3 || listed[0].EntryID != f.ids[0].String() || listed[0].Attempts != 1 ||
		listed[0].Payload["n"] != "0" || listed[0].Reason != "permanent error: bad 0" || listed[0].Time.IsZero() {
		t.Fatalf("listed %+v", listed)
	}
	// Retry one that fails again: it stays.
	res, err := c.RetryDead(ctx, func(context.Context, stream.Delivery) error { return errors.New("still bad") }, f.ids[1].String())
	if err != nil || res.Failed != 1 || res.Succeeded != 0 {
		t.Fatalf("failing retry: %+v %v", res, err)
	}
	// Retry all that succeed: all are removed, each only after success.
	var got []stream.Delivery
	res, err = c.RetryDead(ctx, func(_ context.Context, d stream.Delivery) error { got = append(got, d); return nil }, "")
	if err != nil || res.Succeeded != 3 || len(got) != 3 || got[0].ID != f.ids[0] || got[0].Attempts != 2 {
		t.Fatalf("retry all: %+v %v %+v", res, err, got)
	}
	if n := f.rdb.XLen(ctx, "emq:{cm}:dead:events:billing").Val(); n != 0 {
		t.Fatalf("%d dead letters left", n)
	}
	if _, err := c.RetryDead(ctx, nil, "EVT_nothing"); err == nil {
		t.Fatal("retrying an unknown id succeeded")
	}
}

func TestInspect(t *testing.T) {
	f := newFixture(t, 10)
	ctx := context.Background()
	c := f.consumer(t, "w1")
	c.EnsureGroup(ctx)
	f.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "peer", Streams: []string{f.log.Key(), ">"}, Count: 4})
	f.log.TrimMinID(ctx, f.ids[2].StreamID, true)
	st, err := stream.Inspect(ctx, f.log, "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Length != 8 || st.EntriesAdded != 10 || st.FirstID != f.ids[2].StreamID.String() || len(st.Groups) != 1 {
		t.Fatalf("status %+v", st)
	}
	g := st.Groups[0]
	if g.Pending != 4 || g.PendingTrimmed != 2 || g.OldestPendingID != f.ids[0].StreamID.String() || len(g.Consumers) != 1 {
		t.Fatalf("group %+v", g)
	}
	if g.Lag != nil && *g.Lag != 6 {
		t.Fatalf("lag %d, want 6 or unknown", *g.Lag)
	}
	if _, err := stream.Inspect(ctx, f.log, "nope"); err == nil {
		t.Fatal("Inspect of a missing group succeeded")
	}
}

func none(int) time.Duration { return 0 }

func every(d time.Duration) func(int) time.Duration { return func(int) time.Duration { return d } }

// With Count 0 reads grow while batches are handled quickly and stay small
// when they are not; a fixed Count is kept.
func TestConsumer_AdaptiveReadSize(t *testing.T) {
	for _, tc := range []struct {
		name        string
		entries     int
		count       int64
		minIdle     time.Duration
		handler     func(n int) time.Duration // the handler's time for the nth delivery
		wantBatches []int
		pad         int // payload bytes per entry
	}{
		// Each read is issued (read ahead) before the batch before it is
		// handled, so a size shows up one batch after it was chosen; a
		// batch read ahead is full when it holds what its read asked for.
		{"fast grows", 5000, 0, time.Hour, none, []int{100, 100, 200, 400, 800, 1000, 1000, 1000, 400}, 0},
		{"fixed count", 1000, 100, time.Hour, none, []int{100, 100, 100, 100, 100, 100, 100, 100, 100, 100}, 0},
		// 100 × 2 ms is over MinIdle/100: no growth.
		{"slow stays", 300, 0, 2 * time.Second, every(2 * time.Millisecond), []int{100, 100, 100}, 0},
		// The 5th batch (entries 801 to 1,600) takes over MinIdle/10: the
		// read chosen after it halves to 500 where it would have stayed
		// 1,000.
		{"slow shrinks", 3400, 0, 20 * time.Second, func(n int) time.Duration {
			if n == 1401 {
				return 2100 * time.Millisecond
			}
			return 0
		}, []int{100, 100, 200, 400, 800, 1000, 500, 300}, 0},
		// 100 entries of 30 KB are over half the byte budget of a batch: no growth.
		{"big entries stay", 300, 0, time.Hour, none, []int{100, 100, 100}, 30 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 0)
			batch := make([]stream.Fields, tc.entries)
			for i := range batch {
				batch[i] = stream.Fields{"n": fmt.Sprint(i), "pad": strings.Repeat("x", tc.pad)}
			}
			if _, err := f.log.AppendBatch(context.Background(), batch); err != nil {
				t.Fatal(err)
			}
			c := f.consumer(t, "w1")
			c.Count, c.MinIdle = tc.count, tc.minIdle
			var batches []int // deliveries after each read (beats and the PEL drain read nothing here)
			n := 0
			c.Failpoint = func(name failpoint.Name) {
				if name == failpoint.AfterRead {
					batches = append(batches, 0)
				}
			}
			sum, err := c.Run(context.Background(), func(context.Context, stream.Delivery) error {
				batches[len(batches)-1]++
				n++
				time.Sleep(tc.handler(n))
				return nil
			})
			if err != nil || sum.Acked != int64(tc.entries) {
				t.Fatalf("run: %+v %v", sum, err)
			}
			batches = slices.DeleteFunc(batches, func(n int) bool { return n == 0 })
			if !slices.Equal(batches, tc.wantBatches) {
				t.Fatalf("batches %v, want %v", batches, tc.wantBatches)
			}
		})
	}
}

// A stream fed an entry at a time is read once per entry: a batch shorter
// than its read asked for emptied the stream, so no read ahead goes out
// after it to come back empty (a round trip the next entry's blocking read
// waited behind). Each entry's ack rides on the read after it.
func TestConsumer_AStreamFedAnEntryAtATimeIsReadOncePerEntry(t *testing.T) {
	const n = 20
	l, rdb := newLog(t)
	ctx := context.Background()
	c, err := stream.NewConsumer(l, "g", "w1")
	if err != nil {
		t.Fatal(err)
	}
	c.Block, c.MaxEntries = 5*time.Second, n
	done := make(chan stream.Summary, 1)
	handled := make(chan struct{}, n)
	go func() {
		sum, err := c.Run(ctx, func(context.Context, stream.Delivery) error { handled <- struct{}{}; return nil })
		if err != nil {
			t.Error(err)
		}
		done <- sum
	}()
	if _, err := l.Append(ctx, stream.Fields{"n": "0"}); err != nil { // the group exists once this is handled
		t.Fatal(err)
	}
	<-handled
	before := calls(t, rdb, "xreadgroup")
	for i := 1; i < n; i++ {
		if _, err := l.Append(ctx, stream.Fields{"n": fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
		<-handled
		time.Sleep(2 * time.Millisecond) // the worker is back in its blocking read
	}
	sum := <-done
	if sum.Acked != n {
		t.Fatalf("summary %+v", sum)
	}
	if reads := calls(t, rdb, "xreadgroup") - before; reads > n+1 {
		t.Fatalf("%d XREADGROUP for %d entries appended one at a time, want one each, not a read ahead after each too", reads, n-1)
	}
}

// calls returns how many times the server has run command.
func calls(t *testing.T, rdb *redis.Client, command string) int {
	t.Helper()
	for _, line := range strings.Split(rdb.Info(context.Background(), "commandstats").Val(), "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+command+":calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			return n
		}
	}
	return 0
}
