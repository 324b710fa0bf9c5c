package archive

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/benchratio"
	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/fence/s3"
	"github.com/silt-dev/silt/pkg/stream"
)

// BenchmarkArchive_Steps times the slices of one run step by step (5,000
// entries each, MinIO): each round appends 5,000 entries to the stream and
// archives them as one slice of the same archive, as every slice after a
// run's first is archived (its buffers are the run's, in use, not memory
// new to the process). It reports the medians in ms: a raw XRANGE of the
// slice's entries, the fold (XRANGE in chunks and encoding), the commit
// (create-ms: laid out, hashed, created with If-None-Match and placed
// locally; read-back-ms: read back from the remote; record-ms: recorded
// in Redis), the trim, and a raw create-only PUT of as many bytes as the
// commit object. It explains P3 (a run is the first fold, then per slice
// the longer of a fold and a commit, plus a trim). Per round, fold ÷
// XRANGE and commit ÷ PUT are taken, and their medians reported as
// fold-ratio and commit-ratio (goals <= 1.25 and <= 1.2), with their
// spreads; fold-cpu-ratio is the same for the CPU this process spends
// (less noisy than the wall clock on a shared machine; redis-server's is
// the same on both sides); create-ratio is create-ms ÷ the PUT, the part
// of a commit a run waits for before its next create (the proof, read
// back and record, runs beside the next slice). staged-put-ms is the raw
// PUT again while the same bytes are written to a local file and fsynced
// beside it, waiting for both: the floor of a create that keeps its
// durable local copy (MinIO writes to the same disk here), and
// create-floor-ratio is create-ms ÷ that floor. A commit is proven by
// reading it back: commit-proven-ratio divides it by the raw PUT and a raw
// GET of its last 4 KiB after it (raw-get-ms), one after the other, and
// proof-floor-ratio is that raw PUT and GET ÷ the raw PUT alone: as low as
// commit-ratio can be while each commit is read back before its trim.
// Needs MinIO from scripts/servers.sh.
//
//	go test -run '^$' -bench Archive_Steps -benchtime 15x ./pkg/archive
func BenchmarkArchive_Steps(b *testing.B) {
	srv := testserver.S3(b, "minio")
	bucket := srv.CreateBucket(b)
	ctx := context.Background()
	rdb := testserver.Redis(b).Client(b)
	ks, _ := stream.NewKeyspace("", "steps")
	fields := make([]stream.Fields, 5000)
	for i := range fields {
		fields[i] = stream.Fields{"user": fmt.Sprintf("u%06d", i), "action": "login", "amount": fmt.Sprint(i % 1000)}
	}
	var xrange, fold, commit, trim, put, staged []float64
	var get, putGet []float64        // a raw GET of the PUT's last 4 KiB after it, and both
	var create, back, rec []float64  // the commit's three steps
	var xrangeCPU, foldCPU []float64 // this process's CPU in each
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	l, _ := stream.NewLog(rdb, ks, "s", brand.EVT)
	st, err := s3.Open(ctx, s3.Config{Bucket: bucket, Prefix: "r", Endpoint: srv.Endpoint,
		Region: "us-east-1", PathStyle: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		b.Fatal(err)
	}
	a, err := Open(ctx, l, b.TempDir(), st)
	if err != nil {
		b.Fatal(err)
	}
	a.SliceEntries = 5000
	a.flat = l.FlatReader() // as a run's folds read
	defer a.flat.Close()
	if err := a.checkIdentity(ctx); err != nil {
		b.Fatal(err)
	}
	var at state // the archive's state after the slices so far
	b.ResetTimer()
	for round := range b.N {
		if _, err := l.AppendBatch(ctx, fields); err != nil {
			b.Fatal(err)
		}
		from, _ := at.W.Next()
		want := 5000 // KeepLast 1 leaves a slice's last entry live, for the slice after it
		if round == 0 {
			want--
		}
		c0, t0 := benchratio.ProcessCPU(), time.Now()
		if n := len(rdb.XRangeN(ctx, l.Key(), from.String(), "+", int64(want)).Val()); n != want {
			b.Fatalf("xrange read %d", n)
		}
		c1, t1 := benchratio.ProcessCPU(), time.Now()
		f, err := a.fold(ctx, Policy{KeepLast: 1}, at, brand.StreamID{MS: 1 << 50}, uncounted)
		if err != nil || len(f.pages) != want {
			b.Fatalf("fold: %d pages, %v", len(f.pages), err)
		}
		c2, t2 := benchratio.ProcessCPU(), time.Now()
		xrangeCPU, foldCPU = append(xrangeCPU, ms(c1-c0)), append(foldCPU, ms(c2-c1))
		// The commit step as a run takes it: create-only, read back, recorded in Redis.
		c, err := a.vol.Commit(ctx, f.pages, f.next.meta(f.first, a.identity))
		tc1 := time.Now()
		if err == nil {
			err = a.readBack(ctx, c)
		}
		tc2 := time.Now()
		if err == nil {
			err = a.record(ctx, c, f.next.W)
		}
		if err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		a.arenas.put(f.blocks) // as Run does once a slice is created
		at = f.next
		create, back, rec = append(create, ms(tc1.Sub(t2))), append(back, ms(tc2.Sub(tc1))), append(rec, ms(t3.Sub(tc2)))
		if _, err := a.trim(ctx, &Result{}); err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		body := make([]byte, c.Segment.Size)
		rawPut := func() {
			t := time.Now()
			if err := st.Create(ctx, fmt.Sprint("raw/", round), body); err != nil {
				b.Fatal(err)
			}
			tg := time.Now()
			if _, err := st.Get(ctx, fmt.Sprint("raw/", round), fence.Suffix(4<<10)); err != nil {
				b.Fatal(err)
			}
			put, get = append(put, ms(tg.Sub(t))), append(get, ms(time.Since(tg)))
			putGet = append(putGet, ms(time.Since(t)))
		}
		stagedPut := func() {
			t := time.Now()
			local := make(chan error, 1)
			go func() { local <- benchratio.WriteSynced(b.TempDir(), body) }()
			err := st.Create(ctx, fmt.Sprint("staged/", round), body)
			if err = cmp.Or(err, <-local); err != nil {
				b.Fatal(err)
			}
			staged = append(staged, ms(time.Since(t)))
		}
		if round%2 == 0 { // neither baseline always the second, on a warmer path
			rawPut()
			stagedPut()
		} else {
			stagedPut()
			rawPut()
		}
		xrange, fold, commit, trim = append(xrange, ms(t1.Sub(t0))), append(fold, ms(t2.Sub(t1))), append(commit, ms(t3.Sub(t2))), append(trim, ms(t4.Sub(t3)))
	}
	ratios := func(name string, num, den []float64) {
		r := make([]float64, len(num))
		for i := range r {
			r[i] = num[i] / den[i]
		}
		slices.Sort(r)
		b.ReportMetric(r[len(r)/2], name)
		b.ReportMetric(r[0], name+"-min")
		b.ReportMetric(r[len(r)-1], name+"-max")
	}
	ratios("fold-ratio", fold, xrange)
	ratios("fold-cpu-ratio", foldCPU, xrangeCPU)
	ratios("commit-ratio", commit, put)
	ratios("commit-proven-ratio", commit, putGet)
	ratios("create-ratio", create, put)
	ratios("create-floor-ratio", create, staged)
	ratios("proof-floor-ratio", putGet, put)
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(median(xrange), "xrange-ms")
	b.ReportMetric(median(fold), "fold-ms")
	b.ReportMetric(median(commit), "commit-ms")
	b.ReportMetric(median(create), "create-ms")
	b.ReportMetric(median(back), "read-back-ms")
	b.ReportMetric(median(rec), "record-ms")
	b.ReportMetric(median(put), "raw-put-ms")
	b.ReportMetric(median(get), "raw-get-ms")
	b.ReportMetric(median(staged), "staged-put-ms")
	b.ReportMetric(median(trim), "trim-ms")
}
