package testserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"
)

// PrometheusServer is a Prometheus with its OTLP receiver, started by
// scripts/servers.sh: the receiver of the metrics silt pushes.
type PrometheusServer struct {
	URL      string // http://127.0.0.1:port
	Promtool string // the promtool built beside it
}

// Prometheus returns the server from SILT_PROMETHEUS_URL and SILT_PROMTOOL.
// When they are absent the test fails naming the script (or skips with -short).
func Prometheus(tb testing.TB) PrometheusServer {
	tb.Helper()
	p := PrometheusServer{URL: os.Getenv("SILT_PROMETHEUS_URL"), Promtool: os.Getenv("SILT_PROMTOOL")}
	if p.URL == "" || p.Promtool == "" {
		Absent(tb, "prometheus (SILT_PROMETHEUS_URL, SILT_PROMTOOL)", `eval "$(scripts/servers.sh start prometheus)"`)
	}
	return p
}

// OTLPEndpoint is the value of OTEL_EXPORTER_OTLP_ENDPOINT for this server
// (the exporter appends /v1/metrics).
func (p PrometheusServer) OTLPEndpoint() string { return p.URL + "/api/v1/otlp" }

// Sample is one series of an instant query.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Query runs an instant PromQL query and returns its vector.
func (p PrometheusServer) Query(tb testing.TB, q string) []Sample {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/api/v1/query?query="+url.QueryEscape(q), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("prometheus query %s: %v", q, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string
		Error  string
		Data   struct {
			ResultType string
			Result     []struct {
				Metric map[string]string
				Value  [2]any
			}
		}
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Status != "success" {
		tb.Fatalf("prometheus query %s: %s %v", q, body, err)
	}
	out := make([]Sample, 0, len(r.Data.Result))
	for _, s := range r.Data.Result {
		v, err := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64)
		if err != nil {
			tb.Fatalf("prometheus query %s: value %v", q, s.Value[1])
		}
		out = append(out, Sample{Labels: s.Metric, Value: v})
	}
	return out
}
