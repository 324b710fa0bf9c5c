package fence_test

import (
	"bytes"
	"context"
	"errors"
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

// The encrypting wrapper keeps the Store contract, on a local directory and
// on MinIO.
func TestEncrypted_Conformance(t *testing.T) {
	t.Run("local", func(t *testing.T) {
		fencetest.Run(t, func(t *testing.T) fence.Store { return encryptedLocal(t, t.TempDir(), testKey(1)) })
	})
	t.Run("minio", func(t *testing.T) {
		open := realS3(t, "minio")
		fencetest.Run(t, func(t *testing.T) fence.Store {
			e, err := fence.Encrypt(open(t), testKey(1))
			if err != nil {
				t.Fatal(err)
			}
			return e
		})
	})
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

// Server-side encryption is passed through: SSE-KMS on every PUT, an SSE-C
// key on every PUT, GET and HEAD (a read without it is refused by the store).
func TestS3_ServerSideEncryptionPassthrough(t *testing.T) {
	ctx := context.Background()
	f := fencetest.NewFakeS3(t)
	open := func(prefix string, mod func(*fence.S3Config)) *fence.S3 {
		cfg := fence.S3Config{Bucket: "b", Prefix: prefix, Endpoint: f.URL, Region: "us-east-1", PathStyle: true, AccessKey: "fake", SecretKey: "fake"}
		mod(&cfg)
		st, err := fence.OpenS3(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	kms := open("kms", func(c *fence.S3Config) { c.SSE, c.SSEKMSKeyID = "aws:kms", "alias/silt" })
	if err := kms.Create(ctx, "commits/1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if h := f.SSE("b/kms/commits/1"); h.Get("X-Amz-Server-Side-Encryption") != "aws:kms" ||
		h.Get("X-Amz-Server-Side-Encryption-Aws-Kms-Key-Id") != "alias/silt" {
		t.Fatalf("SSE-KMS headers of the PUT: %v", h)
	}
	key := testKey(9)
	ssec := open("ssec", func(c *fence.S3Config) { c.SSECustomerKey = key })
	if err := ssec.Create(ctx, "segments/1", []byte("payload")); err != nil {
		t.Fatal(err)
	}
	if got, err := ssec.Get(ctx, "segments/1", fence.Range{Off: 1, Len: 3}); err != nil || string(got) != "ayl" {
		t.Fatalf("SSE-C read with the key: %q %v", got, err)
	}
	if err := ssec.Create(ctx, "segments/1", []byte("payload")); err != nil { // a retried create reads back with HEAD
		t.Fatalf("SSE-C create of the same bytes again: %v", err)
	}
	noKey := open("ssec", func(*fence.S3Config) {})
	if _, err := noKey.Get(ctx, "segments/1", fence.Range{}); err == nil {
		t.Fatal("an SSE-C object was read without its key")
	}
	for _, tc := range []struct{ url, want string }{
		{"s3://b/p?sse=bogus", "want aws:kms or AES256"},
		{"s3://b/p?sse-kms-key-id=k", "needs sse=aws:kms"},
		{"s3://b/p?sse-c-key-file=/nonexistent", "sse-c-key-file"},
	} {
		if _, _, err := fence.ParseURL(tc.url); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.url, err, tc.want)
		}
	}
	kf := filepath.Join(t.TempDir(), "k")
	os.WriteFile(kf, key, 0o600)
	if _, cfg, err := fence.ParseURL("s3://b/p?sse-c-key-file=" + kf); err != nil || !bytes.Equal(cfg.SSECustomerKey, key) {
		t.Fatalf("sse-c-key-file: %v", err)
	}
}
