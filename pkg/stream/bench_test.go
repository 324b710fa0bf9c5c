package stream_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/benchratio"
	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// BenchmarkAppendBatch_Ratio compares Log.AppendBatch (minted ids, atomic
// chunks of 500) with a raw go-redis pipeline of XADD * carrying the same
// payloads (an id field included) in batches of 500. Goal: ratio >= 0.8.
//
//	go test -run '^$' -bench AppendBatch_Ratio -benchtime 7x ./pkg/stream
func BenchmarkAppendBatch_Ratio(b *testing.B) {
	const entries, batch = 20000, 500
	rdb := testserver.Redis(b).Client(b)
	ctx := context.Background()
	ks, _ := stream.NewKeyspace("", "bench")
	payloads := make([]stream.Fields, entries)
	for i := range payloads {
		payloads[i] = stream.Fields{"user": fmt.Sprintf("u%06d", i), "action": "login", "amount": fmt.Sprint(i % 1000)}
	}
	round := 0
	silt := func(tb testing.TB) int {
		round++
		l, _ := stream.NewLog(rdb, ks, fmt.Sprintf("silt%d", round), brand.EVT)
		l.BatchSize = batch
		if _, err := l.AppendBatch(ctx, payloads); err != nil {
			tb.Fatal(err)
		}
		return entries
	}
	// pipelined appends the payloads with XADD * in batches, each batch in
	// one pipeline that newPipe makes.
	pipelined := func(name string, newPipe func() redis.Pipeliner) benchratio.Round {
		return func(tb testing.TB) int {
			round++
			key := ks.Stream(fmt.Sprintf("%s%d", name, round))
			id := brand.MustParse("EVT_01M8R1E8M50000000000000").String()
			for start := 0; start < entries; start += batch {
				pipe := newPipe()
				for _, p := range payloads[start : start+batch] {
					vals := []string{"id", id}
					for k, v := range p {
						vals = append(vals, k, v)
					}
					pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: "*", Values: vals})
				}
				if _, err := pipe.Exec(ctx); err != nil {
					tb.Fatal(err)
				}
			}
			return entries
		}
	}
	raw := pipelined("raw", rdb.Pipeline)
	// The ceiling of any atomic chunk: the same raw pipeline inside
	// MULTI/EXEC. Redis queues every command of a transaction before it runs
	// them, and that server time is what an all-or-nothing chunk costs.
	multi := pipelined("multi", rdb.TxPipeline)
	b.Run("silt", func(b *testing.B) { benchratio.Compare(b, silt, raw) })
	b.Run("multi-ceiling", func(b *testing.B) { benchratio.Compare(b, multi, raw) })
}
