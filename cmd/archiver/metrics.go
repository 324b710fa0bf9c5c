package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/silt-dev/silt/internal/telemetry"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/fence"
)

// archiverMetrics are the instruments of archiver run. Counters take the
// deltas of each stream's Result after every commit (archive.Progress).
type archiverMetrics struct {
	archived, bytes, commits, lostRaces, trimmed, requests metric.Int64Counter
	lag, trimBlocked                                       metric.Float64Gauge
}

func newArchiverMetrics(tel *telemetry.Telemetry) *archiverMetrics {
	m := tel.Meter
	c := func(name, unit, desc string) metric.Int64Counter {
		return telemetry.Must(m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc)))
	}
	g := func(name, unit, desc string) metric.Float64Gauge {
		return telemetry.Must(m.Float64Gauge(name, metric.WithUnit(unit), metric.WithDescription(desc)))
	}
	return &archiverMetrics{
		archived:  c("silt.archiver.archived", "{entry}", "Entries committed to the archive."),
		bytes:     c("silt.archiver.archived.bytes", "By", "Record bytes committed to the archive."),
		commits:   c("silt.archiver.commits", "{commit}", "Commits created behind the fence."),
		lostRaces: c("silt.archiver.lost_races", "{commit}", "Commits another archiver won first (adopted, nothing lost)."),
		trimmed:   c("silt.archiver.trimmed", "{entry}", "Entries XTRIM removed from the live stream, all archived first."),
		requests: c("silt.archiver.store.requests", "{request}",
			"Object-store requests by silt.store.operation (create, get, list, delete) and silt.outcome (ok, exists, not_found, error)."),
		lag: g("silt.archiver.lag", "s", "Now minus the mint time of the watermark W, after the run."),
		trimBlocked: g("silt.archiver.trim_blocked", "{entry}",
			"Live entries the retention policy says should have left Redis, still there after the run (archive or trim failing)."),
	}
}

// streamAttrs are the attributes of one stream's measurements.
func streamAttrs(queue, name, deadGroup string) metric.MeasurementOption {
	kv := []attribute.KeyValue{telemetry.KeySystem.String("redis"), telemetry.KeyQueue.String(queue), telemetry.KeyDestination.String(name)}
	if deadGroup != "" {
		kv = append(kv, telemetry.KeyGroup.String(deadGroup), attribute.Bool("silt.dead_letters", true))
	}
	return metric.WithAttributeSet(attribute.NewSet(kv...))
}

// progress returns an archive.Progress that records each commit's deltas.
func (m *archiverMetrics) progress(attrs metric.MeasurementOption) (archive.Progress, func(archive.Result)) {
	var last archive.Result
	record := func(r archive.Result) {
		ctx := context.Background()
		add := func(c metric.Int64Counter, d int64) {
			if d > 0 {
				c.Add(ctx, d, attrs)
			}
		}
		add(m.archived, r.Archived-last.Archived)
		add(m.bytes, r.Bytes-last.Bytes)
		add(m.commits, r.Commits-last.Commits)
		add(m.lostRaces, r.LostRaces-last.LostRaces)
		add(m.trimmed, r.Trimmed-last.Trimmed)
		last = r
	}
	return record, record
}

// after records the stream's state once its run is over: archive lag and
// the entries its policy could not move out of Redis.
func (m *archiverMetrics) after(ctx context.Context, a *archive.Archive, p archive.Policy, attrs metric.MeasurementOption) {
	if w, archived, err := a.Watermark(ctx); err == nil && archived {
		m.lag.Record(ctx, time.Since(w.Time()).Seconds(), attrs)
	}
	if n, err := a.Overdue(ctx, p); err == nil {
		m.trimBlocked.Record(ctx, float64(n), attrs)
	}
}

// countingStore counts each request to the object store by operation and
// outcome.
type countingStore struct {
	fence.Store
	requests metric.Int64Counter
}

// String names the store it counts, for errors.
func (s countingStore) String() string { return fmt.Sprint(s.Store) }

func (s countingStore) count(ctx context.Context, op string, err error) {
	outcome := "ok"
	switch {
	case errors.Is(err, fence.ErrExists):
		outcome = "exists"
	case errors.Is(err, fence.ErrNotFound):
		outcome = "not_found"
	case err != nil:
		outcome = "error"
	}
	s.requests.Add(ctx, 1, metric.WithAttributes(telemetry.KeyStoreOp.String(op), telemetry.KeyOutcome.String(outcome)))
}

func (s countingStore) Create(ctx context.Context, key string, body []byte) error {
	err := s.Store.Create(ctx, key, body)
	s.count(ctx, "create", err)
	return err
}

// CreateHashed keeps the inner store's shortcut (graft hands it the hash it
// computed anyway).
func (s countingStore) CreateHashed(ctx context.Context, key string, body []byte, sum string) error {
	var err error
	if hc, ok := s.Store.(fence.HashedCreator); ok {
		err = hc.CreateHashed(ctx, key, body, sum)
	} else {
		err = s.Store.Create(ctx, key, body)
	}
	s.count(ctx, "create", err)
	return err
}

// CreateFile keeps the inner store's streaming from a file (compaction
// uploads its merged segment from disk).
func (s countingStore) CreateFile(ctx context.Context, key, path string, size int64, sum string) error {
	err := fence.CreateFromFile(ctx, s.Store, key, path, size, sum)
	s.count(ctx, "create", err)
	return err
}

// SuffixReadsWhole passes the inner store's answer on (graft packs commits
// only where a suffix read is one small request).
func (s countingStore) SuffixReadsWhole() bool { return fence.SuffixReadsWhole(s.Store) }

func (s countingStore) Get(ctx context.Context, key string, r fence.Range) ([]byte, error) {
	b, err := s.Store.Get(ctx, key, r)
	s.count(ctx, "get", err)
	return b, err
}

func (s countingStore) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	keys, err := s.Store.List(ctx, prefix, after, limit)
	s.count(ctx, "list", err)
	return keys, err
}

func (s countingStore) Delete(ctx context.Context, key string) error {
	err := s.Store.Delete(ctx, key)
	s.count(ctx, "delete", err)
	return err
}
