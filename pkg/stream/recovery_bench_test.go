package stream_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/stream"
)

// BenchmarkDeadPeerRecovery_Ratio (P8) measures how long a running worker
// takes to handle everything a peer left pending when it died, divided by
// MinIdle (the earliest the server lets anyone reclaim it). Each round: a
// peer reads 1,000 entries and dies; a worker with MinIdle 500ms is running
// at some phase of its reclaim beat (it starts 0-500ms later); the clock
// stops when the worker has handled all 1,000. Goal: median ratio <= 1.2.
//
//	go test -run '^$' -bench DeadPeerRecovery_Ratio -benchtime 9x ./pkg/stream
func BenchmarkDeadPeerRecovery_Ratio(b *testing.B) {
	const entries, minIdle = 1000, 500 * time.Millisecond
	rdb := testserver.Redis(b).Client(b)
	ctx := context.Background()
	var ratios []float64
	for i := range b.N {
		l := benchStream(b, rdb, fmt.Sprint("p8-", i), entries, numbered)
		rdb.XGroupCreate(ctx, l.Key(), "g", "0")
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{l.Key(), ">"}, Count: entries}).Result()
		if err != nil || len(res[0].Messages) != entries {
			b.Fatalf("the peer read %v: %v", res, err)
		}
		died := time.Now()
		// The live worker's beat has some phase against the death: it starts
		// (and beats first) at a different point of MinIdle each round.
		time.Sleep(time.Duration(i*137%int(minIdle/time.Millisecond)) * time.Millisecond)
		var handled atomic.Int64
		done := make(chan struct{})
		c, _ := stream.NewConsumer(l, "g", "live")
		c.MinIdle, c.Block, c.MaxDuration = minIdle, time.Hour, time.Hour
		runCtx, cancel := context.WithCancel(ctx)
		go func() {
			c.Run(runCtx, func(context.Context, stream.Delivery) error {
				if handled.Add(1) == entries {
					close(done)
				}
				return nil
			})
		}()
		select {
		case <-done:
		case <-time.After(20 * minIdle):
			b.Fatalf("round %d: %d of %d recovered after %v", i, handled.Load(), entries, 20*minIdle)
		}
		ratios = append(ratios, float64(time.Since(died))/float64(minIdle))
		cancel()
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "ratio")
	b.ReportMetric(ratios[0], "ratio-min")
	b.ReportMetric(ratios[len(ratios)-1], "ratio-max")
	b.Logf("rounds=%d recovery/min-idle=%.3f", b.N, ratios)
}
