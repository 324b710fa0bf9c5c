package export_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/benchratio"
	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/export"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/stream"
)

const benchEntries = 50000

// benchArchive is a stream of benchEntries order events minted a second
// apart (14 hour partitions), the older half archived and trimmed.
func benchArchive(b *testing.B) *archive.Archive {
	ctx := context.Background()
	ks, _ := stream.NewKeyspace("", "bench")
	l, _ := stream.NewLog(testserver.Redis(b).Client(b), ks, "orders", brand.EVT)
	at := uint64(time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC).UnixMilli())
	for i := range benchEntries {
		id, _ := brand.New(brand.EVT, brand.StreamID{MS: at + uint64(i)*1000})
		f := stream.Fields{"user": fmt.Sprintf("u%06d", i%5000), "type": []string{"created", "paid", "shipped"}[i%3],
			"amount": fmt.Sprint(i % 1000), "sku": fmt.Sprintf("SKU-%05d", i%977)}
		if err := l.AppendID(ctx, id, f); err != nil {
			b.Fatal(err)
		}
	}
	store, _ := fence.OpenLocal(b.TempDir())
	a, err := archive.Open(ctx, l, b.TempDir(), store)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := a.Run(ctx, archive.Policy{KeepLast: benchEntries / 2}, nil); err != nil {
		b.Fatal(err)
	}
	return a
}

// BenchmarkExport_Ratio (X1): export of 50,000 entries (half archived, half
// live) as Parquet into a fresh local directory ÷ what `archiver read
// --format jsonl` does with the same range (the merged read, each entry
// marshalled as a JSON line into a buffered writer), both in this process.
// Goal >= 0.5. Also reported: the Parquet files' bytes ÷ the JSON lines'.
//
//	go test -run '^$' -bench Export_Ratio -benchtime 9x ./pkg/export
func BenchmarkExport_Ratio(b *testing.B) {
	ctx := context.Background()
	a := benchArchive(b)
	var parquetBytes, jsonlBytes int64
	silt := func(tb testing.TB) int {
		st, _ := fence.OpenLocal(b.TempDir())
		x, err := export.New(a, st, export.Options{})
		if err != nil {
			tb.Fatal(err)
		}
		res, err := x.Run(ctx, stream.First, stream.Last)
		if err != nil || res.Rows != benchEntries {
			tb.Fatalf("export %+v %v", res, err)
		}
		parquetBytes = res.Bytes
		return int(res.Rows)
	}
	raw := func(tb testing.TB) int {
		var counted countingWriter
		out := bufio.NewWriterSize(&counted, 64<<10)
		n := 0
		for it, err := range a.Read(ctx, stream.First, stream.Last) {
			if err != nil {
				tb.Fatal(err)
			}
			rec := struct {
				ID           string            `json:"id"`
				StreamID     string            `json:"stream_id"`
				Fields       map[string]string `json:"fields"`
				FieldsBase64 map[string]string `json:"fields_base64,omitempty"`
				Source       string            `json:"source"`
			}{ID: it.ID.String(), StreamID: it.StreamID.String(), Source: it.Source}
			rec.Fields, rec.FieldsBase64 = stream.SplitBinary(it.Fields)
			line, _ := json.Marshal(rec)
			out.Write(line)
			out.WriteByte('\n')
			n++
		}
		out.Flush()
		jsonlBytes = counted.n
		return n
	}
	benchratio.Compare(b, silt, raw)
	b.ReportMetric(float64(parquetBytes)/float64(jsonlBytes), "parquet/jsonl-bytes")
}

type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

var _ io.Writer = (*countingWriter)(nil)
