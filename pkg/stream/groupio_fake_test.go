package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
)

// fakeGroup is groupIO in memory: one stream, one group, one consumer, with
// errors injected where a test asks. It lets the loop's decisions be tested
// without Redis (what Redis itself does is tested against redis-server).
type fakeGroup struct {
	mu         sync.Mutex
	entries    []message
	delivered  int              // entries[:delivered] were read by the group
	pel        map[string]int64 // pending id -> deliveries
	starts     map[string]int64
	window     string   // this consumer's window of first starts, "lo hi" (or open: "next after n")
	windows    []string // every window recorded with a read, in order
	steps      []string // every window recorded on its own (recordWindow), in order
	dead       []Fields
	acks       [][]string // every ack call's ids
	ackErr     error      // every ack fails with it
	startErr   error      // every start record fails with it
	firstSteps int        // steps of first starts recorded with a read ahead
}

var _ groupIO = (*fakeGroup)(nil)

func newFakeGroup(t *testing.T, n int) (*fakeGroup, *Consumer) {
	t.Helper()
	g := &fakeGroup{pel: map[string]int64{}, starts: map[string]int64{}}
	m, _ := brand.NewMinter(brand.EVT)
	for i := range n {
		id := m.Mint()
		g.entries = append(g.entries, message{ID: id.StreamID.String(), Fields: Fields{IDField: id.String(), "n": fmt.Sprint(i)}})
	}
	ks, _ := NewKeyspace("", "cm")
	l, err := NewLog(nil, ks, "events", brand.EVT)
	if err != nil {
		t.Fatal(err)
	}
	c := &Consumer{log: l, group: "g", name: "w1", io: g, Block: 20 * time.Millisecond, MinIdle: time.Hour}
	c.defaults()
	return g, c
}

// deliver counts a delivery of msgs and returns them as a read does: each
// with a map of its own (the run takes "id" out of it).
func (g *fakeGroup) deliver(msgs []message) []message {
	out := make([]message, len(msgs))
	for i, m := range msgs {
		g.pel[m.ID]++
		out[i] = message{ID: m.ID, Fields: maps.Clone(m.Fields)}
	}
	return out
}

func (g *fakeGroup) readPending(_ context.Context, after string, count int64) ([]message, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []message
	for _, m := range g.entries[:g.delivered] {
		if _, ok := g.pel[m.ID]; ok && (after == "0" || lessID(after, m.ID)) && int64(len(out)) < count {
			out = append(out, m)
		}
	}
	return g.deliver(out), nil
}

func (g *fakeGroup) readNew(ctx context.Context, _ time.Duration, count int64, acks ackSet) ([]message, error, error) {
	if len(acks.ids) > 0 {
		if err := g.ack(ctx, acks); err != nil {
			return nil, err, nil
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	end := min(g.delivered+int(count), len(g.entries))
	out := g.deliver(g.entries[g.delivered:end])
	g.delivered = end
	return out, nil, nil
}

func (g *fakeGroup) readNewStarting(ctx context.Context, block time.Duration, count int64, acks ackSet, window string) ([]message, error, error, error) {
	msgs, ackErr, err := g.readNew(ctx, block, count, acks)
	if window == "" || ackErr != nil {
		return msgs, ackErr, nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.startErr != nil {
		return msgs, nil, g.startErr, err
	}
	g.window = window
	g.windows = append(g.windows, window)
	return msgs, nil, nil, err
}

// resolve turns an open window ("next after n") into the range of the first
// n entries after after still pending with no record of their own, as
// resolveWindowsLua does. Called with g.mu held.
func (g *fakeGroup) resolve() {
	var after string
	var n int
	if _, err := fmt.Sscanf(g.window, "next %s %d", &after, &n); err != nil {
		return
	}
	var lo, hi string
	for _, m := range g.entries[:g.delivered] {
		_, pending := g.pel[m.ID]
		if n > 0 && pending && lessID(after, m.ID) {
			n--
			if g.starts[m.ID] == 0 {
				lo, hi = cmp.Or(lo, m.ID), m.ID
			}
		}
	}
	g.window = ""
	if lo != "" {
		g.window = lo + " " + hi
	}
}

func (g *fakeGroup) readNewRecordingGaps(ctx context.Context, count int64) ([]message, error) {
	msgs, _, err := g.readNew(ctx, -1, count, ackSet{})
	return msgs, err
}

func (g *fakeGroup) autoclaim(context.Context, time.Duration, string, int64, bool) (claimed, error) {
	return claimed{next: "0-0"}, nil
}

func (g *fakeGroup) counts(_ context.Context, ids []string, pendingOnly bool) (map[string]int64, map[string]int64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	deliveries, starts := map[string]int64{}, map[string]int64{}
	g.resolve()
	for _, id := range ids {
		if n, ok := g.pel[id]; ok && pendingOnly {
			deliveries[id] = n
		}
		if n := g.starts[id]; n > 0 {
			starts[id] = n
		} else if _, pending := g.pel[id]; pending && inWindow(map[string]string{"w1": g.window}, id) {
			starts[id] = 1
		}
	}
	return deliveries, starts, nil
}

func (g *fakeGroup) marked(_ context.Context, ids []string) ([]bool, error) {
	return make([]bool, len(ids)), nil
}

func (g *fakeGroup) recordWindow(_ context.Context, lo, hi string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.startErr != nil {
		return g.startErr
	}
	g.window = lo + " " + hi
	g.steps = append(g.steps, g.window)
	return nil
}

// sendWindow records at once; the run reads the reply later.
func (g *fakeGroup) sendWindow(ctx context.Context, cancel func(), lo, hi string) (func() error, bool) {
	err := g.recordWindow(ctx, lo, hi)
	return func() error { cancel(); return err }, true
}

func (g *fakeGroup) release() {}

func (g *fakeGroup) dropWindow(context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.window = ""
	return nil
}

func (g *fakeGroup) setStarts(_ context.Context, starts map[string]int64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.startErr != nil {
		return g.startErr
	}
	for id, n := range starts {
		if g.starts[id] = n; n == 0 {
			delete(g.starts, id)
		}
	}
	return nil
}

func (g *fakeGroup) ack(_ context.Context, a ackSet) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.acks = append(g.acks, slices.Clone(a.ids))
	if g.ackErr != nil {
		return g.ackErr
	}
	for _, id := range a.ids {
		delete(g.pel, id)
	}
	for _, id := range a.records {
		delete(g.starts, id)
	}
	return nil
}

// ackOwned acks what is still pending (a test takes an entry from this
// consumer by removing it from the PEL).
func (g *fakeGroup) ackOwned(ctx context.Context, a ackSet) ([]string, error) {
	g.mu.Lock()
	var owned ackSet
	var lost []string
	for _, id := range a.ids {
		if _, ok := g.pel[id]; ok || slices.Contains(a.gone, id) {
			owned.ids = append(owned.ids, id)
		} else {
			lost = append(lost, id)
		}
	}
	owned.records = a.records
	g.mu.Unlock()
	return lost, g.ack(ctx, owned)
}

func (g *fakeGroup) deadLetter(ctx context.Context, rec Fields, id string) error {
	g.mu.Lock()
	g.dead = append(g.dead, rec)
	g.mu.Unlock()
	return g.ack(ctx, ackSet{ids: []string{id}, records: []string{id}})
}

func (g *fakeGroup) mark(context.Context, string, time.Duration) error { return nil }
func (g *fakeGroup) renew(_ context.Context, ids []string) (int64, error) {
	return int64(len(ids)), nil
}
func (g *fakeGroup) ensureGroup(context.Context) error                           { return nil }
func (g *fakeGroup) forgetIdle(context.Context, time.Duration) ([]string, error) { return nil, nil }
func (g *fakeGroup) checkGap(context.Context) (int64, error)                     { return 0, nil }
func (g *fakeGroup) gapHead(context.Context) (string, bool, error)               { return "", false, nil }
func (g *fakeGroup) setGapHead(context.Context, string) error                    { return nil }
func (g *fakeGroup) dropGap(context.Context, string) error                       { return nil }
func (g *fakeGroup) takeLease(context.Context, time.Duration) (bool, error)      { return true, nil }
func (g *fakeGroup) releaseLease(context.Context)                                {}

func lessID(a, b string) bool {
	x, _ := brand.ParseStreamID(a)
	y, _ := brand.ParseStreamID(b)
	return x.Compare(y) < 0
}

// A failed ack fails the run and leaves the handled entries pending: they
// are redelivered, never lost.
func TestLoop_FailedAckFailsTheRun(t *testing.T) {
	g, c := newFakeGroup(t, 5)
	g.ackErr = errors.New("connection reset")
	sum, err := c.Run(context.Background(), func(context.Context, Delivery) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "connection reset") || sum.ExitReason != ExitError {
		t.Fatalf("run: %+v, %v", sum, err)
	}
	if len(g.pel) != 5 {
		t.Fatalf("%d pending after a failed ack, want 5", len(g.pel))
	}
}

// No handler starts without its start recorded, whether the batch's first
// step is recorded as its handlers start (no read ahead: dedupe markers) or
// before its read ahead is sent.
func TestLoop_NoStartRecordNoHandler(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dedupe time.Duration
	}{{"with the handlers", time.Hour}, {"before the read ahead", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			g, c := newFakeGroup(t, 3)
			c.DedupeTTL = tc.dedupe
			g.startErr = errors.New("i/o timeout")
			calls := 0
			_, err := c.Run(context.Background(), func(context.Context, Delivery) error { calls++; return nil })
			if err == nil || !strings.Contains(err.Error(), "i/o timeout") || calls != 0 || len(g.pel) != 3 {
				t.Fatalf("run: %v, %d handler calls, %d pending", err, calls, len(g.pel))
			}
		})
	}
}

// A failing entry is retried by later runs and dead-lettered on its
// MaxAttempts-th start, with its starts and Redis's deliveries recorded.
func TestLoop_PoisonGoesAfterMaxStarts(t *testing.T) {
	g, c := newFakeGroup(t, 2)
	c.MaxAttempts = 3
	poison := g.entries[0].ID
	calls := 0
	h := func(_ context.Context, d Delivery) error {
		if d.StreamID.String() == poison {
			calls++
			return errors.New("cannot parse amount")
		}
		return nil
	}
	for range 4 {
		if _, err := c.Run(context.Background(), h); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 3 || len(g.dead) != 1 || g.dead[0]["attempts"] != "3" || g.dead[0]["deliveries"] != "3" {
		t.Fatalf("%d calls, dead letters %v", calls, g.dead)
	}
	if len(g.pel) != 0 || len(g.starts) != 0 {
		t.Fatalf("left: pel %v, starts %v", g.pel, g.starts)
	}
}

// A quick batch is acked once; a slow one as its handlers finish.
func TestLoop_AcksQuickBatchesOnceSlowOnesAsTheyGo(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sleep time.Duration
		acks  int
	}{{"quick", 0, 1}, {"slow", 30 * time.Millisecond, 4}} {
		t.Run(tc.name, func(t *testing.T) {
			g, c := newFakeGroup(t, 4)
			c.Count, c.DedupeTTL = 4, time.Hour // no carried acks: each ack is a call
			h := func(context.Context, Delivery) error { time.Sleep(tc.sleep); return nil }
			if _, err := c.Run(context.Background(), h); err != nil {
				t.Fatal(err)
			}
			if len(g.acks) < tc.acks || (tc.acks == 1 && len(g.acks) != 1) || len(g.pel) != 0 {
				t.Fatalf("ack calls %v, want %d", g.acks, tc.acks)
			}
		})
	}
}

// Handlers take their jobs in order but may reach their start record in
// another: the handler of job 5 before those of 2 and 3. Every job's start
// is still recorded before its handler runs, and each gets its Attempts: a
// step begun at 5 once counted 2, 3 and 4 as recorded with no start of
// theirs written (a repeated start, such as job 3's, went uncounted).
func TestStarts_RecordedInJobOrderWhateverOrderHandlersAsk(t *testing.T) {
	g, c := newFakeGroup(t, 8)
	r := newRun(c, nil)
	r.window = 2
	r.answered.Store(true)
	jobs := make([]*job, len(g.entries))
	for i, m := range g.entries {
		sid, _ := brand.ParseStreamID(m.ID)
		jobs[i] = &job{sid: m.ID, d: Delivery{StreamID: sid}}
	}
	jobs[3].prior = 2 // started twice before: recorded alone, as 3
	st := r.newStarts(jobs, nil)
	ctx := context.Background()
	for _, i := range []int{0, 1, 5, 2, 3, 4, 7, 6} {
		if err := st.record(ctx, i); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if jobs[i].d.Attempts != jobs[i].prior+1 || !jobs[i].recorded {
			t.Fatalf("job %d runs with Attempts %d (recorded %v), want %d", i, jobs[i].d.Attempts, jobs[i].recorded, jobs[i].prior+1)
		}
	}
	if err := st.finish(); err != nil {
		t.Fatal(err)
	}
	if got := g.starts[jobs[3].sid]; got != 3 {
		t.Errorf("job 3's starts recorded: %d, want 3", got)
	}
	if want := jobs[0].sid + " " + jobs[7].sid; g.window != want {
		t.Errorf("window of first starts %q, want %q", g.window, want)
	}
}

// A read of new entries records the first step of what it reads in its own
// round trip, as an open window: the handler of the entry it brings starts
// with its start on record and no write of its own. A read that comes back
// full is followed by a read ahead, which closes that window to the batch
// in hand before it reads further; the batch it brings gets a first step of
// its own.
func TestLoop_AReadRecordsTheFirstStepOfWhatItReads(t *testing.T) {
	g, c := newFakeGroup(t, 5)
	c.Count = 1      // the read comes back full: a read ahead follows
	var first string // the window the first handler starts under
	var once sync.Once
	h := func(_ context.Context, d Delivery) error {
		once.Do(func() {
			g.mu.Lock()
			first = g.window
			g.mu.Unlock()
		})
		if d.Attempts != 1 {
			t.Errorf("%s starts with Attempts %d, want 1", d.StreamID, d.Attempts)
		}
		return nil
	}
	if _, err := c.Run(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	id0, id1 := g.entries[0].ID, g.entries[1].ID
	open, closed := "next 0-0 1", id0+" "+id0
	if want := []string{open, closed}; len(g.windows) < 2 || !slices.Equal(g.windows[:2], want) {
		t.Fatalf("windows recorded with reads %q, want them to begin %q", g.windows, want)
	}
	if first != open && first != closed { // the read ahead may close it first
		t.Fatalf("the first handler started under the window %q, want %q", first, open)
	}
	if len(g.steps) == 0 || !strings.HasPrefix(g.steps[0], id1+" ") {
		t.Fatalf("steps recorded on their own %q, want the first for the batch read ahead (from %s)", g.steps, id1)
	}
}

// No window goes with a read where a start counted for an entry that never
// ran would cost it its only attempt (MaxAttempts 1), nor where handlers
// record their own starts.
func TestLoop_NoWindowWithTheReadWhenOneStartIsAll(t *testing.T) {
	for name, set := range map[string]func(*Consumer){
		"max-attempts-1": func(c *Consumer) { c.MaxAttempts = 1 },
		"handler-begins": func(c *Consumer) { c.HandlerBegins = true },
	} {
		t.Run(name, func(t *testing.T) {
			g, c := newFakeGroup(t, 3)
			set(c)
			if _, err := c.Run(context.Background(), func(context.Context, Delivery) error { return nil }); err != nil {
				t.Fatal(err)
			}
			if len(g.windows) != 0 || len(g.pel) != 0 {
				t.Fatalf("windows recorded with reads %q (pending %v), want none", g.windows, g.pel)
			}
		})
	}
}

// A read that brings more entries than its open window names has their
// first step recorded as a range before the first handler starts: acks or
// dead letters of the first entries must not shift what the open window
// names onto entries not started.
func TestLoop_AReadBringingMoreThanItsWindowRecordsARange(t *testing.T) {
	g, c := newFakeGroup(t, 5)
	var first string
	h := func(_ context.Context, d Delivery) error {
		g.mu.Lock()
		defer g.mu.Unlock()
		if first == "" {
			first = g.window
		}
		return nil
	}
	if _, err := c.Run(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	if id0 := g.entries[0].ID; first != id0+" "+id0 {
		t.Fatalf("the first handler started under the window %q, want %q", first, id0+" "+id0)
	}
}

// Admit holds a worker before it takes an entry: what it holds has no
// start recorded. Here the first handler is admitted and the others wait
// until it returns; while it runs, one entry has a start on record.
func TestLoop_AdmitHoldsWorkersBeforeTheyTakeAnEntry(t *testing.T) {
	g, c := newFakeGroup(t, 4)
	c.Concurrency = 4
	var probe sync.Mutex
	probed := false
	firstDone := make(chan struct{})
	c.Admit = func(ctx context.Context) error {
		probe.Lock()
		first := !probed
		probed = true
		probe.Unlock()
		if !first {
			select {
			case <-firstDone:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	ids := make([]string, len(g.entries))
	for i, m := range g.entries {
		ids[i] = m.ID
	}
	var once sync.Once
	var onRecord int
	h := func(context.Context, Delivery) error {
		once.Do(func() {
			time.Sleep(20 * time.Millisecond) // the others would have taken theirs by now
			_, starts, _ := g.counts(context.Background(), ids, false)
			onRecord = len(starts)
			close(firstDone)
		})
		return nil
	}
	sum, err := c.Run(context.Background(), h)
	if err != nil || sum.Acked != 4 {
		t.Fatalf("%+v, %v", sum, err)
	}
	if onRecord != 1 {
		t.Fatalf("%d entries had a start on record while one was admitted, want 1", onRecord)
	}
}
