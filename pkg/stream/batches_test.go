package stream_test

import (
	"context"
	"fmt"
	"strings"
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

// With Count 0 reads grow while batches are handled quickly, but not past
// about 4 MiB of payload: after a batch of a hundred 25 KiB entries, the
// next read asks for no more.
func TestConsumer_AdaptiveReadsBoundedByBytes(t *testing.T) {
	srv := testserver.Redis(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		entries, size int
		grows         bool
	}{{"small entries", 1000, 10, true}, {"25 KiB entries", 400, 25 << 10, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ks, _ := stream.NewKeyspace("", "adapt"+fmt.Sprint(tc.size))
			l, err := stream.NewLog(rdb, ks, "events", brand.EVT)
			if err != nil {
				t.Fatal(err)
			}
			batch := make([]stream.Fields, tc.entries)
			for i := range batch {
				batch[i] = stream.Fields{"p": strings.Repeat("x", tc.size)}
			}
			if _, err := l.AppendBatch(ctx, batch); err != nil {
				t.Fatal(err)
			}
			c, _ := stream.NewConsumer(l, "g", "w1")
			c.Block = time.Millisecond
			largest := 0
			c.Progress = func(_ stream.Summary, n int) { largest = max(largest, n) }
			if sum, err := c.Run(ctx, func(context.Context, stream.Delivery) error { return nil }); err != nil || sum.Acked != int64(tc.entries) {
				t.Fatalf("run: %+v %v", sum, err)
			}
			// The read ahead of the second batch is sent before the first is
			// handled: a grown read is the third.
			if grew := largest > 100; grew != tc.grows {
				t.Fatalf("largest batch %d: grew %v, want %v", largest, grew, tc.grows)
			}
		})
	}
}
