package stream_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// The jobs of a batch are built in the array of the batch before: what a
// handler keeps of its delivery stays as it was handed over.
func TestConsumer_DeliveriesKeptAcrossBatches(t *testing.T) {
	srv := testserver.Redis(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	l := killLog(t, rdb)
	want := map[brand.ID]string{}
	for i := range 95 {
		v := fmt.Sprint("payload-", i)
		id, err := l.Append(ctx, stream.Fields{"n": v})
		if err != nil {
			t.Fatal(err)
		}
		want[id] = v
	}
	c, _ := stream.NewConsumer(l, "g", "w1")
	c.Count, c.Block, c.Concurrency = 10, time.Millisecond, 4
	var mu sync.Mutex
	var kept []stream.Delivery
	if _, err := c.Run(ctx, func(_ context.Context, d stream.Delivery) error {
		mu.Lock()
		kept = append(kept, d)
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(kept) != len(want) {
		t.Fatalf("handled %d, want %d", len(kept), len(want))
	}
	for _, d := range kept {
		if v, ok := want[d.ID]; !ok || d.Fields["n"] != v || len(d.Fields) != 1 || d.StreamID != d.ID.StreamID || d.Attempts != 1 || d.Group != "g" {
			t.Fatalf("a kept delivery changed after its batch: %+v, want payload %q", d, v)
		}
		delete(want, d.ID)
	}
}
