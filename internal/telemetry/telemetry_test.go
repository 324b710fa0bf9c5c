package telemetry

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// The exposition passes the client library's own parsers, in both formats,
// with counters named name_total and every value as set.
func TestExposition_ParsesBack(t *testing.T) {
	x := NewExposition()
	x.Gauge("silt_group_pending", "Pending.", prometheus.Labels{"stream": "a", "group": "g"}, 3)
	x.Gauge("silt_group_pending", "Pending.", prometheus.Labels{"stream": "a", "group": "h"}, 0)
	x.Counter("silt_stream_entries_added", "Added.", prometheus.Labels{"stream": "a"}, 42)
	for _, format := range []string{FormatOpenMetrics, FormatPrometheus} {
		var buf bytes.Buffer
		if err := x.Write(&buf, format); err != nil {
			t.Fatal(err)
		}
		f := expfmt.NewFormat(expfmt.TypeTextPlain)
		if format == FormatOpenMetrics {
			if !strings.HasSuffix(buf.String(), "# EOF\n") {
				t.Fatalf("openmetrics without # EOF:\n%s", buf.String())
			}
			f = expfmt.NewFormat(expfmt.TypeOpenMetrics)
		}
		dec := expfmt.NewDecoder(&buf, f)
		got := map[string]float64{}
		for {
			var mf dto.MetricFamily
			err := dec.Decode(&mf)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", format, err)
			}
			for _, m := range mf.Metric {
				v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
				var labels []string
				for _, l := range m.Label {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				got[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = v
				if mf.GetName() == "silt_stream_entries_added" || mf.GetName() == "silt_stream_entries_added_total" {
					if mf.GetType() != dto.MetricType_COUNTER {
						t.Fatalf("%s: entries added is a %s", format, mf.GetType())
					}
				}
			}
		}
		added := got["silt_stream_entries_added_total{stream=a}"] + got["silt_stream_entries_added{stream=a}"]
		if got["silt_group_pending{group=g,stream=a}"] != 3 || added != 42 || len(got) != 3 {
			t.Fatalf("%s parsed back as %v", format, got)
		}
	}
	if err := x.Write(io.Discard, "yaml"); err == nil {
		t.Fatal("an unknown format was taken")
	}
}

func TestSetup_OffWithoutAnEndpoint(t *testing.T) {
	for _, v := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		t.Setenv(v, "")
	}
	tel, err := Setup(context.Background(), "silt-test")
	if err != nil || tel.Enabled {
		t.Fatalf("Setup without an endpoint: enabled %v, %v", tel != nil && tel.Enabled, err)
	}
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	if _, err := Setup(context.Background(), "silt-test"); err == nil || !strings.Contains(err.Error(), "http/protobuf") {
		t.Fatalf("grpc asked: %v", err)
	}
}
