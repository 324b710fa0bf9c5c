// Package telemetry sets up OpenTelemetry for silt's short-lived commands:
// metrics and traces pushed over OTLP/HTTP, configured by the standard
// OTEL_* environment variables, flushed before the process exits (a run of
// 40 seconds from a scheduler cannot be scraped). Without an OTLP endpoint
// in the environment nothing is exported and the instruments are no-ops.
//
// Only the CLI layer uses it: the library packages report through their
// results and hooks (stream.Consumer.Progress, archive.Progress), and a
// program embedding them sets up its own SDK.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys of silt's metrics and spans. Messaging ones follow the
// OpenTelemetry semantic conventions for messaging.
const (
	KeySystem      = attribute.Key("messaging.system")              // "redis"
	KeyDestination = attribute.Key("messaging.destination.name")    // the stream
	KeyGroup       = attribute.Key("messaging.consumer.group.name") // the consumer group
	KeyQueue       = attribute.Key("silt.queue")                    // the queue (the key's hash tag)
	KeyErrorType   = attribute.Key("error.type")                    // set on failed operations
	KeyOperation   = attribute.Key("messaging.operation.name")      // "process", "send"
	KeyMessageID   = attribute.Key("messaging.message.id")          // the branded id
	KeySource      = attribute.Key("silt.delivery.source")          // drained, claimed, new, catch_up
	KeyExitReason  = attribute.Key("silt.exit_reason")              // a run's exit reason
	KeyStoreOp     = attribute.Key("silt.store.operation")          // create, get, list, delete
	KeyOutcome     = attribute.Key("silt.outcome")                  // ok, exists, not_found, error
)

// Telemetry holds the providers of one command run.
type Telemetry struct {
	Meter  metric.Meter
	Tracer trace.Tracer
	// Enabled tells whether anything is exported (an OTLP endpoint is set);
	// Traces whether spans are (OTEL_TRACES_EXPORTER is not "none").
	Enabled, Traces bool

	mp       *sdkmetric.MeterProvider
	tp       *sdktrace.TracerProvider
	producer *producer // the Histograms, collected pre-aggregated
}

// Propagator reads and writes W3C traceparent and tracestate.
var Propagator = propagation.TraceContext{}

// Setup starts the providers for service (silt-worker, silt-archiver). It
// exports when OTEL_EXPORTER_OTLP_ENDPOINT, or the metrics or traces
// endpoint variable, is set and OTEL_SDK_DISABLED is not true, metrics
// unless OTEL_METRICS_EXPORTER=none, traces unless OTEL_TRACES_EXPORTER=none
// (set it when the receiver is Prometheus, which takes no traces); the other
// standard variables (headers, timeout, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_METRIC_EXPORT_INTERVAL) apply as the SDK
// defines them. Traces are always given ids, so that an entry stamped here
// or continued here carries a valid traceparent, exported or not.
func Setup(ctx context.Context, service string) (*Telemetry, error) {
	scope := "github.com/silt-dev/silt/" + service
	t := &Telemetry{Meter: metricnoop.NewMeterProvider().Meter(service), producer: &producer{scope: instrumentation.Scope{Name: scope}}}
	endpoint := firstEnv("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	t.Enabled = endpoint != "" && !strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true")
	metrics := t.Enabled && os.Getenv("OTEL_METRICS_EXPORTER") != "none"
	t.Traces = t.Enabled && os.Getenv("OTEL_TRACES_EXPORTER") != "none"
	if p := firstEnv("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"); t.Enabled && p != "" && p != "http/protobuf" {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%s: silt exports over http/protobuf only (OTLP/HTTP, port 4318)", p)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return nil, err
	}
	if env, err := resource.New(ctx, resource.WithFromEnv()); err == nil { // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
		if merged, err := resource.Merge(res, env); err == nil {
			res = merged
		}
	}
	topts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if metrics {
		mexp, err := otlpmetrichttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTLP metrics exporter: %w", err)
		}
		opts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp, sdkmetric.WithProducer(t.producer)))}
		if !t.Traces && os.Getenv("OTEL_METRICS_EXEMPLAR_FILTER") == "" {
			// Exemplars point at spans; without exported traces they are
			// a cost per measurement with nothing to point at.
			opts = append(opts, sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
		}
		t.mp = sdkmetric.NewMeterProvider(opts...)
		t.Meter = t.mp.Meter(scope)
	}
	if t.Traces {
		texp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTLP trace exporter: %w", err)
		}
		topts = append(topts, sdktrace.WithBatcher(texp))
	}
	t.tp = sdktrace.NewTracerProvider(topts...)
	t.Tracer = t.tp.Tracer(scope)
	return t, nil
}

// Shutdown flushes what is buffered and stops the exporters, within 5
// seconds: an unreachable collector delays the exit, never hangs it.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var errs []error
	if t.tp != nil {
		errs = append(errs, t.tp.Shutdown(ctx))
	}
	if t.mp != nil {
		errs = append(errs, t.mp.Shutdown(ctx))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("telemetry flush: %w", err)
	}
	return nil
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// Must panics on an instrument error, which only a bad name or unit can
// cause: a programming error, caught by the tests.
func Must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
