package s3_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/faultproxy"
	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/fence/s3"
)

// TestS3_LostReplyVerdict creates objects on MinIO through a proxy that lets
// the PUT land and drops its reply, then resets the connection: the SDK
// retries, MinIO answers 412, and Create must read the object back and call
// it ours, whether the body came from memory or from a file (whose retry
// must send it again from its start). A wrong verdict (ErrExists for our own object) is what breaks the
// fence after a lost reply; the silt_negative_readback build must show it.
func TestS3_LostReplyVerdict(t *testing.T) {
	srv := testserver.S3(t, "minio")
	bucket := srv.CreateBucket(t)
	u, _ := url.Parse(srv.Endpoint)
	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cfg := s3.Config{Bucket: bucket, Prefix: "lost-reply", Region: "us-east-1", PathStyle: true,
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, Timeout: 5 * time.Second}
	direct := cfg
	direct.Endpoint, cfg.Endpoint = srv.Endpoint, "http://"+p.Addr
	st, err := s3.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	truth, _ := s3.Open(context.Background(), direct)
	ctx := context.Background()
	const n = 8
	wrong, landed := 0, 0
	dir := t.TempDir()
	for i := range n {
		key, body := fmt.Sprintf("k%d", i), []byte(fmt.Sprintf("body %d", i))
		create := func() error { return st.Create(ctx, key, body) }
		if i%2 == 1 {
			path := filepath.Join(dir, key)
			if err := os.WriteFile(path, body, 0o644); err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(body)
			create = func() error { return st.CreateFile(ctx, key, path, int64(len(body)), hex.EncodeToString(sum[:])) }
		}
		p.DropReplies(true)
		done := make(chan error, 1)
		go func() { done <- create() }()
		if waitObject(ctx, truth, key) {
			landed++
		}
		p.DropReplies(false) // the connection that lost the reply is reset
		err := <-done
		got, gerr := truth.Get(ctx, key, fence.Range{})
		ours := gerr == nil && bytes.Equal(got, body)
		if (err == nil) != ours || (err != nil && !errors.Is(err, fence.ErrExists)) {
			wrong++
			t.Logf("create %s: verdict %v, object ours: %v", key, err, ours)
		}
	}
	t.Logf("history TestS3_LostReplyVerdict: creates %d, replies dropped %d, wrong verdicts %d", n, landed, wrong)
	if landed != n {
		t.Fatalf("only %d of %d PUTs landed while their reply was dropped", landed, n)
	}
	if wrong != 0 {
		t.Fatalf("%d of %d creates whose reply was lost got the wrong verdict", wrong, n)
	}
}

// waitObject polls until key exists on st (at most 5s).
func waitObject(ctx context.Context, st fence.Store, key string) bool {
	for range 250 {
		if _, err := st.Get(ctx, key, fence.Range{}); err == nil {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}
