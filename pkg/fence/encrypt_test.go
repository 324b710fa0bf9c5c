package fence_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/fence/fencetest"
)

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func encryptedLocal(t *testing.T, dir string, key []byte) *fence.Encrypted {
	t.Helper()
	st, err := fence.OpenLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := fence.Encrypt(st, key)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// The encrypting wrapper keeps the Store contract on a local directory (and
// on MinIO: TestEncrypted_ConformanceMinIO in package s3).
func TestEncrypted_Conformance(t *testing.T) {
	fencetest.Run(t, func(t *testing.T) fence.Store { return encryptedLocal(t, t.TempDir(), testKey(1)) })
}

// No plaintext byte reaches the store, every range reads back right across
// chunk boundaries, and a wrong or missing key is named.
func TestEncrypted_RangesKeysAndNoPlaintext(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	e := encryptedLocal(t, dir, testKey(7))
	body := []byte(strings.Repeat("PLAINTEXT-canary-page ", 20000)) // 440 kB: seven chunks
	if err := e.Create(ctx, "segments/1", body); err != nil {
		t.Fatal(err)
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if raw, _ := os.ReadFile(p); bytes.Contains(raw, []byte("PLAINTEXT")) {
				t.Errorf("%s holds plaintext", p)
			}
		}
		return nil
	})
	for _, r := range []fence.Range{{}, {Off: 0, Len: 10}, {Off: 65530, Len: 20}, {Off: 65536, Len: 65536}, {Off: 100, Len: 300000},
		{Off: int64(len(body)) - 5, Len: 5}, {Off: 400000}} {
		got, err := e.Get(ctx, "segments/1", r)
		want := body[r.Off:]
		if r.Len > 0 {
			want = want[:r.Len]
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("Get %+v: %d bytes, %v; want %d bytes", r, len(got), err, len(want))
		}
	}
	other := encryptedLocal(t, dir, testKey(8))
	for _, r := range []fence.Range{{}, {Off: 70000, Len: 10}} {
		if _, err := other.Get(ctx, "segments/1", r); !errors.Is(err, fence.ErrKey) || !strings.Contains(err.Error(), "written with key") {
			t.Fatalf("a wrong key, range %+v: %v", r, err)
		}
	}
	plain, _ := fence.OpenLocal(dir)
	plain.Create(ctx, "commits/1", []byte("not encrypted"))
	if _, err := e.Get(ctx, "commits/1", fence.Range{}); !errors.Is(err, fence.ErrKey) || !strings.Contains(err.Error(), "not encrypted") {
		t.Fatalf("a plaintext object read with a key: %v", err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "segments", "1"))
	raw[1000] ^= 0xff
	os.WriteFile(filepath.Join(dir, "segments", "1"), raw, 0o644)
	if _, err := e.Get(ctx, "segments/1", fence.Range{Off: 500, Len: 10}); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("a flipped byte: %v", err)
	}
	if _, err := fence.Encrypt(plain, []byte("short")); !errors.Is(err, fence.ErrKey) {
		t.Fatalf("a short key: %v", err)
	}
}

// An object created from a file is sealed chunk by chunk on its way (no
// plaintext reaches the store, no temp file stays beside the source) and
// reads back whole and by range, at every size around a chunk's edge.
func TestEncrypted_CreateFromFileStreams(t *testing.T) {
	ctx := context.Background()
	dir, src := t.TempDir(), t.TempDir()
	e := encryptedLocal(t, dir, testKey(9))
	const chunk = 64 << 10
	for _, n := range []int{0, 1, chunk - 1, chunk, chunk + 1, 3*chunk + 5} {
		body := bytes.Repeat([]byte("PLAINTEXT-canary "), n/17+1)[:n]
		path := filepath.Join(src, "segment")
		if err := os.WriteFile(path, body, 0o644); err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("segments/%d", n)
		if err := fence.CreateFromFile(ctx, e, key, path, int64(n), ""); err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if got, err := e.Get(ctx, key, fence.Range{}); err != nil || !bytes.Equal(got, body) {
			t.Fatalf("%d bytes: read back %d bytes, %v", n, len(got), err)
		}
		if n >= chunk+3 {
			if got, err := e.Get(ctx, key, fence.Range{Off: chunk - 3, Len: 6}); err != nil || !bytes.Equal(got, body[chunk-3:chunk+3]) {
				t.Fatalf("%d bytes: the range across the first chunk's edge = %q, %v", n, got, err)
			}
		}
		raw, err := os.ReadFile(filepath.Join(dir, "segments", fmt.Sprint(n)))
		if want := 20 + n + (n+chunk-1)/chunk*28; err != nil || len(raw) != want || n > 0 && bytes.Contains(raw, []byte("PLAINTEXT")) {
			t.Fatalf("%d bytes: stored object of %d bytes (want %d), %v, or it holds plaintext", n, len(raw), want, err)
		}
		if left, _ := os.ReadDir(src); len(left) != 1 {
			t.Fatalf("%d bytes: %d files beside the source, want it alone", n, len(left))
		}
	}
}
