package stream_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// redisAddr is the redis-server the examples use, started for this test
// binary (a program has its own).
var redisAddr string

func TestMain(m *testing.M) { os.Exit(testserver.RunWithRedis(m, &redisAddr)) }

// Append entries with branded ids and read them back in mint order. The
// branded id and the stream id name the same instant and sequence.
func ExampleLog() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ks, err := stream.NewKeyspace("", "example-log") // keys emq:{example-log}:...
	if err != nil {
		log.Fatal(err)
	}
	orders, err := stream.NewLog(rdb, ks, "orders", brand.EVT)
	if err != nil {
		log.Fatal(err)
	}
	first, err := orders.Append(ctx, stream.Fields{"order": "A-1", "amount": "12"})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := orders.AppendBatch(ctx, []stream.Fields{{"order": "A-2"}, {"order": "A-3"}}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(first.Kind) // EVT_ followed by the instant and sequence of its stream id
	for e, err := range orders.Read(ctx, stream.First, stream.Last) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(e.Fields["order"], e.ID.StreamID == e.StreamID)
	}
	// Output:
	// EVT
	// A-1 true
	// A-2 true
	// A-3 true
}

// A short-lived worker: drain what this consumer left pending, reclaim
// what dead peers left, handle new entries, ack each success and stop when
// the stream holds nothing more. A handler error leaves the entry pending
// for the next run; handlers dedupe by the branded id (at-least-once).
func ExampleConsumer() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ks, _ := stream.NewKeyspace("", "example-consumer")
	jobs, _ := stream.NewLog(rdb, ks, "jobs", brand.EVT)
	for _, n := range []string{"1", "2", "3"} {
		if _, err := jobs.Append(ctx, stream.Fields{"n": n}); err != nil {
			log.Fatal(err)
		}
	}
	c, err := stream.NewConsumer(jobs, "billing", "worker-1")
	if err != nil {
		log.Fatal(err)
	}
	c.Block = 100 * time.Millisecond // wait this long for more before exiting
	seen := map[brand.ID]bool{}      // a real handler dedupes in its own store
	sum, err := c.Run(ctx, func(ctx context.Context, d stream.Delivery) error {
		if seen[d.ID] {
			return nil
		}
		if d.Fields["n"] == "2" && d.Attempts == 1 {
			return fmt.Errorf("payment service unavailable") // left pending, retried next run
		}
		seen[d.ID] = true
		fmt.Println("handled", d.Fields["n"])
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("acked %d, failed %d, exit %s\n", sum.Acked, sum.Failed, sum.ExitReason)
	sum, _ = c.Run(ctx, func(ctx context.Context, d stream.Delivery) error {
		fmt.Println("retried", d.Fields["n"], "attempt", d.Attempts)
		return nil
	})
	fmt.Printf("acked %d, failed %d\n", sum.Acked, sum.Failed)
	// Output:
	// handled 1
	// handled 3
	// acked 2, failed 1, exit idle
	// retried 2 attempt 2
	// acked 1, failed 0
}
