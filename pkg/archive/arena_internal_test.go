package archive

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/stream"
)

// TestRun_FoldsReuseCreatedSlicesBlocks: a run hands the arena blocks of
// each created slice on to the fold after next, which cuts its pages from
// them: of six slices' blocks, the first two slices' are made new, the
// rest reused (fewer than half made new). Every entry still reads back from the archive as it was
// appended: a block handed on before its slice was created would tear that
// slice's records (each create waits a little first, so the fold ahead
// would write into such a block before the create copies it). The run
// keeps no block once its slices are done.
func TestRun_FoldsReuseCreatedSlicesBlocks(t *testing.T) {
	ctx := context.Background()
	rdb := testserver.Redis(t).Client(t)
	ks, _ := stream.NewKeyspace("", "arena")
	l, err := stream.NewLog(rdb, ks, "events", brand.EVT)
	if err != nil {
		t.Fatal(err)
	}
	var appended []stream.Fields
	add := func(n int) {
		batch := make([]stream.Fields, n)
		for i := range batch {
			k := len(appended) + i
			batch[i] = stream.Fields{"n": fmt.Sprint(k), "pad": strings.Repeat(string(rune('a'+k%26)), k%300)}
		}
		if _, err := l.AppendBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
		appended = append(appended, batch...)
	}
	add(6000)
	st, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, err := Open(ctx, l, t.TempDir(), st)
	if err != nil {
		t.Fatal(err)
	}
	a.SliceEntries = 1000
	a.Failpoint = func(step failpoint.Name) {
		if step == failpoint.AfterFold { // the fold ahead has time to write into any block it was handed
			time.Sleep(20 * time.Millisecond)
		}
	}
	res, err := a.Run(ctx, Policy{KeepLast: 1}, nil)
	if err != nil || res.Archived != 5999 || res.Commits != 6 {
		t.Fatalf("run: %+v, %v", res, err)
	}
	if got, made := a.arenas.got, a.arenas.made; got < 6 || made*2 >= got {
		t.Fatalf("the run's folds took %d blocks and made %d of them new, want fewer than half made new", got, made)
	}
	if n := len(a.arenas.free); n != 0 {
		t.Fatalf("the run keeps %d blocks after its slices", n)
	}
	i := 0
	for it, err := range a.Read(ctx, stream.First, stream.Last) {
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(it.Fields, appended[i]) {
			t.Fatalf("entry %d (%s) reads back as %q, appended as %q", i, it.Source, it.Fields, appended[i])
		}
		i++
	}
	if i != len(appended) {
		t.Fatalf("read back %d entries, appended %d", i, len(appended))
	}
}
