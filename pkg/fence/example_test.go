package fence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/silt-dev/silt/pkg/fence"
)

// The create-only fence: the first create of a key wins, a second one gets
// ErrExists, whoever makes it. Commits rely on this to give every LSN one
// writer.
func ExampleStore() {
	dir, _ := os.MkdirTemp("", "fence-example")
	defer os.RemoveAll(dir)
	var st fence.Store
	st, err := fence.OpenLocal(dir)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	fmt.Println(st.Create(ctx, "vol/commits/1", []byte("mine")))
	err = st.Create(ctx, "vol/commits/1", []byte("theirs"))
	fmt.Println(errors.Is(err, fence.ErrExists))
	b, _ := st.Get(ctx, "vol/commits/1", fence.Range{})
	keys, _ := st.List(ctx, "vol/", "", 0)
	fmt.Printf("%s %v\n", b, keys)
	// Output:
	// <nil>
	// true
	// mine [vol/commits/1]
}
