package s3_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/fence/fencetest"
	"github.com/silt-dev/silt/pkg/fence/s3"
)

// The encrypting wrapper keeps the Store contract on MinIO.
func TestEncrypted_ConformanceMinIO(t *testing.T) {
	open := realS3(t, "minio")
	fencetest.Run(t, func(t *testing.T) fence.Store {
		e, err := fence.Encrypt(open(t), bytes.Repeat([]byte{1}, 32))
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}

// Server-side encryption is passed through: SSE-KMS on every PUT, an SSE-C
// key on every PUT, GET and HEAD (a read without it is refused by the store).
func TestS3_ServerSideEncryptionPassthrough(t *testing.T) {
	ctx := context.Background()
	f := fencetest.NewFakeS3(t)
	open := func(prefix string, mod func(*s3.Config)) *s3.Store {
		cfg := s3.Config{Bucket: "b", Prefix: prefix, Endpoint: f.URL, Region: "us-east-1", PathStyle: true, AccessKey: "fake", SecretKey: "fake"}
		mod(&cfg)
		st, err := s3.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	kms := open("kms", func(c *s3.Config) { c.SSE, c.SSEKMSKeyID = "aws:kms", "alias/silt" })
	if err := kms.Create(ctx, "commits/1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if h := f.SSE("b/kms/commits/1"); h.Get("X-Amz-Server-Side-Encryption") != "aws:kms" ||
		h.Get("X-Amz-Server-Side-Encryption-Aws-Kms-Key-Id") != "alias/silt" {
		t.Fatalf("SSE-KMS headers of the PUT: %v", h)
	}
	key := bytes.Repeat([]byte{9}, 32)
	ssec := open("ssec", func(c *s3.Config) { c.SSECustomerKey = key })
	if err := ssec.Create(ctx, "segments/1", []byte("payload")); err != nil {
		t.Fatal(err)
	}
	if got, err := ssec.Get(ctx, "segments/1", fence.Range{Off: 1, Len: 3}); err != nil || string(got) != "ayl" {
		t.Fatalf("SSE-C read with the key: %q %v", got, err)
	}
	if err := ssec.Create(ctx, "segments/1", []byte("payload")); err != nil { // a retried create reads back with HEAD
		t.Fatalf("SSE-C create of the same bytes again: %v", err)
	}
	noKey := open("ssec", func(*s3.Config) {})
	if _, err := noKey.Get(ctx, "segments/1", fence.Range{}); err == nil {
		t.Fatal("an SSE-C object was read without its key")
	}
	for _, tc := range []struct{ url, want string }{
		{"s3://b/p?sse=bogus", "want aws:kms or AES256"},
		{"s3://b/p?sse-kms-key-id=k", "needs sse=aws:kms"},
		{"s3://b/p?sse-c-key-file=/nonexistent", "sse-c-key-file"},
	} {
		if _, err := s3.ParseURL(tc.url); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.url, err, tc.want)
		}
	}
	kf := filepath.Join(t.TempDir(), "k")
	os.WriteFile(kf, key, 0o600)
	if cfg, err := s3.ParseURL("s3://b/p?sse-c-key-file=" + kf); err != nil || !bytes.Equal(cfg.SSECustomerKey, key) {
		t.Fatalf("sse-c-key-file: %v", err)
	}
}
