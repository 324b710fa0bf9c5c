package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/silt-dev/silt/internal/telemetry"
	"github.com/silt-dev/silt/internal/testing/benchratio"
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
	ctx := context.Background()
	_, l, _, _, newGroup := benchStream(b, entries, nil)
	run := func(tb testing.TB, metrics bool) int {
		g := newGroup(tb)
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
