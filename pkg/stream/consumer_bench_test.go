package stream_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/benchratio"
	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// BenchmarkConsumer_Ratio compares Consumer.Run with a no-op handler (the
// whole loop: group, PEL drain, reclaim beat, reads of 100, one pipelined
// XACK per batch) with a raw go-redis loop of XREADGROUP COUNT 100 and one
// XACK per batch, over the same stream contents. Goal: ratio >= 0.85.
//
//	go test -run '^$' -bench Consumer_Ratio -benchtime 9x ./pkg/stream
func BenchmarkConsumer_Ratio(b *testing.B) {
	ctx := context.Background()
	rdb, l, newGroup, silt := noopConsumerBench(b)
	raw := func(tb testing.TB) int {
		g := newGroup(tb)
		n := 0
		for {
			res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g, Consumer: "w1", Streams: []string{l.Key(), ">"}, Count: 100, Block: -1}).Result()
			if err == redis.Nil || len(res) == 0 || len(res[0].Messages) == 0 {
				break
			}
			if err != nil {
				tb.Fatal(err)
			}
			ids := make([]string, len(res[0].Messages))
			for i, m := range res[0].Messages {
				ids[i] = m.ID
			}
			if err := rdb.XAck(ctx, l.Key(), g, ids...).Err(); err != nil {
				tb.Fatal(err)
			}
			n += len(ids)
		}
		if n != consumerBenchEntries {
			tb.Fatalf("raw read %d", n)
		}
		return n
	}
	benchratio.Compare(b, silt, raw)
}

// BenchmarkConsumerStrong_Ratio (P11) compares the same worker loop with a
// stronger raw ceiling than P1's: reads of COUNT 1,000, the next batch read
// while this one is handled, each handled batch's XACK carried in one
// pipeline with that read (one round trip per batch; the last batch's acks
// go alone at the end). Goal >= 0.9. cpu-ratio is this process's CPU per
// entry, silt's ÷ the raw loop's (redis-server's is not in it);
// redis-cpu-ns/item is redis-server's CPU per entry and alloc-B/item the
// bytes this process allocated per entry, for each side.
//
//	go test -run '^$' -bench ConsumerStrong_Ratio -benchtime 9x ./pkg/stream
func BenchmarkConsumerStrong_Ratio(b *testing.B) {
	ctx := context.Background()
	rdb, l, newGroup, silt := noopConsumerBench(b)
	raw := func(tb testing.TB) int {
		g := newGroup(tb)
		type batch struct {
			msgs []redis.XMessage
			err  error
		}
		// read sends the previous batch's acks and the next read in one
		// pipeline, in a goroutine: the caller handles meanwhile.
		read := func(acks []string) <-chan batch {
			ch := make(chan batch, 1)
			go func() {
				pipe := rdb.Pipeline()
				if len(acks) > 0 {
					pipe.XAck(ctx, l.Key(), g, acks...)
				}
				rd := pipe.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g, Consumer: "w1", Streams: []string{l.Key(), ">"}, Count: 1000, Block: -1})
				_, err := pipe.Exec(ctx)
				if err == redis.Nil {
					err = nil
				}
				var msgs []redis.XMessage
				if res, _ := rd.Result(); len(res) > 0 {
					msgs = res[0].Messages
				}
				ch <- batch{msgs, err}
			}()
			return ch
		}
		n := 0
		next := read(nil)
		var handled []string // acked with the next read: only what was handled
		for {
			b := <-next
			if b.err != nil {
				tb.Fatal(b.err)
			}
			if len(b.msgs) == 0 {
				break
			}
			next = read(handled) // issued before this batch is handled
			handled = make([]string, 0, len(b.msgs))
			for _, m := range b.msgs {
				n++ // the no-op handler
				handled = append(handled, m.ID)
			}
		}
		if len(handled) > 0 {
			if err := rdb.XAck(ctx, l.Key(), g, handled...).Err(); err != nil {
				tb.Fatal(err)
			}
		}
		benchratio.Untimed(func() {
			if left := rdb.XPending(ctx, l.Key(), g).Val().Count; left != 0 {
				tb.Fatalf("raw loop left %d pending", left)
			}
		})
		if n != consumerBenchEntries {
			tb.Fatalf("raw read %d", n)
		}
		return n
	}
	var siltCPU, rawCPU, siltServer, rawServer, siltBytes, rawBytes []float64
	server := benchratio.RedisCPU(rdb)
	measured := func(round benchratio.Round, cpu, srv, bytes *[]float64) benchratio.Round {
		return benchratio.WithCPU(benchratio.Per(benchratio.Per(round, server, srv), benchratio.AllocBytes, bytes), cpu)
	}
	benchratio.Compare(b, measured(silt, &siltCPU, &siltServer, &siltBytes), measured(raw, &rawCPU, &rawServer, &rawBytes))
	benchratio.ReportCPURatio(b, "cpu-ratio", siltCPU, rawCPU)
	benchratio.ReportMedians(b, "redis-cpu-ns/item", siltServer, rawServer)
	benchratio.ReportMedians(b, "alloc-B/item", siltBytes, rawBytes)
}

// BenchmarkConsumer_Concurrency is the worker's scaling curve: 2,000 entries
// through Consumer.Run with a handler that takes 1ms, at concurrency 1, 4
// and 16. It reports entries/s and the ratio to the ideal (concurrency ×
// 1,000 entries/s, the handler's own bound).
//
//	go test -run '^$' -bench Consumer_Concurrency -benchtime 3x ./pkg/stream
func BenchmarkConsumer_Concurrency(b *testing.B) {
	const entries = 2000
	rdb := testserver.Redis(b).Client(b)
	ctx := context.Background()
	l := benchStream(b, rdb, "conc", entries, numbered)
	round := 0
	for _, conc := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("c%d", conc), func(b *testing.B) {
			var rates []float64
			for range b.N {
				round++
				g := fmt.Sprintf("c%d", round)
				rdb.XGroupCreate(ctx, l.Key(), g, "0")
				c, _ := stream.NewConsumer(l, g, "w1")
				c.Block, c.Concurrency = time.Millisecond, conc
				start := time.Now()
				sum, err := c.Run(ctx, func(context.Context, stream.Delivery) error { time.Sleep(time.Millisecond); return nil })
				if err != nil || sum.Acked != entries {
					b.Fatalf("run: %+v %v", sum, err)
				}
				rates = append(rates, entries/time.Since(start).Seconds())
			}
			slices.Sort(rates)
			med := rates[len(rates)/2]
			b.ReportMetric(med, "entries/s")
			b.ReportMetric(med/(float64(conc)*1000), "ratio-to-ideal")
		})
	}
}

// benchStream appends n entries made by fields to stream name of queue
// "bench" and returns its log.
// consumerBenchEntries is the stream of P1 and P11.
const consumerBenchEntries = 20000

// noopConsumerBench is the setup P1 and P11 share: a stream of 20,000
// entries, a new group per round, and the worker round (Consumer.Run with
// a no-op handler over the whole stream).
func noopConsumerBench(b *testing.B) (*redis.Client, *stream.Log, func(testing.TB) string, benchratio.Round) {
	rdb := testserver.Redis(b).Client(b)
	ctx := context.Background()
	l := benchStream(b, rdb, "events", consumerBenchEntries, func(i int) stream.Fields {
		return stream.Fields{"user": fmt.Sprintf("u%06d", i), "action": "login", "amount": fmt.Sprint(i % 1000)}
	})
	round := 0
	newGroup := func(tb testing.TB) string {
		round++
		g := fmt.Sprintf("g%d", round)
		if err := rdb.XGroupCreate(ctx, l.Key(), g, "0").Err(); err != nil {
			tb.Fatal(err)
		}
		return g
	}
	silt := func(tb testing.TB) int {
		c, _ := stream.NewConsumer(l, newGroup(tb), "w1")
		c.Block = 1 // one millisecond: the end of the stream is reached once
		sum, err := c.Run(ctx, func(context.Context, stream.Delivery) error { return nil })
		if err != nil || sum.Acked != consumerBenchEntries {
			tb.Fatalf("run: %+v %v", sum, err)
		}
		return consumerBenchEntries
	}
	return rdb, l, newGroup, silt
}

func benchStream(b *testing.B, rdb *redis.Client, name string, n int, fields func(int) stream.Fields) *stream.Log {
	b.Helper()
	ks, _ := stream.NewKeyspace("", "bench")
	l, err := stream.NewLog(rdb, ks, name, brand.EVT)
	if err != nil {
		b.Fatal(err)
	}
	batch := make([]stream.Fields, n)
	for i := range batch {
		batch[i] = fields(i)
	}
	if _, err := l.AppendBatch(context.Background(), batch); err != nil {
		b.Fatal(err)
	}
	return l
}

// numbered is the payload {"n": i}.
func numbered(i int) stream.Fields { return stream.Fields{"n": fmt.Sprint(i)} }
