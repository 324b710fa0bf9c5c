package graft_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/graft"
)

// A volume of pages replicated to a local-directory store: commit pages,
// read them back, and open the same volume cold from the store alone, as
// a reader on another machine would.
func Example() {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "graft-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	store, err := fence.OpenLocal(filepath.Join(tmp, "remote"))
	if err != nil {
		log.Fatal(err)
	}
	v, err := graft.Open(ctx, filepath.Join(tmp, "data"), "orders", store)
	if err != nil {
		log.Fatal(err)
	}
	for i := uint64(1); i <= 40; i++ { // a checkpoint every 16 commits
		page := graft.Page{No: i, Data: fmt.Appendf(nil, "order %d", i)}
		if _, err := v.Commit(ctx, []graft.Page{page}, map[string]string{"last": fmt.Sprint(i)}); err != nil {
			log.Fatal(err)
		}
	}
	b, _ := v.Read(ctx, 7)
	fmt.Printf("head %d, page 7: %s\n", v.Head(), b)

	cold, err := graft.Open(ctx, filepath.Join(tmp, "elsewhere"), "orders", store)
	if err != nil {
		log.Fatal(err)
	}
	b, _ = cold.Read(ctx, 40)
	fmt.Printf("cold: head %d, page 40: %s, latest meta %s\n", cold.Head(), b, cold.Latest().Meta["last"])
	// Output:
	// head 40, page 7: order 7
	// cold: head 40, page 40: order 40, latest meta 40
}

// Compaction merges runs of small segments into one; every page stays
// readable and the live segments shrink.
func ExampleVolume_Compact() {
	ctx := context.Background()
	tmp, _ := os.MkdirTemp("", "graft-example")
	defer os.RemoveAll(tmp)
	store, _ := fence.OpenLocal(filepath.Join(tmp, "remote"))
	v, _ := graft.Open(ctx, filepath.Join(tmp, "data"), "events", store)
	for i := uint64(1); i <= 100; i++ {
		v.Commit(ctx, []graft.Page{{No: i, Data: fmt.Appendf(nil, "event %d", i)}}, nil)
	}
	fmt.Println("segments before:", v.Stats().Entries)
	res, err := v.Compact(ctx, graft.CompactOptions{MinEntries: 50})
	if err != nil {
		log.Fatal(err)
	}
	b, _ := v.Read(ctx, 73)
	fmt.Printf("merged %d into %d; segments after: %d; page 73: %s\n", res.Merged, res.Segments, v.Stats().Entries, b)
	// Output:
	// segments before: 100
	// merged 100 into 2; segments after: 2; page 73: event 73
}
