package export_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/export"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/stream"
)

// redisAddr is the redis-server the examples use, started for this test
// binary (a program has its own).
var redisAddr string

func TestMain(m *testing.M) { os.Exit(testserver.RunWithRedis(m, &redisAddr)) }

// Export a stream's merged history as files under Hive-style partitions,
// then run again: the second run finds the manifest of the first and
// exports only what is new.
func ExampleExporter() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ks, _ := stream.NewKeyspace("", "example-export")
	events, _ := stream.NewLog(rdb, ks, "events", brand.EVT)
	at := time.Date(2026, 11, 30, 9, 59, 0, 0, time.UTC) // entries of a past hour, for a fixed output
	appendAt := func(t time.Time, n string) {
		id, _ := brand.New(brand.EVT, brand.StreamID{MS: uint64(t.UnixMilli()), Seq: 0})
		if err := events.AppendID(ctx, id, stream.Fields{"n": n}); err != nil {
			log.Fatal(err)
		}
	}
	appendAt(at, "1")
	appendAt(at.Add(time.Minute), "2") // the next hour: another partition

	dir, _ := os.MkdirTemp("", "export-example")
	defer os.RemoveAll(dir)
	remote, _ := fence.OpenLocal(filepath.Join(dir, "remote"))
	a, err := archive.Open(ctx, events, filepath.Join(dir, "data"), remote)
	if err != nil {
		log.Fatal(err)
	}
	target, _ := fence.OpenLocal(filepath.Join(dir, "export")) // or an s3.Store
	x, err := export.New(a, target, export.Options{Format: export.JSONL})
	if err != nil {
		log.Fatal(err)
	}
	res, err := x.Run(ctx, stream.First, stream.Last)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("rows", res.Rows, "files", res.Files)
	files, _ := target.List(ctx, "stream=", "", 0)
	for _, f := range files {
		fmt.Println(f)
	}

	appendAt(at.Add(2*time.Minute), "3")
	res, _ = x.Run(ctx, stream.First, stream.Last)
	fmt.Println("rows", res.Rows, "files", res.Files)
	// Output:
	// rows 2 files 2
	// stream=events/date=2026-11-30/hour=09/1796032740000-0_1796032740000-0.jsonl
	// stream=events/date=2026-11-30/hour=10/1796032800000-0_1796032800000-0.jsonl
	// rows 1 files 1
}
