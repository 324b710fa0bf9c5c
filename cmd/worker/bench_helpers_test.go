package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// benchStream is the setup the worker benchmarks share: a redis-server of
// their own holding a stream of n order-like entries (extra fields added to
// each), the ids appended, and a function that creates a new consumer group
// at the start of the stream for each round.
func benchStream(b *testing.B, n int, extra stream.Fields) (*redis.Client, *stream.Log, []brand.ID, []stream.Fields, func(testing.TB) string) {
	b.Helper()
	rdb := testserver.Redis(b).Client(b)
	ctx := context.Background()
	ks, _ := stream.NewKeyspace("", "bench")
	l, _ := stream.NewLog(rdb, ks, "events", brand.EVT)
	batch := make([]stream.Fields, n)
	for i := range batch {
		batch[i] = stream.Fields{"user": fmt.Sprintf("u%06d", i), "action": "login", "amount": fmt.Sprint(i % 1000)}
		for k, v := range extra {
			batch[i][k] = v
		}
	}
	ids, err := l.AppendBatch(ctx, batch)
	if err != nil {
		b.Fatal(err)
	}
	round := 0
	newGroup := func(tb testing.TB) string {
		round++
		g := fmt.Sprintf("g%d", round)
		if err := rdb.XGroupCreate(ctx, l.Key(), g, "0").Err(); err != nil {
			tb.Fatal(err)
		}
		return g
	}
	return rdb, l, ids, batch, newGroup
}
