package e2e

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/redis/go-redis/v9"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// promValue sums the series of q; it fails the test when there are none.
func promValue(t *testing.T, p testserver.PrometheusServer, q string) float64 {
	t.Helper()
	var samples []testserver.Sample
	for range 50 { // a pushed sample is queryable within moments
		if samples = p.Query(t, q); len(samples) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(samples) == 0 {
		t.Fatalf("prometheus has no series for %s", q)
	}
	sum := 0.0
	for _, s := range samples {
		sum += s.Value
	}
	return sum
}

// TestObservability_MetricsReachPrometheus: a worker run (with handlers that
// succeed, fail and dead-letter) and an archiver run push their metrics over
// OTLP/HTTP to a real Prometheus at exit; the counters equal the JSON
// summaries, the handler histogram counts every call, the object-store
// requests are there by verb and outcome; and the status commands' metrics
// pass promtool.
func TestObservability_MetricsReachPrometheus(t *testing.T) {
	srv := testserver.Redis(t)
	prom := testserver.Prometheus(t)
	dir := t.TempDir()
	queue := fmt.Sprintf("obs%d", testserver.Unique()) // series of other runs of this test stay apart
	spans := startTraceReceiver(t)
	// Metrics to Prometheus, traces to a receiver of our own: Prometheus
	// takes no traces.
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=" + queue, "SILT_STREAM=orders", "SILT_GROUP=billing",
		"SILT_DATA_DIR=" + filepath.Join(dir, "data"), "SILT_ARCHIVE_REMOTE=file://" + filepath.Join(dir, "remote"),
		"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=" + prom.OTLPEndpoint() + "/v1/metrics",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=" + spans.url, "OTEL_METRIC_EXPORT_INTERVAL=600000"}
	var feed strings.Builder
	const n = 300
	for i := range n {
		kind := "ok"
		switch {
		case i%50 == 7:
			kind = "poison"
		case i%10 == 3:
			kind = "flaky"
		}
		fmt.Fprintf(&feed, `{"n":"%d","kind":"%s"}`+"\n", i, kind)
	}
	silt(t, feed.String(), env, "worker", "append", "--trace")
	seen := filepath.Join(dir, "traceparents")
	handler := `echo "$TRACEPARENT" >> ` + seen + `; d=$(cat); case "$d" in *'"kind":"poison"'*) exit 65;; *'"kind":"flaky"'*) exit 1;; esac`
	out, errOut, err := runBin(filepath.Join(binDir, "worker"), env, "run", "--block", "100ms", "--concurrency", "4", "--exec", handler)
	if err != nil || strings.Contains(errOut, "not delivered") {
		t.Fatalf("worker run: %v\n%s", err, errOut)
	}
	var sum struct {
		New, Drained, Claimed, Acked, Failed int64
		DeadLettered                         int64 `json:"dead_lettered"`
	}
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("worker summary %q: %v", out, err)
	}
	if sum.Acked == 0 || sum.Failed == 0 || sum.DeadLettered == 0 {
		t.Fatalf("the feed did not exercise every fate: %s", out)
	}
	checkTraces(t, srv.Client(t), "emq:{"+queue+"}:stream:orders", seen, spans, n)
	sel := fmt.Sprintf(`{silt_queue=%q, messaging_destination_name="orders"}`, queue)
	for name, want := range map[string]int64{
		"silt_worker_acked_total":                  sum.Acked,
		"silt_worker_failed_total":                 sum.Failed,
		"silt_worker_dead_lettered_total":          sum.DeadLettered,
		"messaging_client_consumed_messages_total": sum.New + sum.Drained + sum.Claimed,
		"messaging_process_duration_seconds_count": n, // one handler call per delivery
		"silt_worker_runs_total":                   1,
	} {
		if got := promValue(t, prom, name+sel); got != float64(want) {
			t.Errorf("prometheus %s = %v; the summary says %d", name, got, want)
		}
	}
	if got := promValue(t, prom, `messaging_process_duration_seconds_count{error_type="permanent", silt_queue="`+queue+`"}`); got != float64(sum.DeadLettered) {
		t.Errorf("handler calls that dead-lettered: %v, want %d", got, sum.DeadLettered)
	}

	out = silt(t, "", env, "archiver", "run", "--stream", "orders", "--keep-last", "100", "--slice-entries", "50")
	var run struct {
		Streams []struct{ Archived, Commits, Trimmed, Bytes int64 }
	}
	if err := json.Unmarshal([]byte(out), &run); err != nil || len(run.Streams) != 1 {
		t.Fatalf("archiver summary %q: %v", out, err)
	}
	r := run.Streams[0]
	for name, want := range map[string]int64{
		"silt_archiver_archived_total":       r.Archived,
		"silt_archiver_commits_total":        r.Commits,
		"silt_archiver_trimmed_total":        r.Trimmed,
		"silt_archiver_archived_bytes_total": r.Bytes,
	} {
		if got := promValue(t, prom, name+sel); got != float64(want) || want == 0 {
			t.Errorf("prometheus %s = %v; the summary says %d", name, got, want)
		}
	}
	if got := promValue(t, prom, `silt_archiver_store_requests_total{silt_store_operation="create", silt_outcome="ok"}`); got < float64(r.Commits) {
		t.Errorf("object-store creates %v, below the %d commits", got, r.Commits)
	}
	if got := promValue(t, prom, "silt_archiver_lag_seconds"+sel); got <= 0 || got > 600 {
		t.Errorf("archive lag %v s", got)
	}
	if got := promValue(t, prom, "silt_archiver_trim_blocked"+sel); got > 100 {
		t.Errorf("trim blocked %v after a healthy run", got)
	}

	// The alerting rules of docs/operations.md parse.
	cmd := exec.Command(prom.Promtool, "check", "rules", filepath.Join("..", "docs", "alerts.yml"))
	if outp, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check rules docs/alerts.yml: %v\n%s", err, outp)
	}

	// The status commands' metrics: the Prometheus text format passes
	// promtool's lint; OpenMetrics (which promtool does not parse) the
	// client library's OpenMetrics parser, with the same families.
	for _, args := range [][]string{{"worker", "status"}, {"archiver", "status"}} {
		text := silt(t, "", env, args[0], args[1], "--format", "prometheus")
		cmd := exec.Command(prom.Promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(text)
		if lint, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics on %s %s --format prometheus: %v\n%s\n%s", args[0], args[1], err, lint, text)
		}
		om := silt(t, "", env, args[0], args[1], "--format", "openmetrics")
		dec := expfmt.NewDecoder(strings.NewReader(om), expfmt.NewFormat(expfmt.TypeOpenMetrics))
		families := 0
		for {
			var mf dto.MetricFamily
			err := dec.Decode(&mf)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s %s --format openmetrics: %v\n%s", args[0], args[1], err, om)
			}
			families++
		}
		if want := strings.Count(text, "# TYPE "); families != want || families < 5 {
			t.Errorf("%s %s: %d families in OpenMetrics, %d in the text format", args[0], args[1], families, want)
		}
	}
}

// traceReceiver is an OTLP/HTTP trace endpoint that keeps what it gets.
type traceReceiver struct {
	url   string
	mu    sync.Mutex
	spans []*tracepb.Span
}

func startTraceReceiver(t *testing.T) *traceReceiver {
	r := &traceReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		var msg coltracepb.ExportTraceServiceRequest
		if err != nil || proto.Unmarshal(body, &msg) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range msg.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(nil)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL + "/v1/traces"
	return r
}

// checkTraces: every entry was stamped by worker append --trace with a
// producer span; each handler call has a consumer span whose parent is that
// producer span, in the same trace; and the handler's TRACEPARENT names the
// consumer span.
func checkTraces(t *testing.T, rdb *redis.Client, key, seen string, r *traceReceiver, n int) {
	t.Helper()
	entries, err := rdb.XRange(context.Background(), key, "-", "+").Result()
	if err != nil || len(entries) != n {
		t.Fatalf("xrange %s: %d entries, %v", key, len(entries), err)
	}
	producer := map[string]string{} // trace id -> span id of the entry's traceparent
	for _, e := range entries {
		tp, _ := e.Values["traceparent"].(string)
		parts := strings.Split(tp, "-")
		if len(parts) != 4 || parts[0] != "00" || len(parts[1]) != 32 || len(parts[2]) != 16 {
			t.Fatalf("entry %s: traceparent %q", e.ID, tp)
		}
		producer[parts[1]] = parts[2]
	}
	if len(producer) != n {
		t.Fatalf("%d distinct traces for %d entries", len(producer), n)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	consumer := map[string]bool{} // span ids of consumer spans
	sends := 0
	for _, s := range r.spans {
		trace, id, parent := hex.EncodeToString(s.TraceId), hex.EncodeToString(s.SpanId), hex.EncodeToString(s.ParentSpanId)
		switch s.Kind {
		case tracepb.Span_SPAN_KIND_PRODUCER:
			if producer[trace] != id {
				t.Fatalf("producer span %s %s is not an entry's", trace, id)
			}
			sends++
		case tracepb.Span_SPAN_KIND_CONSUMER:
			if s.Name != "process orders" || producer[trace] != parent {
				t.Fatalf("consumer span %q in trace %s has parent %s; the entry's span is %s", s.Name, trace, parent, producer[trace])
			}
			consumer[id] = true
		}
	}
	if sends != n || len(consumer) != n {
		t.Fatalf("%d producer and %d consumer spans for %d entries", sends, len(consumer), n)
	}
	lines, err := os.ReadFile(seen)
	if err != nil {
		t.Fatal(err)
	}
	calls := strings.Fields(string(lines))
	for _, tp := range calls {
		parts := strings.Split(tp, "-")
		if len(parts) != 4 || !consumer[parts[2]] || producer[parts[1]] == "" {
			t.Fatalf("a handler got TRACEPARENT=%q: not a consumer span of an entry's trace", tp)
		}
	}
	if len(calls) != n {
		t.Fatalf("%d handler calls saw TRACEPARENT, want %d", len(calls), n)
	}
}
