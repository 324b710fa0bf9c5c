package fence_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
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

// A large object created from a file on disk: the store streams it (S3),
// copies it (a local directory) or seals it chunk by chunk (Encrypted),
// never holding it in memory whole. The size and SHA-256 are the caller's,
// computed as it wrote the file.
func ExampleCreateFromFile() {
	dir, _ := os.MkdirTemp("", "fence-example")
	defer os.RemoveAll(dir)
	st, err := fence.OpenLocal(dir + "/remote")
	if err != nil {
		log.Fatal(err)
	}
	body := bytes.Repeat([]byte("page "), 1<<20) // 5 MiB
	path := dir + "/segment"
	if err := os.WriteFile(path, body, 0o644); err != nil {
		log.Fatal(err)
	}
	sum := sha256.Sum256(body)
	ctx := context.Background()
	err = fence.CreateFromFile(ctx, st, "vol/segments/1", path, int64(len(body)), hex.EncodeToString(sum[:]))
	fmt.Println(err)
	got, _ := st.Get(ctx, "vol/segments/1", fence.Range{Off: 5<<20 - 5})
	fmt.Printf("%q\n", got)
	// Output:
	// <nil>
	// "page "
}
