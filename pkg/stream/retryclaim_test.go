package stream_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/stream"
)

// deadFixture is a fixture whose n entries all went to the dead-letter
// stream of group billing, and the records there.
func deadFixture(t *testing.T, n int) (*fixture, []stream.DeadLetter) {
	t.Helper()
	f := newFixture(t, n)
	run(t, f.consumer(t, "w0"), func(_ context.Context, d stream.Delivery) error {
		return stream.Permanent(fmt.Errorf("bad %s", d.Fields["n"]))
	})
	var dls []stream.DeadLetter
	for dl, err := range f.consumer(t, "w0").DeadLetters(context.Background()) {
		if err != nil {
			t.Fatal(err)
		}
		dls = append(dls, dl)
	}
	if len(dls) != n {
		t.Fatalf("%d dead letters, want %d", len(dls), n)
	}
	return f, dls
}

// handled counts handler calls by entry id.
type handled struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *handled) add(d stream.Delivery) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	h.n[d.ID.String()]++
}

func (h *handled) count(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[id]
}

// Two retries of the same dead letters at once (a scheduled `worker dead
// retry --all` and an operator's) hand each record to one handler: a
// record the other holds is left to it (and not dropped under it), and
// one it finished is not run again.
func TestRetryDead_TwoRetriesAtOnceRunEachRecordOnce(t *testing.T) {
	f, dls := deadFixture(t, 3)
	ctx := context.Background()
	var calls handled
	first := dls[0].EntryID
	inFirst, release := make(chan struct{}), make(chan struct{})
	a, b := f.consumer(t, "wa"), f.consumer(t, "wb")
	type result struct {
		res stream.RetryResult
		err error
	}
	doneA := make(chan result, 1)
	go func() {
		res, err := a.RetryDead(ctx, func(_ context.Context, d stream.Delivery) error {
			calls.add(d)
			if d.ID.String() == first {
				close(inFirst)
				<-release
			}
			return nil
		}, "")
		doneA <- result{res, err}
	}()
	<-inFirst
	// Asked for by id while wa runs it: refused, naming the holder.
	_, err := b.RetryDead(ctx, func(_ context.Context, d stream.Delivery) error { calls.add(d); return nil }, first)
	if !errors.Is(err, stream.ErrRetryHeld) || !strings.Contains(err.Error(), `"wa"`) {
		t.Fatalf("retry of a record another retry holds: %v, want ErrRetryHeld naming wa", err)
	}
	// Nor is it dropped under the handler.
	if _, err := b.DropDead(ctx, first); !errors.Is(err, stream.ErrRetryHeld) {
		t.Fatalf("drop of a record a retry holds: %v, want ErrRetryHeld", err)
	}
	resB, err := b.RetryDead(ctx, func(_ context.Context, d stream.Delivery) error { calls.add(d); return nil }, "")
	if err != nil || resB.Elsewhere != 1 || resB.Succeeded != 2 {
		t.Fatalf("second retry of all: %+v %v, want 2 succeeded and 1 left to the first", resB, err)
	}
	close(release)
	ra := <-doneA
	if ra.err != nil || ra.res.Succeeded+resB.Succeeded != 3 {
		t.Fatalf("first retry: %+v %v", ra.res, ra.err)
	}
	for _, dl := range dls {
		if n := calls.count(dl.EntryID); n != 1 {
			t.Errorf("%s handed to a handler %d times, want once", dl.EntryID, n)
		}
	}
	if n := f.rdb.XLen(ctx, "emq:{cm}:dead:events:billing").Val(); n != 0 {
		t.Fatalf("%d dead letters left", n)
	}
	if claims := f.rdb.Keys(ctx, "emq:{cm}:dead-retrying:*").Val(); len(claims) != 0 {
		t.Fatalf("claims left after the retries: %v", claims)
	}
}

// A handler slower than LeaseTTL keeps its claim: it is renewed while the
// handler runs.
func TestRetryDead_ClaimRenewedWhileTheHandlerRuns(t *testing.T) {
	f, dls := deadFixture(t, 1)
	ctx := context.Background()
	a, b := f.consumer(t, "wa"), f.consumer(t, "wb")
	a.LeaseTTL, b.LeaseTTL = 80*time.Millisecond, 80*time.Millisecond
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := a.RetryDead(ctx, func(context.Context, stream.Delivery) error {
			close(started)
			time.Sleep(500 * time.Millisecond)
			return nil
		}, dls[0].EntryID)
		done <- err
	}()
	<-started
	time.Sleep(300 * time.Millisecond) // almost four LeaseTTLs into the handler
	ran := false
	_, err := b.RetryDead(ctx, func(context.Context, stream.Delivery) error { ran = true; return nil }, dls[0].EntryID)
	if ran || !errors.Is(err, stream.ErrRetryHeld) {
		t.Fatalf("retry while a slow handler runs: ran %v, %v; want ErrRetryHeld", ran, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A failed retry gives its claim up at once; a claim its holder left
// behind (killed with its handler) lapses after LeaseTTL, and the record
// is retried then.
func TestRetryDead_FailedAndAbandonedClaims(t *testing.T) {
	f, dls := deadFixture(t, 2)
	ctx := context.Background()
	c := f.consumer(t, "wa")
	c.LeaseTTL = 150 * time.Millisecond
	res, err := c.RetryDead(ctx, func(context.Context, stream.Delivery) error { return errors.New("still bad") }, dls[0].EntryID)
	if err != nil || res.Failed != 1 {
		t.Fatalf("failing retry: %+v %v", res, err)
	}
	claim := f.log.Keyspace().DeadRetrying(f.log.Name(), "billing", dls[0].ID.String())
	if n := f.rdb.Exists(ctx, claim).Val(); n != 0 {
		t.Fatalf("a failed retry left its claim %s", claim)
	}
	var calls handled
	ok := func(_ context.Context, d stream.Delivery) error { calls.add(d); return nil }
	if res, err := c.RetryDead(ctx, ok, dls[0].EntryID); err != nil || res.Succeeded != 1 {
		t.Fatalf("retry after a failed one: %+v %v", res, err)
	}

	// What a retry killed with its handler leaves.
	claim = f.log.Keyspace().DeadRetrying(f.log.Name(), "billing", dls[1].ID.String())
	f.rdb.Set(ctx, claim, "killed 0123456789ab", 150*time.Millisecond)
	if _, err := c.RetryDead(ctx, ok, dls[1].EntryID); !errors.Is(err, stream.ErrRetryHeld) || !strings.Contains(err.Error(), `"killed"`) {
		t.Fatalf("retry under a live claim: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	if res, err := c.RetryDead(ctx, ok, dls[1].EntryID); err != nil || res.Succeeded != 1 {
		t.Fatalf("retry once the claim lapsed: %+v %v", res, err)
	}
	if calls.count(dls[0].EntryID) != 1 || calls.count(dls[1].EntryID) != 1 {
		t.Fatalf("handled %v, want each once", calls.n)
	}
}

// A record still in the stream although it was retried with success (a
// retry stopped between the two, before they were one script) is not
// handed to a handler again: it is removed.
func TestRetryDead_RecordRetriedBeforeIsRemovedNotRun(t *testing.T) {
	f, dls := deadFixture(t, 2)
	ctx := context.Background()
	c := f.consumer(t, "wa")
	f.rdb.HSet(ctx, f.log.Keyspace().DeadRetried(f.log.Name(), "billing"), dls[0].ID.String(), "2026-01-02T03:04:05Z")
	var calls handled
	res, err := c.RetryDead(ctx, func(_ context.Context, d stream.Delivery) error { calls.add(d); return nil }, "")
	if err != nil || res.Succeeded != 1 || res.Elsewhere != 1 || calls.count(dls[0].EntryID) != 0 {
		t.Fatalf("retry: %+v %v, handled %v; want the retried record left out", res, err, calls.n)
	}
	if n := f.rdb.XLen(ctx, "emq:{cm}:dead:events:billing").Val(); n != 0 {
		t.Fatalf("%d dead letters left, want the one retried before removed too", n)
	}
}

// RetryDeadLetter tells its handler where the payload came from: a dead
// letter still in the dead-letter stream is not Recovered, one read back
// from their archive (gone from the stream) is; and a record retried with
// success before but still in the stream is removed, not run again.
func TestRetryDeadLetter_RecoveredOnlyWhenGoneFromTheStream(t *testing.T) {
	f, dls := deadFixture(t, 3)
	ctx := context.Background()
	c := f.consumer(t, "wr")
	var recovered []bool
	h := func(_ context.Context, d stream.Delivery) error {
		recovered = append(recovered, d.Recovered)
		return nil
	}
	if err := c.RetryDeadLetter(ctx, h, dls[0]); err != nil {
		t.Fatal(err)
	}
	deadKey := f.log.Keyspace().DeadLetter(f.log.Name(), "billing")
	if err := f.rdb.XDel(ctx, deadKey, dls[1].ID.StreamID.String()).Err(); err != nil { // as the archiver's trim
		t.Fatal(err)
	}
	if err := c.RetryDeadLetter(ctx, h, dls[1]); err != nil {
		t.Fatal(err)
	}
	if len(recovered) != 2 || recovered[0] || !recovered[1] {
		t.Fatalf("Delivery.Recovered of a dead letter in the stream, then of one gone from it: %v, want [false true]", recovered)
	}

	retried := f.log.Keyspace().DeadRetried(f.log.Name(), "billing")
	if err := f.rdb.HSet(ctx, retried, dls[2].ID.String(), time.Now().UnixMilli()).Err(); err != nil { // retried, its XDEL lost
		t.Fatal(err)
	}
	if err := c.RetryDeadLetter(ctx, h, dls[2]); !errors.Is(err, stream.ErrRetriedBefore) {
		t.Fatalf("retry of a record retried before: %v, want ErrRetriedBefore", err)
	}
	if n := f.rdb.XLen(ctx, deadKey).Val(); n != 0 || len(recovered) != 2 {
		t.Fatalf("after the retry of a record retried before: %d records left, %d handler calls; want 0 and 2", n, len(recovered))
	}
}
