package telemetry

import (
	"context"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Histogram is a cumulative explicit-bucket histogram for measurements made
// once per entry (the handler's duration). A series records with a bucket
// search and two atomic adds, and the reader collects it through the
// SDK's Producer extension point, pre-aggregated. The SDK's own
// Float64Histogram.Record resolves its attributes on every call, which cost
// a worker with a no-op handler about 10% of its throughput (BenchmarkMetrics_Ratio,
// BENCHMARKS.md).
type Histogram struct {
	name, unit, desc string
	bounds           []float64
	start            time.Time

	mu     sync.Mutex
	series []*HistogramSeries
}

// HistogramSeries is one attribute set of a Histogram; keep it and record
// into it.
type HistogramSeries struct {
	h      *Histogram
	attrs  attribute.Set
	counts []atomic.Uint64 // len(bounds)+1: the last is (bounds[-1], +Inf)
	sum    atomic.Uint64   // float64 bits
}

// Histogram returns a histogram the provider exports (a no-op export when
// nothing is exported; recording still works, for tests).
func (t *Telemetry) Histogram(name, unit, desc string, bounds []float64) *Histogram {
	h := &Histogram{name: name, unit: unit, desc: desc, bounds: bounds, start: time.Now()}
	t.producer.add(h)
	return h
}

// Series returns the series of attrs, made on first use.
func (h *Histogram) Series(attrs ...attribute.KeyValue) *HistogramSeries {
	set := attribute.NewSet(attrs...)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.series {
		if s.attrs.Equals(&set) {
			return s
		}
	}
	s := &HistogramSeries{h: h, attrs: set, counts: make([]atomic.Uint64, len(h.bounds)+1)}
	h.series = append(h.series, s)
	return s
}

// Record adds one measurement.
func (s *HistogramSeries) Record(v float64) {
	s.counts[sort.SearchFloat64s(s.h.bounds, v)].Add(1) // buckets are (lower, upper]
	for {
		old := s.sum.Load()
		if s.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// producer hands the histograms to the reader at each collection.
type producer struct {
	scope instrumentation.Scope
	mu    sync.Mutex
	hists []*Histogram
}

func (p *producer) add(h *Histogram) {
	p.mu.Lock()
	p.hists = append(p.hists, h)
	p.mu.Unlock()
}

// Produce implements sdkmetric.Producer.
func (p *producer) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	p.mu.Lock()
	hists := append([]*Histogram(nil), p.hists...)
	p.mu.Unlock()
	now := time.Now()
	sm := metricdata.ScopeMetrics{Scope: p.scope}
	for _, h := range hists {
		data := metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality}
		h.mu.Lock()
		series := append([]*HistogramSeries(nil), h.series...)
		h.mu.Unlock()
		for _, s := range series {
			dp := metricdata.HistogramDataPoint[float64]{Attributes: s.attrs, StartTime: h.start, Time: now,
				Bounds: h.bounds, BucketCounts: make([]uint64, len(s.counts))}
			for i := range s.counts {
				dp.BucketCounts[i] = s.counts[i].Load()
				dp.Count += dp.BucketCounts[i]
			}
			dp.Sum = math.Float64frombits(s.sum.Load())
			data.DataPoints = append(data.DataPoints, dp)
		}
		if len(data.DataPoints) > 0 {
			sm.Metrics = append(sm.Metrics, metricdata.Metrics{Name: h.name, Description: h.desc, Unit: h.unit, Data: data})
		}
	}
	if len(sm.Metrics) == 0 {
		return nil, nil
	}
	return []metricdata.ScopeMetrics{sm}, nil
}
