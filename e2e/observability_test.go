package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/silt-dev/silt/internal/testserver"
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
	env := []string{"EMQ_REDIS_URL=" + srv.URL(), "EMQ_QUEUE=" + queue, "EMQ_STREAM=orders", "EMQ_GROUP=billing",
		"EMQ_DATA_DIR=" + filepath.Join(dir, "data"), "EMQ_ARCHIVE_REMOTE=file://" + filepath.Join(dir, "remote"),
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + prom.OTLPEndpoint(), "OTEL_METRIC_EXPORT_INTERVAL=600000"}
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
	handler := `d=$(cat); case "$d" in *'"kind":"poison"'*) exit 65;; *'"kind":"flaky"'*) exit 1;; esac; ` +
		`case "$TRACEPARENT" in 00-*) ;; *) exit 1;; esac`
	out := silt(t, "", env, "worker", "run", "--block", "100ms", "--concurrency", "4", "--exec", handler)
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
	if sum.Acked+sum.Failed+sum.DeadLettered != n {
		t.Fatalf("handlers without TRACEPARENT failed: %s", out)
	}
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
