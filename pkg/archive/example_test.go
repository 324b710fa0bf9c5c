package archive_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/stream"
)

// redisAddr is the redis-server the examples use, started for this test
// binary (a program has its own).
var redisAddr string

func TestMain(m *testing.M) { os.Exit(testserver.RunWithRedis(m, &redisAddr)) }

// Archive all but the newest two entries of a stream (committed behind the
// create-only fence, then trimmed from Redis), and read the whole history
// back: the archive and the live tail merged at the watermark, each entry
// once, in mint order.
func ExampleArchive() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ks, _ := stream.NewKeyspace("", "example-archive")
	events, _ := stream.NewLog(rdb, ks, "events", brand.EVT)
	for _, n := range []string{"1", "2", "3", "4", "5"} {
		if _, err := events.Append(ctx, stream.Fields{"n": n}); err != nil {
			log.Fatal(err)
		}
	}

	dir, _ := os.MkdirTemp("", "archive-example")
	defer os.RemoveAll(dir)
	// The remote: a local directory here; an s3.Store (package fence/s3)
	// in production.
	remote, err := fence.OpenLocal(filepath.Join(dir, "remote"))
	if err != nil {
		log.Fatal(err)
	}
	a, err := archive.Open(ctx, events, filepath.Join(dir, "data"), remote)
	if err != nil {
		log.Fatal(err)
	}
	a.Exact = true // trim exactly to the watermark (the default, XTRIM ~, trims whole nodes only)
	res, err := a.Run(ctx, archive.Policy{KeepLast: 2}, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("archived %d, trimmed %d, live %d\n", res.Archived, res.Trimmed, rdb.XLen(ctx, events.Key()).Val())

	for item, err := range a.Read(ctx, stream.First, stream.Last) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(item.Fields["n"], item.Source)
	}
	// Output:
	// archived 3, trimmed 3, live 2
	// 1 archive
	// 2 archive
	// 3 archive
	// 4 live
	// 5 live
}
