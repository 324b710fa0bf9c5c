package telemetry

import (
	"context"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func TestHistogram_ProducesWhatWasRecorded(t *testing.T) {
	tel, err := Setup(context.Background(), "silt-test")
	if err != nil {
		t.Fatal(err)
	}
	h := tel.Histogram("x.duration", "s", "test", []float64{0.01, 0.1, 1})
	ok := h.Series(attribute.String("k", "ok"))
	if h.Series(attribute.String("k", "ok")) != ok {
		t.Fatal("the same attributes gave two series")
	}
	bad := h.Series(attribute.String("k", "bad"))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				ok.Record(0.005) // first bucket
				ok.Record(0.1)   // second: buckets are (lower, upper]
				bad.Record(5)    // overflow
			}
		})
	}
	wg.Wait()
	sms, err := tel.producer.Produce(context.Background())
	if err != nil || len(sms) != 1 || len(sms[0].Metrics) != 1 {
		t.Fatalf("produced %+v, %v", sms, err)
	}
	data := sms[0].Metrics[0].Data.(metricdata.Histogram[float64])
	if data.Temporality != metricdata.CumulativeTemporality || len(data.DataPoints) != 2 {
		t.Fatalf("data %+v", data)
	}
	for _, dp := range data.DataPoints {
		k, _ := dp.Attributes.Value("k")
		want := map[string][]uint64{"ok": {4000, 4000, 0, 0}, "bad": {0, 0, 0, 4000}}[k.AsString()]
		for i, c := range dp.BucketCounts {
			if c != want[i] {
				t.Fatalf("%s: buckets %v, want %v", k.AsString(), dp.BucketCounts, want)
			}
		}
		if k.AsString() == "ok" && (dp.Count != 8000 || dp.Sum < 420-1e-6 || dp.Sum > 420+1e-6) {
			t.Fatalf("ok: count %d sum %v", dp.Count, dp.Sum)
		}
	}
}
