package stream_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/stream"
)

// A worker frozen past --min-idle (its renewals stopped: here MinIdle is
// below the renewal floor) loses its entries to a peer, which handles and
// acks them. When it resumes, it acks none of them: each is counted as
// lost_lease, not as acked, so the two summaries add up to one ack each.
func TestConsumer_AcksAreFencedByOwnershipAfterMinIdle(t *testing.T) {
	f := newFixture(t, 6)
	ctx := context.Background()
	frozen := f.consumer(t, "w1")
	frozen.MinIdle, frozen.Count = 50*time.Millisecond, 6
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(6)
	frozen.Concurrency = 6
	var sum stream.Summary
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		sum, err = frozen.Run(ctx, func(context.Context, stream.Delivery) error {
			started.Done()
			<-release
			return nil
		})
	}()
	started.Wait()
	time.Sleep(100 * time.Millisecond) // past MinIdle: the peer may take them
	peer := f.consumer(t, "w2")
	peer.MinIdle = 50 * time.Millisecond
	peerSum, perr := peer.Run(ctx, func(context.Context, stream.Delivery) error { return nil })
	if perr != nil || peerSum.Claimed != 6 || peerSum.Acked != 6 {
		t.Fatalf("peer: %+v, %v; want the 6 reclaimed and acked", peerSum, perr)
	}
	close(release)
	<-done
	if err != nil || sum.Acked != 0 || sum.LostLease != 6 {
		t.Fatalf("resumed worker: %+v, %v; want 0 acked, 6 lost_lease", sum, err)
	}
}

// A quick batch is acked once, at its end; a success in a batch that runs
// on is acked within about ackEvery (20 ms) of its handler's end, at any
// concurrency, however soon after the batch began it finished: a kill
// while the slow handlers run repeats none of the finished ones.
func TestConsumer_EverySuccessIsAckedPromptly(t *testing.T) {
	for _, concurrency := range []int{1, 8} {
		f := newFixture(t, 4)
		ctx := context.Background()
		c := f.consumer(t, "w1")
		c.Concurrency, c.Count = concurrency, 4
		slow := make(chan struct{})
		var quickDone sync.WaitGroup
		quickDone.Add(3)
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.Run(ctx, func(_ context.Context, d stream.Delivery) error {
				if d.ID == f.ids[3] {
					<-slow // the batch's last entry runs on
					return nil
				}
				quickDone.Done()
				return nil
			})
		}()
		quickDone.Wait()
		finished := time.Now()
		for n := f.pending(t); n > 1; n = f.pending(t) {
			if waited := time.Since(finished); waited > 50*time.Millisecond {
				close(slow)
				<-done
				t.Fatalf("concurrency %d: %d entries still pending %s after their handlers ended, want 1 (the slow one)", concurrency, n, waited)
			}
			time.Sleep(2 * time.Millisecond)
		}
		close(slow)
		<-done
	}
}
