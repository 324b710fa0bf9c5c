package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/benchratio"
	"github.com/silt-dev/silt/internal/telemetry"
	"github.com/silt-dev/silt/internal/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// BenchmarkMetrics_Ratio (P1m): P1's worker loop (no-op handler, 20,000
// entries) with metrics and traces on (the OpenTelemetry SDK, an OTLP/HTTP
// exporter flushing to a local receiver at the end of each run, a span and
// a histogram sample per handler call, counters per batch) ÷ the same loop
// with metrics off. Goal >= 0.95.
//
//	go test -run '^$' -bench Metrics_Ratio -benchtime 9x ./cmd/worker
func BenchmarkMetrics_Ratio(b *testing.B) {
	const entries = 20000
	var pushes atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		pushes.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	defer receiver.Close()
	rdb := testserver.Redis(b).Client(b)
	ctx := context.Background()
	ks, _ := stream.NewKeyspace("", "bench")
	l, _ := stream.NewLog(rdb, ks, "events", brand.EVT)
	batch := make([]stream.Fields, entries)
	for i := range batch {
		batch[i] = stream.Fields{"user": fmt.Sprintf("u%06d", i), "action": "login", "amount": fmt.Sprint(i % 1000)}
	}
	if _, err := l.AppendBatch(ctx, batch); err != nil {
		b.Fatal(err)
	}
	round := 0
	run := func(tb testing.TB, metrics bool) int {
		round++
		g := fmt.Sprintf("g%d", round)
		if err := rdb.XGroupCreate(ctx, l.Key(), g, "0").Err(); err != nil && err != redis.Nil {
			tb.Fatal(err)
		}
		c, _ := stream.NewConsumer(l, g, "w1")
		c.Block = 1
		h := stream.Handler(func(context.Context, stream.Delivery) error { return nil })
		var m *workerMetrics
		var tel *telemetry.Telemetry
		if metrics {
			var err error
			if tel, err = telemetry.Setup(ctx, "silt-worker"); err != nil || !tel.Enabled {
				tb.Fatalf("telemetry: %v", err)
			}
			m = newWorkerMetrics(tel, "bench", "events", g)
			c.Progress, h = m.progress, m.wrap(h)
		}
		sum, err := c.Run(ctx, h)
		if err != nil || sum.Acked != entries {
			tb.Fatalf("run: %+v %v", sum, err)
		}
		if metrics {
			m.end(sum)
			if err := tel.Shutdown(ctx); err != nil {
				tb.Fatal(err)
			}
		}
		return entries
	}
	b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.URL)
	benchratio.Compare(b, func(tb testing.TB) int { return run(tb, true) }, func(tb testing.TB) int { return run(tb, false) })
	if pushes.Load() == 0 {
		b.Fatal("no metrics reached the receiver: the benchmark measured nothing")
	}
}
