package main

import (
	"context"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/silt-dev/silt/internal/telemetry"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/stream"
)

// workerMetrics are the instruments of one worker run or replay. Counters
// take the deltas of the run's Summary after each batch, so a periodic
// export under a long run shows progress, and the final flush equals the
// JSON summary.
type workerMetrics struct {
	tel   *telemetry.Telemetry
	attrs metric.MeasurementOption
	set   attribute.Set

	delivered, acked, failed, deadLettered, duplicates, recovered metric.Int64Counter
	batchSize, runDuration                                        metric.Float64Histogram
	runs                                                          metric.Int64Counter
	// handler durations: one measurement per call, so recorded through
	// telemetry.Histogram (ok, failed, permanent).
	handlerOK, handlerFailed, handlerPermanent *telemetry.HistogramSeries

	last stream.Summary
}

func newWorkerMetrics(tel *telemetry.Telemetry, queue, streamName, group string) *workerMetrics {
	m := tel.Meter
	counter := func(name, unit, desc string) metric.Int64Counter {
		return telemetry.Must(m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc)))
	}
	histogram := func(name, unit, desc string, bounds ...float64) metric.Float64Histogram {
		return telemetry.Must(m.Float64Histogram(name, metric.WithUnit(unit), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(bounds...)))
	}
	set := attribute.NewSet(telemetry.KeySystem.String("redis"), telemetry.KeyQueue.String(queue),
		telemetry.KeyDestination.String(streamName), telemetry.KeyGroup.String(group))
	w := &workerMetrics{tel: tel, set: set, attrs: metric.WithAttributeSet(set),
		delivered: counter("messaging.client.consumed.messages", "{message}",
			"Entries handed to the handler (attribute silt.delivery.source: drained, claimed, new, catch_up)."),
		acked:        counter("silt.worker.acked", "{message}", "Entries handled (or found already handled) and acked."),
		failed:       counter("silt.worker.failed", "{message}", "Handler failures left pending for a retry."),
		deadLettered: counter("silt.worker.dead_lettered", "{message}", "Entries moved to the group's dead-letter stream."),
		duplicates: counter("silt.worker.duplicates_skipped", "{message}",
			"Entries the group had handled already (dedupe markers), acked without the handler."),
		recovered: counter("silt.worker.recovered", "{message}", "Payloads trimmed while pending, recovered from the archive."),
		runs:      counter("silt.worker.runs", "{run}", "Runs ended, by exit reason."),
		batchSize: histogram("silt.worker.batch.size", "{message}", "Entries per batch read.", 1, 10, 50, 100, 250, 500, 1000, 2000),
		runDuration: histogram("silt.worker.run.duration", "s", "Run duration, by exit reason.",
			1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600),
	}
	hd := tel.Histogram("messaging.process.duration", "s", "Handler call duration (error.type set when it failed).",
		[]float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300})
	base := set.ToSlice()
	w.handlerOK = hd.Series(base...)
	w.handlerFailed = hd.Series(append(slices.Clip(base), telemetry.KeyErrorType.String("handler_error"))...)
	w.handlerPermanent = hd.Series(append(slices.Clip(base), telemetry.KeyErrorType.String("permanent"))...)
	return w
}

// progress records the deltas since the last batch (stream.Consumer.Progress).
func (w *workerMetrics) progress(sum stream.Summary, batch int) {
	ctx := context.Background()
	prev := w.last
	w.last = sum
	for src, d := range map[string]int64{"drained": sum.Drained - prev.Drained, "claimed": sum.Claimed - prev.Claimed,
		"new": sum.New - prev.New, "catch_up": sum.CatchUp - prev.CatchUp} {
		if d > 0 {
			w.delivered.Add(ctx, d, w.attrs, metric.WithAttributes(telemetry.KeySource.String(src)))
		}
	}
	add := func(c metric.Int64Counter, d int64) {
		if d > 0 {
			c.Add(ctx, d, w.attrs)
		}
	}
	add(w.acked, sum.Acked-prev.Acked)
	add(w.failed, sum.Failed-prev.Failed)
	add(w.deadLettered, sum.DeadLettered-prev.DeadLettered)
	add(w.duplicates, sum.DuplicatesSkipped-prev.DuplicatesSkipped)
	add(w.recovered, sum.PayloadRecovered-prev.PayloadRecovered)
	if batch > 0 {
		w.batchSize.Record(ctx, float64(batch), w.attrs)
	}
}

// end records the run's last deltas, its duration and exit reason.
func (w *workerMetrics) end(sum stream.Summary) {
	w.progress(sum, 0)
	reason := metric.WithAttributes(telemetry.KeyExitReason.String(sum.ExitReason))
	w.runs.Add(context.Background(), 1, w.attrs, reason)
	w.runDuration.Record(context.Background(), sum.Elapsed.Seconds(), w.attrs, reason)
}

// endReplay records what a replay did: its deliveries (source "replay"),
// acked when handled, and at most one failure, which stops a replay.
func (w *workerMetrics) endReplay(res archive.ReplayResult, err error, took time.Duration) {
	sum := stream.Summary{Acked: res.Replayed, Elapsed: took, ExitReason: "done"}
	if !res.Done {
		sum.ExitReason = "stopped"
	}
	if err != nil {
		sum.Failed, sum.ExitReason = 1, "error"
	}
	if n := sum.Acked + sum.Failed; n > 0 {
		w.delivered.Add(context.Background(), n, w.attrs, metric.WithAttributes(telemetry.KeySource.String("replay")))
	}
	w.end(sum)
}

// wrap times each handler call and, for an entry with a traceparent field,
// gives it a consumer span, a child of that trace (only such entries get
// one: the rest would be root spans of one call each, a cost without a
// reader). The handler's context carries
// the span, so exec and webhook handlers pass it on.
func (w *workerMetrics) wrap(h stream.Handler) stream.Handler {
	return func(ctx context.Context, d stream.Delivery) error {
		tp := d.Fields[traceparentField]
		if tp == "" { // no trace to continue: time the call, nothing more
			return w.timed(ctx, d, h)
		}
		ctx = telemetry.Propagator.Extract(ctx, propagation.MapCarrier{traceparentField: tp, "tracestate": d.Fields["tracestate"]})
		if !w.tel.Traces { // nothing exported: the entry's own context is passed on as it is
			return w.timed(ctx, d, h)
		}
		ctx, span := w.tel.Tracer.Start(ctx, "process "+w.destination(), trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(w.set.ToSlice()...), trace.WithAttributes(telemetry.KeyOperation.String("process"),
				telemetry.KeyMessageID.String(d.ID.String())))
		err := w.timed(ctx, d, h)
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		return err
	}
}

// timed calls h and records its duration by outcome.
func (w *workerMetrics) timed(ctx context.Context, d stream.Delivery, h stream.Handler) error {
	start := time.Now()
	err := h(ctx, d)
	took := time.Since(start).Seconds()
	switch {
	case err == nil:
		w.handlerOK.Record(took)
	case stream.IsPermanent(err):
		w.handlerPermanent.Record(took)
	default:
		w.handlerFailed.Record(took)
	}
	return err
}

func (w *workerMetrics) destination() string {
	v, _ := w.set.Value(telemetry.KeyDestination)
	return v.AsString()
}

// traceparentField is the entry field that carries a W3C trace context.
const traceparentField = "traceparent"

// traceparentOf returns the W3C traceparent of ctx's span ("" when none).
func traceparentOf(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() { // what Inject writes nothing for: no carrier made
		return ""
	}
	carrier := propagation.MapCarrier{}
	telemetry.Propagator.Inject(ctx, carrier)
	return carrier[traceparentField]
}
