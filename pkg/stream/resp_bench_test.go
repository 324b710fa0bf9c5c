package stream

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/benchratio"
	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
)

// BenchmarkStreamReply reads an XRANGE of 1,000 entries of four fields
// four ways, with their allocations: from the reply's bytes (resp.go,
// what ReadFlat and the worker's reads do), the same read off a
// connection of silt's own (FlatReader, an archive run's folds), from go-redis's decoded tree
// (Do, the path after an error reply) and with go-redis's XRangeN (a map
// per entry), with this process's CPU per read (cpu-us/op): the round
// trip is most of each op's wall time. With GOMAXPROCS=1 the CPU figure
// is free of the scheduler's spinning on a busy machine.
//
//	GOMAXPROCS=1 go test -run '^$' -bench StreamReply -benchmem -benchtime 500x -count 4 ./pkg/stream
func BenchmarkStreamReply(b *testing.B) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: testserver.Redis(b).Addr})
	defer rdb.Close()
	for i := range 1000 {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: "k", Values: []any{"id", fmt.Sprintf("EVT_%020d", i), "user", fmt.Sprintf("u%06d", i), "action", "login", "amount", fmt.Sprint(i % 1000)}})
	}
	args := []any{"XRANGE", "k", "-", "+", "COUNT", 1000}
	check := func(b *testing.B, n int, err error) {
		if n != 1000 || err != nil {
			b.Fatalf("read %d, %v", n, err)
		}
	}
	b.Run("bytes", func(b *testing.B) {
		defer cpuPerOp(b)()
		for range b.N {
			rr := sendRaw(ctx, rdb, 0, args...)
			r, _ := rr.reply()
			err := rr.cmd.Err()
			if err == nil {
				var e []FlatEntry
				e, err = r.flat("k")
				check(b, len(e), err)
			}
		}
	})
	b.Run("own", func(b *testing.B) {
		l := &Log{rdb: rdb, key: "k"}
		fr := l.FlatReader()
		defer fr.Close()
		last := brand.StreamID{MS: 1 << 50}
		for range 2 { // the second dials
			if e, err := fr.Read(ctx, brand.StreamID{}, last, 1000); len(e) != 1000 || err != nil {
				b.Fatalf("read %d, %v", len(e), err)
			}
		}
		if fr.own.conn == nil {
			b.Fatal("no connection of its own")
		}
		defer cpuPerOp(b)()
		for range b.N {
			e, err := fr.Read(ctx, brand.StreamID{}, last, 1000)
			check(b, len(e), err)
		}
		if fr.own.conn == nil {
			b.Fatal("the reads fell back to go-redis")
		}
	})
	b.Run("tree", func(b *testing.B) {
		defer cpuPerOp(b)()
		for range b.N {
			reply, err := rdb.Do(ctx, args...).Slice()
			if err == nil {
				var e []FlatEntry
				e, err = (&Log{key: "k"}).flatEntries(reply)
				check(b, len(e), err)
			}
		}
	})
	b.Run("go-redis", func(b *testing.B) {
		defer cpuPerOp(b)()
		for range b.N {
			m, err := rdb.XRangeN(ctx, "k", "-", "+", 1000).Result()
			check(b, len(m), err)
		}
	})
}

// cpuPerOp starts counting this process's CPU; the function it returns
// reports it per op as cpu-us/op.
func cpuPerOp(b *testing.B) func() {
	c0 := benchratio.ProcessCPU()
	return func() { b.ReportMetric(float64((benchratio.ProcessCPU()-c0).Microseconds())/float64(b.N), "cpu-us/op") }
}
