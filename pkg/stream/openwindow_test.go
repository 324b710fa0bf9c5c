package stream_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/stream"
)

// A worker waiting in its read has the first starts of what that read will
// bring on record already (an open window, written in the read's round
// trip). Killed by its handler the instant it starts, its start is counted
// for a peer that reclaims the entry: the claim resolves the dead worker's
// open window into the entries it delivered before taking them over.
func TestConsumer_APeerCountsTheStartOfAWorkerKilledAsItsReadArrived(t *testing.T) {
	if addr := os.Getenv("SILT_KILLED_WORKER_REDIS"); addr != "" {
		killedWorker(t, addr)
		return
	}
	rdb, l, worker := startKilledWorker(t)
	ctx := context.Background()
	windows := l.Keyspace().StartWindows(l.Name(), "g")
	waitFor(t, "the worker's read to record its open window", func() bool {
		return strings.HasPrefix(rdb.HGet(ctx, windows, "w1").Val(), "next ")
	})
	killed, err := l.Append(ctx, stream.Fields{"kill": "yes"})
	if err != nil {
		t.Fatal(err)
	}
	worker.waitKilled(t)
	peer, _ := stream.NewConsumer(l, "g", "w2")
	peer.Block, peer.MinIdle, peer.MaxEntries = time.Millisecond, time.Millisecond, 1
	var got stream.Delivery
	if _, err := peer.Run(ctx, func(_ context.Context, d stream.Delivery) error { got = d; return nil }); err != nil {
		t.Fatal(err)
	}
	if got.ID != killed || got.Attempts != 2 {
		t.Fatalf("start not counted: the peer gets %s with Attempts %d, want %s with 2", got.ID, got.Attempts, killed)
	}
	sid := killed.StreamID.String()
	if w := rdb.HGet(ctx, windows, "w1").Val(); w != sid+" "+sid {
		t.Fatalf("the dead worker's window is %q after the claim, want it resolved to %q", w, sid+" "+sid)
	}
}

// An open window counts only what its own read delivers: while a worker
// waits in its read, an entry another consumer read and never started is
// still a first start for the peer that reclaims it, and the waiting
// worker's window stays open until its run ends.
func TestConsumer_AnOpenWindowCountsOnlyWhatItsReadDelivers(t *testing.T) {
	f := newFixture(t, 1)
	ctx := context.Background()
	rdb := f.rdb
	if err := rdb.XGroupCreate(ctx, f.log.Key(), "billing", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "x", Streams: []string{f.log.Key(), ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	windows := f.log.Keyspace().StartWindows(f.log.Name(), "billing")
	waiting := f.consumer(t, "w1")
	waiting.Block = time.Minute
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := waiting.Run(wctx, func(context.Context, stream.Delivery) error { return nil })
		done <- err
	}()
	waitFor(t, "the waiting worker's open window", func() bool {
		return strings.HasPrefix(rdb.HGet(ctx, windows, "w1").Val(), "next ")
	})
	peer := f.consumer(t, "w2")
	peer.Block, peer.MinIdle, peer.MaxEntries = time.Millisecond, time.Millisecond, 1
	var got stream.Delivery
	if _, err := peer.Run(ctx, func(_ context.Context, d stream.Delivery) error { got = d; return nil }); err != nil {
		t.Fatal(err)
	}
	if got.Attempts != 1 {
		t.Fatalf("an entry never started comes to the peer with Attempts %d, want 1", got.Attempts)
	}
	if w := rdb.HGet(ctx, windows, "w1").Val(); !strings.HasPrefix(w, "next ") {
		t.Fatalf("the waiting worker's window is %q after the peer's claim, want it still open", w)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := rdb.HLen(ctx, windows).Val(); n != 0 {
		t.Fatalf("%d windows left after both runs ended: %v", n, rdb.HGetAll(ctx, windows).Val())
	}
}

// waitFor polls cond every few milliseconds for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
