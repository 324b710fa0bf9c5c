package peers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/benchratio"
	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// BenchmarkWorkerVsWatermill_Ratio (P1b) compares silt's Consumer.Run with a
// no-op handler against watermill-redisstream's subscriber with its default
// configuration (each message acked as it is handled), over the same 20,000
// entries (P1's number; each holds both silt's id and watermill's uuid and
// payload fields), each side in a fresh consumer group, the worker with its
// defaults (adaptive reads). Goal: ratio >= 25.
//
// The ceiling is P1's raw loop (XREADGROUP COUNT 100, one XACK per batch)
// timed beside each of watermill's rounds and out of its time, as P13's
// pipe floor is: watermill's rate moves by a quarter between rounds on a
// shared machine, so the ceiling is compared with the same rounds silt is.
// reachable is the raw loop ÷ watermill, the most P1b can be on the machine
// of the run; of-floor is silt ÷ the raw loop, ceiling-items/s its rate;
// raw-items/s is watermill's rate; server-cpu is how busy
// redis-server is while each side runs.
//
//	cd bench && go test -run '^$' -bench WorkerVsWatermill -benchtime 5x ./peers
func BenchmarkWorkerVsWatermill_Ratio(b *testing.B) {
	const entries = 20000
	srv := testserver.Redis(b)
	rdb := srv.Client(b)
	ctx := context.Background()
	ks, _ := stream.NewKeyspace("", "bench")
	l, _ := stream.NewLog(rdb, ks, "events", brand.EVT)
	batch := make([]stream.Fields, entries)
	for i := range batch {
		batch[i] = stream.Fields{"_watermill_message_uuid": watermill.NewUUID(), "payload": fmt.Sprintf(`{"user":"u%06d","n":%d}`, i, i)}
	}
	if _, err := l.AppendBatch(ctx, batch); err != nil {
		b.Fatal(err)
	}
	round := 0
	group := func() string { round++; return fmt.Sprint("g", round) }
	// How busy redis-server is while each side runs: its CPU time (INFO cpu)
	// over the side's wall time. Near 1, the server, not the client, is what
	// bounds a side on this machine.
	busy := map[string]*[2]time.Duration{"silt": {}, "watermill": {}, "raw": {}}
	timed := func(side string, f func(testing.TB) int) func(testing.TB) int {
		return func(tb testing.TB) int {
			c0, t0 := serverCPU(tb, rdb), time.Now()
			n := f(tb)
			busy[side][0] += time.Since(t0)
			busy[side][1] += serverCPU(tb, rdb) - c0
			return n
		}
	}
	silt := func(tb testing.TB) int {
		g := group()
		rdb.XGroupCreate(ctx, l.Key(), g, "0")
		c, _ := stream.NewConsumer(l, g, "w1")
		c.Block = time.Millisecond
		sum, err := c.Run(ctx, func(context.Context, stream.Delivery) error { return nil })
		if err != nil || sum.Acked != entries {
			tb.Fatalf("silt: %+v %v", sum, err)
		}
		return entries
	}
	raw := func(tb testing.TB) int {
		g := group()
		rdb.XGroupCreate(ctx, l.Key(), g, "0")
		n := 0
		for {
			res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g, Consumer: "w1", Streams: []string{l.Key(), ">"}, Count: 100, Block: -1}).Result()
			if err == redis.Nil || len(res) == 0 || len(res[0].Messages) == 0 {
				break
			}
			ids := make([]string, len(res[0].Messages))
			for i, m := range res[0].Messages {
				ids[i] = m.ID
			}
			rdb.XAck(ctx, l.Key(), g, ids...)
			n += len(ids)
		}
		if n != entries {
			tb.Fatalf("raw read %d", n)
		}
		return n
	}
	var siltSecs, peerSecs, rawSecs []float64 // per round
	seconds := func(into *[]float64, f func(testing.TB) int) func(testing.TB) int {
		return func(tb testing.TB) int {
			start := time.Now()
			n := f(tb)
			*into = append(*into, time.Since(start).Seconds())
			return n
		}
	}
	peer := func(tb testing.TB) int {
		g := group()
		rdb.XGroupCreate(ctx, l.Key(), g, "0")
		// The subscriber closes its client on Close: it gets one of its own.
		own := redis.NewClient(&redis.Options{Addr: srv.Addr})
		sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{Client: own, ConsumerGroup: g, Consumer: "w1"},
			watermill.NopLogger{})
		if err != nil {
			tb.Fatal(err)
		}
		defer sub.Close()
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		msgs, err := sub.Subscribe(sctx, l.Key())
		if err != nil {
			tb.Fatal(err)
		}
		for n := 0; n < entries; n++ {
			select {
			case m := <-msgs:
				m.Ack()
			case <-time.After(30 * time.Second):
				tb.Fatalf("watermill: %d of %d after 30s", n, entries)
			}
		}
		return entries
	}
	b.Run("silt", func(b *testing.B) {
		benchratio.Compare(b,
			timed("silt", seconds(&siltSecs, silt)),
			func(tb testing.TB) int {
				n := timed("watermill", seconds(&peerSecs, peer))(tb)
				// The ceiling, beside this round and out of its time.
				start := time.Now()
				timed("raw", seconds(&rawSecs, raw))(tb)
				benchratio.Exclude(time.Since(start))
				return n
			})
		b.ReportMetric(float64(entries)/benchratio.Median(rawSecs), "ceiling-items/s")
		b.ReportMetric(medianRatio(peerSecs, rawSecs), "reachable")
		b.ReportMetric(medianRatio(rawSecs, siltSecs), "of-floor")
		for _, side := range []string{"silt", "watermill", "raw"} {
			if w := busy[side][0]; w > 0 {
				b.ReportMetric(float64(busy[side][1])/float64(w), side+"-server-cpu")
			}
			*busy[side] = [2]time.Duration{}
		}
		siltSecs, peerSecs, rawSecs = nil, nil, nil
	})
}

// serverCPU returns redis-server's CPU time so far (user and system, INFO cpu).
func serverCPU(tb testing.TB, rdb *redis.Client) time.Duration {
	return time.Duration(benchratio.RedisCPU(rdb)(tb))
}
