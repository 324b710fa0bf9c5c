package archive_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/silt-dev/silt/internal/testing/benchratio"
	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/fence/s3"
	"github.com/silt-dev/silt/pkg/stream"
)

const benchEntries = 20000

func benchLog(b *testing.B, name string) (*stream.Log, *testserver.RedisServer) {
	srv := testserver.Redis(b)
	ks, _ := stream.NewKeyspace("", "bench")
	l, _ := stream.NewLog(srv.Client(b), ks, name, brand.EVT)
	return l, srv
}

func fill(b *testing.B, l *stream.Log, n int) {
	batch := make([]stream.Fields, n)
	for i := range batch {
		batch[i] = stream.Fields{"user": fmt.Sprintf("u%06d", i), "action": "login", "amount": fmt.Sprint(i % 1000)}
	}
	if _, err := l.AppendBatch(context.Background(), batch); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkArchive_Ratio (P3): end-to-end archive of 20,000 entries
// (XRANGE, fold into pages, upload to MinIO, commit, XTRIM) ÷ a raw XRANGE
// scan of the same stream; each round's fill of its stream and the
// archive's open are outside the timing. Needs MinIO from scripts/servers.sh.
//
//	go test -run '^$' -bench Archive_Ratio -benchtime 9x ./pkg/archive
func BenchmarkArchive_Ratio(b *testing.B) {
	srv := testserver.S3(b, "minio")
	bucket := srv.CreateBucket(b)
	ctx := context.Background()
	round := 0
	rdbSrv := testserver.Redis(b)
	rdb := rdbSrv.Client(b)
	ks, _ := stream.NewKeyspace("", "bench")
	silt := func(tb testing.TB) int {
		round++
		var a *archive.Archive
		benchratio.Untimed(func() {
			l, _ := stream.NewLog(rdb, ks, fmt.Sprintf("s%d", round), brand.EVT)
			fill(b, l, benchEntries)
			st, err := s3.Open(ctx, s3.Config{Bucket: bucket, Prefix: fmt.Sprint("r", round), Endpoint: srv.Endpoint,
				Region: "us-east-1", PathStyle: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
			if err != nil {
				tb.Fatal(err)
			}
			if a, err = archive.Open(ctx, l, tb.TempDir(), st); err != nil {
				tb.Fatal(err)
			}
			a.SliceEntries = 5000
		})
		res, err := a.Run(ctx, archive.Policy{KeepLast: 1}, nil)
		if err != nil || res.Archived != benchEntries-1 {
			tb.Fatalf("run %+v %v", res, err)
		}
		return int(res.Archived)
	}
	raw := func(tb testing.TB) int {
		round++
		l, _ := stream.NewLog(rdb, ks, fmt.Sprintf("s%d", round), brand.EVT)
		benchratio.Untimed(func() { fill(b, l, benchEntries) })
		n := 0
		from := stream.First
		for {
			page, err := l.ReadRaw(ctx, from, stream.Last, 5000)
			if err != nil {
				tb.Fatal(err)
			}
			n += len(page)
			if len(page) < 5000 {
				return n
			}
			from, _ = page[len(page)-1].StreamID.Next()
		}
	}
	benchratio.Compare(b, silt, raw)
}

// BenchmarkMergedRead_Ratio (P5): a merged read of 20,000 archived entries
// from local page files ÷ a live XRANGE of the same entries (paged by 1,000,
// as the merged read pages). Goal >= 1.
//
//	go test -run '^$' -bench MergedRead_Ratio -benchtime 15x ./pkg/archive
func BenchmarkMergedRead_Ratio(b *testing.B) {
	ctx := context.Background()
	archived, _ := benchLog(b, "archived")
	fill(b, archived, benchEntries)
	store, _ := fence.OpenLocal(b.TempDir())
	a, err := archive.Open(ctx, archived, b.TempDir(), store)
	if err != nil {
		b.Fatal(err)
	}
	a.SliceEntries = 5000
	a.Exact = true
	if _, err := a.Run(ctx, archive.Policy{KeepLast: 1}, nil); err != nil {
		b.Fatal(err)
	}
	live, _ := benchLog(b, "live")
	fill(b, live, benchEntries-1)
	last, _, err := a.Watermark(ctx)
	if err != nil {
		b.Fatal(err)
	}
	silt := func(tb testing.TB) int {
		n := 0
		for it, err := range a.Read(ctx, stream.First, last) {
			if err != nil || it.Source != archive.SourceArchive {
				tb.Fatalf("%v %s", err, it.Source)
			}
			n++
		}
		return n
	}
	raw := func(tb testing.TB) int {
		n := 0
		for _, err := range live.Read(ctx, stream.First, stream.Last) {
			if err != nil {
				tb.Fatal(err)
			}
			n++
		}
		return n
	}
	benchratio.Compare(b, silt, raw)
}
