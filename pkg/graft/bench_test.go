package graft_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/benchratio"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/graft"
)

// BenchmarkUpload_Ratio compares a 4 MiB commit to MinIO (segment written
// and fsynced locally, uploaded create-only, commit object created) with a
// raw create of the same bytes. Goal: ratio >= 0.7. Needs MinIO from
// scripts/servers.sh.
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
	v.Failpoint = func(step string) {
		ms := float64(time.Since(t0)) / float64(time.Millisecond)
		switch step {
		case "segment-uploaded":
			segment = append(segment, ms)
		case "commit-put":
			commitPut = append(commitPut, ms-segment[len(segment)-1])
		case "head-updated":
			rest = append(rest, ms-segment[len(segment)-1]-commitPut[len(commitPut)-1])
		}
	}
	n := 0
	silt := func(tb testing.TB) int {
		t0 = time.Now()
		if _, err := v.Commit(ctx, pages, nil); err != nil {
			tb.Fatal(err)
		}
		return len(seg)
	}
	raw := func(tb testing.TB) int {
		n++
		r0 := time.Now()
		if err := st.Create(ctx, fmt.Sprintf("raw/%d", n), seg); err != nil {
			tb.Fatal(err)
		}
		rawTime = append(rawTime, float64(time.Since(r0))/float64(time.Millisecond))
		return len(seg)
	}
	benchratio.Compare(b, silt, raw)
	for _, m := range []struct {
		name string
		v    []float64
	}{{"segment-ms", segment}, {"commit-put-ms", commitPut}, {"local-head-ms", rest}, {"raw-create-ms", rawTime}} {
		slices.Sort(m.v)
		b.ReportMetric(m.v[len(m.v)/2], m.name)
	}
	var _ fence.Store = st
}
