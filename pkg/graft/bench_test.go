package graft_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/silt-dev/silt/internal/testing/benchratio"
	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/graft"
)

// BenchmarkUpload_Ratio compares a 4 MiB commit to MinIO (segment written
// and fsynced locally, uploaded create-only, commit object created) with a
// raw create of the same bytes. Goal: ratio >= 0.85. Printed beside it:
// ratio-staged, the commit against its staged floor (staged-ms: the raw
// create while as many bytes are written and fsynced locally beside it,
// timed in the same rounds outside the ratio), and staged-floor, that
// floor against the raw create: as high as the ratio can go while each
// commit keeps a durable local copy, on a machine whose MinIO writes to
// the same disk. Needs MinIO from scripts/servers.sh.
//
//	go test -run '^$' -bench Upload_Ratio -benchtime 15x ./pkg/graft
func BenchmarkUpload_Ratio(b *testing.B) {
	st := s3Store(b, "minio")
	ctx := context.Background()
	v, err := graft.Open(ctx, b.TempDir(), "vol", st)
	if err != nil {
		b.Fatal(err)
	}
	pages := make([]graft.Page, 4096)
	for i := range pages {
		pages[i] = graft.Page{No: 1<<63 + uint64(i), Data: bytes.Repeat([]byte{byte(i)}, 1024)}
	}
	seg, _ := graft.EncodeSegment(1, pages)
	// Where a commit's time goes: from its start to the segment uploaded
	// (encode, hash, upload, with the local write alongside), then the commit
	// object, then the local head; against the raw create's time.
	var t0 time.Time
	var segment, commitPut, rest, rawTime []float64
	v.Failpoint = func(step failpoint.Name) {
		ms := float64(time.Since(t0)) / float64(time.Millisecond)
		switch step {
		case failpoint.SegmentUploaded:
			segment = append(segment, ms)
		case failpoint.CommitPut:
			commitPut = append(commitPut, ms-segment[len(segment)-1])
		case failpoint.HeadUpdated:
			rest = append(rest, ms-segment[len(segment)-1]-commitPut[len(commitPut)-1])
		}
	}
	n := 0
	var siltT, rawT, stagedT []time.Duration
	silt := func(tb testing.TB) int {
		t0 = time.Now()
		if _, err := v.Commit(ctx, pages, nil); err != nil {
			tb.Fatal(err)
		}
		siltT = append(siltT, time.Since(t0))
		return len(seg)
	}
	tmp := b.TempDir()
	raw := func(tb testing.TB) int {
		n++
		r0 := time.Now()
		if err := st.Create(ctx, fmt.Sprintf("raw/%d", n), seg); err != nil {
			tb.Fatal(err)
		}
		rawT = append(rawT, time.Since(r0))
		rawTime = append(rawTime, float64(time.Since(r0))/float64(time.Millisecond))
		// The staged floor: the same create while as many bytes are
		// written and fsynced locally beside it, as a commit's durable
		// local copy is (here MinIO writes to the same disk).
		benchratio.Untimed(func() {
			r0 := time.Now()
			local := make(chan error, 1)
			go func() { local <- benchratio.WriteSynced(tmp, seg) }()
			err := st.Create(ctx, fmt.Sprintf("staged/%d", n), seg)
			if err = cmp.Or(err, <-local); err != nil {
				tb.Fatal(err)
			}
			stagedT = append(stagedT, time.Since(r0))
		})
		return len(seg)
	}
	benchratio.Compare(b, silt, raw)
	reportMedians(b, map[string][]float64{"segment-ms": segment, "commit-put-ms": commitPut, "local-head-ms": rest, "raw-create-ms": rawTime})
	benchratio.ReportMS(b, "staged", stagedT)
	benchratio.ReportTimeRatio(b, "ratio-staged", siltT, stagedT)
	benchratio.ReportTimeRatio(b, "staged-floor", stagedT, rawT)
	var _ fence.Store = st
}

// BenchmarkCompaction_Ratio (D5) compares compacting 256 segments of 16
// KiB into one 4 MiB segment on MinIO (GET each, 8 at once, merge,
// create-only PUT, compaction commit, checkpoint) with raw GETs of the
// same 256 objects, 8 at once, and a raw PUT of their bytes. Goal: ratio >= 0.7. Each round compacts its own
// volume, built before the rounds. Needs MinIO from scripts/servers.sh.
//
//	go test -run '^$' -bench Compaction_Ratio -benchtime 9x ./pkg/graft
func BenchmarkCompaction_Ratio(b *testing.B) {
	st := s3Store(b, "minio")
	ctx := context.Background()
	type built struct {
		v    *graft.Volume
		keys []string
	}
	vols := make([]built, b.N)
	for i := range vols {
		v, err := graft.Open(ctx, b.TempDir(), fmt.Sprint("vol", i), st)
		if err != nil {
			b.Fatal(err)
		}
		for c := range 256 {
			pages := make([]graft.Page, 64)
			for j := range pages {
				pages[j] = graft.Page{No: uint64(c*64 + j), Data: bytes.Repeat([]byte{byte(c + j)}, 256)}
			}
			if _, err := v.Commit(ctx, pages, nil); err != nil {
				b.Fatal(err)
			}
		}
		for e, err := range v.Entries(ctx, nil) {
			if err != nil {
				b.Fatal(err)
			}
			vols[i].keys = append(vols[i].keys, e.Segment.Key)
		}
		// A cold handle, as `archiver compact` on another machine would be:
		// every segment comes from the remote.
		if vols[i].v, err = graft.Open(ctx, b.TempDir(), fmt.Sprint("vol", i), st); err != nil {
			b.Fatal(err)
		}
	}
	si, ri := 0, 0
	var objects []float64
	silt := func(tb testing.TB) int {
		res, err := vols[si].v.Compact(ctx, graft.CompactOptions{Target: 8 << 20, MinEntries: 256})
		if err != nil || res.Segments != 1 || res.Merged != 256 {
			tb.Fatalf("compact: %+v %v", res, err)
		}
		si++
		objects = append(objects, float64(res.Entries))
		return int(res.Bytes)
	}
	raw := func(tb testing.TB) int {
		// The same GETs, as many at once as compaction makes (8), then one PUT.
		segs := make([][]byte, len(vols[ri].keys))
		var wg sync.WaitGroup
		next := make(chan int)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					seg, err := st.Get(ctx, vols[ri].keys[i], fence.Range{})
					if err != nil {
						tb.Error(err)
					}
					segs[i] = seg
				}
			}()
		}
		for i := range segs {
			next <- i
		}
		close(next)
		wg.Wait()
		all := bytes.Join(segs, nil)
		if err := st.Create(ctx, fmt.Sprintf("raw-compaction/%d", ri), all); err != nil {
			tb.Fatal(err)
		}
		ri++
		return len(all)
	}
	benchratio.Compare(b, silt, raw)
	b.ReportMetric(objects[0], "entries-after")
}

// BenchmarkGC_Ratio: gc of 1,000 orphan segments on MinIO (the state read,
// the segments listed a page at a time, the orphans deleted 16 at once)
// against raw deletes of as many objects, one at a time (/serial: the
// obvious loop, as gc once deleted) and 16 at once
// (/parallel: the store's own pace). Each round's objects are created
// outside the timing. No goal is set: the first gc of an archive that
// never had one deletes a segment per compacted commit.
//
//	go test -run '^$' -bench GC_Ratio -benchtime 5x ./pkg/graft
func BenchmarkGC_Ratio(b *testing.B) {
	st := s3Store(b, "minio")
	ctx := context.Background()
	v, err := graft.Open(ctx, b.TempDir(), "vol", st)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := v.Commit(ctx, []graft.Page{{No: 1, Data: []byte("live")}}, nil); err != nil {
		b.Fatal(err)
	}
	const n = 1000
	round := 0
	// plant creates n objects under prefix, 16 at once; segment keys of
	// commit 1, written long ago by writers that lost.
	plant := func(tb testing.TB, prefix string) []string {
		round++
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("%s%020d-%013d-lost%d-%d", prefix, 1, 1000, round, i)
		}
		if err := inParallel(keys, func(k string) error { return st.Create(ctx, k, []byte("orphan")) }); err != nil {
			tb.Fatal(err)
		}
		return keys
	}
	silt := func(tb testing.TB) int {
		benchratio.Untimed(func() { plant(tb, "vol/segments/") })
		if deleted, err := v.GC(ctx, 0, true); err != nil || deleted < n {
			tb.Fatalf("gc deleted %d, %v; want %d", deleted, err, n)
		}
		return n
	}
	for _, raw := range []struct {
		name string
		at   int
	}{{"serial", 1}, {"parallel", 16}} {
		b.Run(raw.name, func(b *testing.B) {
			benchratio.Compare(b, silt, func(tb testing.TB) int {
				var keys []string
				benchratio.Untimed(func() { keys = plant(tb, "raw/") })
				del := func(k string) error { return st.Delete(ctx, k) }
				if raw.at == 1 {
					for _, k := range keys {
						if err := del(k); err != nil {
							tb.Fatal(err)
						}
					}
				} else if err := inParallel(keys, del); err != nil {
					tb.Fatal(err)
				}
				return n
			})
		})
	}
}

// inParallel calls fn for every key, 16 at once, and returns the first error.
func inParallel(keys []string, fn func(string) error) error {
	var g errgroup.Group
	g.SetLimit(16)
	for _, k := range keys {
		g.Go(func() error { return fn(k) })
	}
	return g.Wait()
}

// lagged adds a fixed delay to every GET (and counts them): a store across
// a network, where a walk that waits on one GET at a time pays the delay
// once per object.
type lagged struct {
	fence.Store
	lag  time.Duration
	gets *atomic.Int64
}

func (l lagged) Get(ctx context.Context, k string, r fence.Range) ([]byte, error) {
	l.gets.Add(1)
	time.Sleep(l.lag)
	return l.Store.Get(ctx, k, r)
}

// getLag is SILT_BENCH_GET_LAG (a duration, default none).
func getLag(tb testing.TB) time.Duration {
	s := os.Getenv("SILT_BENCH_GET_LAG")
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		tb.Fatalf("SILT_BENCH_GET_LAG: %v", err)
	}
	return d
}

// BenchmarkWalk_Ratio: a cold reader walking 1,000 entries with their
// segments (one 4 KiB page each) from MinIO through Volume.Walk, which
// fetches ahead, ÷ the same walk one segment at a time (Entries, then
// Segment for each: how the merged read once went).
// No goal is set. SILT_BENCH_GET_LAG=20ms adds that much to every GET.
//
//	go test -run '^$' -bench Walk_Ratio -benchtime 5x ./pkg/graft
func BenchmarkWalk_Ratio(b *testing.B) {
	st := s3Store(b, "minio")
	ctx := context.Background()
	w, err := graft.OpenWith(ctx, b.TempDir(), "vol", st, graft.Options{})
	if err != nil {
		b.Fatal(err)
	}
	const n = 1000
	for c := range n {
		if _, err := w.Commit(ctx, []graft.Page{{No: uint64(c), Data: bytes.Repeat([]byte{byte(c)}, 4096)}}, nil); err != nil {
			b.Fatal(err)
		}
	}
	lag := getLag(b)
	cold := func(tb testing.TB) (r *graft.Volume) {
		benchratio.Untimed(func() {
			var err error
			if r, err = graft.OpenWith(ctx, tb.TempDir(), "vol", lagged{st, lag, new(atomic.Int64)}, graft.Options{}); err != nil {
				tb.Fatal(err)
			}
		})
		return r
	}
	benchratio.Compare(b, func(tb testing.TB) int {
		r, seen := cold(tb), 0
		for e, err := range r.Walk(ctx, nil) {
			if err != nil || e.Segment == nil {
				tb.Fatal(err)
			}
			seen++
		}
		return seen
	}, func(tb testing.TB) int {
		r, seen := cold(tb), 0
		for c, err := range r.Entries(ctx, nil) {
			if err != nil {
				tb.Fatal(err)
			}
			if _, err := r.Segment(ctx, c); err != nil {
				tb.Fatal(err)
			}
			seen++
		}
		return seen
	})
}

// BenchmarkDeepWalks times the walks of a whole chain on MinIO, a fresh
// reader each: verify, pull, and a cold open of a chain with no checkpoint
// (1,000 commits of one 4 KiB page), and counts the GETs of reading a
// large remote segment (17 MB, 16,384 pages of 1 KiB) in order. No goal is
// set. SILT_BENCH_GET_LAG=20ms adds that much to every GET.
//
//	go test -run '^$' -bench DeepWalks -benchtime 3x ./pkg/graft
func BenchmarkDeepWalks(b *testing.B) {
	st := s3Store(b, "minio")
	ctx := context.Background()
	w, err := graft.OpenWith(ctx, b.TempDir(), "vol", st, graft.Options{CheckpointEvery: -1})
	if err != nil {
		b.Fatal(err)
	}
	for c := range 1000 {
		if _, err := w.Commit(ctx, []graft.Page{{No: uint64(c), Data: bytes.Repeat([]byte{byte(c)}, 4096)}}, nil); err != nil {
			b.Fatal(err)
		}
	}
	big, err := graft.OpenWith(ctx, b.TempDir(), "big", st, graft.Options{})
	if err != nil {
		b.Fatal(err)
	}
	pages := make([]graft.Page, 16384)
	for i := range pages {
		pages[i] = graft.Page{No: uint64(i), Data: bytes.Repeat([]byte{byte(i)}, 1024)}
	}
	large, err := big.Commit(ctx, pages, nil)
	if err != nil {
		b.Fatal(err)
	}
	lag, gets := getLag(b), new(atomic.Int64)
	store := lagged{st, lag, gets}
	var verify, pull, chain, walkGets []float64
	secs := func(t0 time.Time) float64 { return time.Since(t0).Seconds() }
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		r, err := graft.OpenWith(ctx, b.TempDir(), "vol", store, graft.Options{CheckpointEvery: -1})
		if err != nil || r.Head() != 1000 {
			b.Fatalf("cold open: %v", err)
		}
		chain = append(chain, secs(t0))
		t0 = time.Now()
		if _, err := r.VerifyRemote(ctx); err != nil {
			b.Fatal(err)
		}
		verify = append(verify, secs(t0))
		t0 = time.Now()
		if _, err := r.Pull(ctx); err != nil {
			b.Fatal(err)
		}
		pull = append(pull, secs(t0))
		lr, err := graft.OpenWith(ctx, b.TempDir(), "big", store, graft.Options{})
		if err != nil {
			b.Fatal(err)
		}
		lr.CacheWholeBelow = 1 << 20
		gets.Store(0)
		seg, err := lr.Segment(ctx, large)
		if err != nil {
			b.Fatal(err)
		}
		for _, pg := range pages {
			if _, err := seg.Lookup(pg.No); err != nil {
				b.Fatal(err)
			}
		}
		walkGets = append(walkGets, float64(gets.Load()))
	}
	reportMedians(b, map[string][]float64{"cold-chain-s": chain, "verify-s": verify, "pull-s": pull, "large-walk-gets": walkGets})
}

// reportMedians reports the median of each series under its name (the
// testing package prints extra metrics sorted by name).
func reportMedians(b *testing.B, series map[string][]float64) {
	for name, v := range series {
		slices.Sort(v)
		b.ReportMetric(v[len(v)/2], name)
	}
}
