package stream_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/benchratio"
	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// BenchmarkLatency_Ratio (P9): the time from an append to the start of its
// handler in a long-running worker (BLOCK reads), against a raw go-redis
// XREADGROUP BLOCK loop on the same server, rounds alternating. steady:
// 1,000 entries/s, one at a time; burst: 200 entries at once every 200ms.
// Reported: p50, p99 and p99.9 of each, and ratio = worker p99 ÷ raw p99
// (median over rounds; goal <= 1.2, and the worker's p99 <= 2 ms), and
// the bytes this process allocated per entry while each side ran (the
// producer's appends in both).
//
//	go test -run '^$' -bench Latency_Ratio -benchtime 5x ./pkg/stream
func BenchmarkLatency_Ratio(b *testing.B) {
	for _, mode := range []string{"steady", "burst"} {
		b.Run(mode, func(b *testing.B) { latencyRatio(b, mode) })
	}
}

func latencyRatio(b *testing.B, mode string) {
	const n = 2000
	rdb := testserver.Redis(b).Client(b)
	ctx := context.Background()
	ks, _ := stream.NewKeyspace("", "lat")
	l, _ := stream.NewLog(rdb, ks, "events", brand.EVT)
	if _, err := l.Append(ctx, stream.Fields{"warm": "1"}); err != nil {
		b.Fatal(err)
	}
	// produce appends n entries stamped with their send time.
	produce := func() {
		if mode == "steady" {
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for range n {
				<-tick.C
				l.Append(ctx, stream.Fields{"t": strconv.FormatInt(time.Now().UnixNano(), 10)})
			}
			return
		}
		for sent := 0; sent < n; sent += 200 {
			time.Sleep(200 * time.Millisecond)
			batch := make([]stream.Fields, 200)
			for i := range batch {
				batch[i] = stream.Fields{"t": strconv.FormatInt(time.Now().UnixNano(), 10)}
			}
			l.AppendBatch(ctx, batch)
		}
	}
	round := 0
	group := func() string {
		round++
		g := fmt.Sprintf("g%d", round)
		if err := rdb.XGroupCreate(ctx, l.Key(), g, "$").Err(); err != nil {
			b.Fatal(err)
		}
		return g
	}
	since := func(t string) time.Duration {
		ns, _ := strconv.ParseInt(t, 10, 64)
		return time.Duration(time.Now().UnixNano() - ns)
	}
	worker := func() []time.Duration {
		c, _ := stream.NewConsumer(l, group(), "w1")
		c.Block, c.MaxEntries = 10*time.Second, n
		var mu sync.Mutex
		lat := make([]time.Duration, 0, n)
		done := make(chan error, 1)
		go func() {
			_, err := c.Run(ctx, func(_ context.Context, d stream.Delivery) error {
				d0 := since(d.Fields["t"])
				mu.Lock()
				lat = append(lat, d0)
				mu.Unlock()
				return nil
			})
			done <- err
		}()
		time.Sleep(100 * time.Millisecond) // the worker is blocked in its read
		produce()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		return lat
	}
	raw := func() []time.Duration {
		g := group()
		lat := make([]time.Duration, 0, n)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for len(lat) < n {
				res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g, Consumer: "w1", Streams: []string{l.Key(), ">"}, Count: 100, Block: 10 * time.Second}).Result()
				if err != nil {
					b.Error(err)
					return
				}
				ids := make([]string, 0, len(res[0].Messages))
				for _, m := range res[0].Messages {
					lat = append(lat, since(m.Values["t"].(string)))
					ids = append(ids, m.ID)
				}
				rdb.XAck(ctx, l.Key(), g, ids...)
			}
		}()
		time.Sleep(100 * time.Millisecond)
		produce()
		<-done
		return lat
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		slices.Sort(d)
		return d[min(len(d)-1, int(float64(len(d))*p))]
	}
	// allocs runs a side and adds the bytes this process allocated per
	// entry meanwhile to into: the garbage a side makes sets how often the
	// collector runs, and its pauses and marking land in the tail.
	allocs := func(side func() []time.Duration, into *[]float64) []time.Duration {
		before := benchratio.AllocBytes(b)
		d := side()
		*into = append(*into, (benchratio.AllocBytes(b)-before)/n)
		return d
	}
	var ratios, wAlloc, rAlloc []float64
	var ws, rs []time.Duration
	for i := 0; i < b.N; i++ {
		var w, r []time.Duration
		if i%2 == 0 {
			w, r = allocs(worker, &wAlloc), allocs(raw, &rAlloc)
		} else {
			r, w = allocs(raw, &rAlloc), allocs(worker, &wAlloc)
		}
		ratios = append(ratios, float64(pct(w, 0.99))/float64(pct(r, 0.99)))
		ws, rs = append(ws, w...), append(rs, r...)
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "ratio")
	b.ReportMetric(ratios[0], "ratio-min")
	b.ReportMetric(ratios[len(ratios)-1], "ratio-max")
	b.ReportMetric(benchratio.Median(wAlloc), "worker-alloc-B/entry")
	b.ReportMetric(benchratio.Median(rAlloc), "raw-alloc-B/entry")
	for name, d := range map[string][]time.Duration{"worker": ws, "raw": rs} {
		b.ReportMetric(float64(pct(d, 0.5).Microseconds()), name+"-p50-µs")
		b.ReportMetric(float64(pct(d, 0.99).Microseconds()), name+"-p99-µs")
		b.ReportMetric(float64(pct(d, 0.999).Microseconds()), name+"-p99.9-µs")
	}
}
