package graft_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

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
	n := 0
	silt := func(tb testing.TB) int {
		if _, err := v.Commit(ctx, pages, nil); err != nil {
			tb.Fatal(err)
		}
		return len(seg)
	}
	raw := func(tb testing.TB) int {
		n++
		if err := st.Create(ctx, fmt.Sprintf("raw/%d", n), seg); err != nil {
			tb.Fatal(err)
		}
		return len(seg)
	}
	benchratio.Compare(b, silt, raw)
	var _ fence.Store = st
}
