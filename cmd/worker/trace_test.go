package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/silt-dev/silt/internal/telemetry"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

const entryTrace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// With nothing exported, handlers get the entry's own traceparent: exec
// handlers as TRACEPARENT, webhooks as the traceparent header; an entry
// without one gets neither.
func TestTraceparent_PassedToHandlers(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	tel, err := telemetry.Setup(context.Background(), "silt-test")
	if err != nil {
		t.Fatal(err)
	}
	m := newWorkerMetrics(tel, "q", "s", "g")
	got := make(chan string, 2)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Get("traceparent") }))
	defer hook.Close()
	out := filepath.Join(t.TempDir(), "env")
	exec := execHandler([]string{"sh", "-c", `printf '%s' "$TRACEPARENT" > ` + out}, 0, nil, nil, slog.New(slog.DiscardHandler))
	for _, tc := range []struct{ field, want string }{{entryTrace, entryTrace}, {"", ""}} {
		d := stream.Delivery{ID: brand.MustParse("EVT_01JC3T7QG0000000000000A"), Fields: stream.Fields{"k": "v"}}
		if tc.field != "" {
			d.Fields[traceparentField] = tc.field
		}
		if err := m.wrap(webhookHandler(hook.URL, nil, 0, 0))(context.Background(), d); err != nil {
			t.Fatal(err)
		}
		if h := <-got; h != tc.want {
			t.Errorf("webhook traceparent header %q, want %q", h, tc.want)
		}
		if err := m.wrap(exec)(context.Background(), d); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(out); string(b) != tc.want {
			t.Errorf("exec TRACEPARENT %q, want %q", b, tc.want)
		}
	}
}

// worker append --trace: a child of $TRACEPARENT when set, a new trace
// otherwise; a line that carries one keeps it.
func TestTraceStamper(t *testing.T) {
	tel, err := telemetry.Setup(context.Background(), "silt-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("TRACEPARENT", entryTrace)
	stamp := traceStamper(tel, "orders")
	f := stream.Fields{}
	stamp(f)
	parts := strings.Split(f[traceparentField], "-")
	if len(parts) != 4 || parts[1] != "4bf92f3577b34da6a3ce929d0e0e4736" || parts[2] == "00f067aa0ba902b7" {
		t.Fatalf("stamped %q under TRACEPARENT %s", f[traceparentField], entryTrace)
	}
	kept := stream.Fields{traceparentField: "00-11111111111111111111111111111111-2222222222222222-01"}
	stamp(kept)
	if kept[traceparentField] != "00-11111111111111111111111111111111-2222222222222222-01" {
		t.Fatalf("a line's own traceparent was replaced: %q", kept[traceparentField])
	}
	t.Setenv("TRACEPARENT", "")
	fresh := stream.Fields{}
	traceStamper(tel, "orders")(fresh)
	sc := telemetry.Propagator.Extract(context.Background(), propagation.MapCarrier{traceparentField: fresh[traceparentField]})
	if !trace.SpanContextFromContext(sc).IsValid() || strings.Contains(fresh[traceparentField], "4bf92f35") {
		t.Fatalf("a new trace: %q", fresh[traceparentField])
	}
}
