package s3_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/fence/fencetest"
	"github.com/silt-dev/silt/pkg/fence/s3"
)

func TestFakeS3_Conformance(t *testing.T) {
	srv := fencetest.NewFakeS3(t)
	var n atomic.Int64
	fencetest.Run(t, func(t *testing.T) fence.Store {
		return srv.Store(t, fmt.Sprintf("case%d", n.Add(1)))
	})
}

// realS3 returns stores on a fresh bucket of a server started by scripts/servers.sh.
func realS3(t *testing.T, name string) func(t *testing.T) fence.Store {
	srv := testserver.S3(t, name)
	cfg := s3.Config{Endpoint: srv.Endpoint, Region: "us-east-1", PathStyle: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey}
	bucket := strings.ToLower(fmt.Sprintf("silt-%s-%d", name, testserver.Unique()))
	createBucket(t, cfg, bucket)
	var n atomic.Int64
	return func(t *testing.T) fence.Store {
		c := cfg
		c.Bucket, c.Prefix = bucket, fmt.Sprintf("case%d", n.Add(1))
		st, err := s3.Open(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
}

func createBucket(t *testing.T, cfg s3.Config, bucket string) {
	t.Helper()
	client := awss3.New(awss3.Options{
		Region: cfg.Region, BaseEndpoint: aws.String(cfg.Endpoint), UsePathStyle: true,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: cfg.AccessKey, SecretAccessKey: cfg.SecretKey}, nil
		}),
	})
	if _, err := client.CreateBucket(context.Background(), &awss3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatalf("create bucket %s at %s: %v", bucket, cfg.Endpoint, err)
	}
}

func TestMinIO_Conformance(t *testing.T)     { fencetest.Run(t, realS3(t, "minio")) }
func TestVersityGW_Conformance(t *testing.T) { fencetest.Run(t, realS3(t, "versitygw")) }

func TestS3_LostReplyOursIsSuccess(t *testing.T) {
	srv := fencetest.NewFakeS3(t)
	st := srv.Store(t, "p")
	srv.Inject("PUT", fencetest.LostReply)
	if err := st.Create(context.Background(), "commits/1", []byte("ours")); err != nil {
		t.Fatalf("Create after a lost reply of our own write: %v", err)
	}
	if body, _ := srv.Object("b/p/commits/1"); string(body) != "ours" || srv.Puts != 2 {
		t.Fatalf("object %q after %d puts", body, srv.Puts)
	}
}

func TestS3_LostReplyTheirsIsExists(t *testing.T) {
	srv := fencetest.NewFakeS3(t)
	st := srv.Store(t, "p")
	srv.Inject("PUT", fencetest.RivalThenDrop)
	err := st.Create(context.Background(), "commits/1", []byte("ours"))
	if !errors.Is(err, fence.ErrExists) {
		t.Fatalf("Create when a rival landed first = %v, want ErrExists", err)
	}
}

func TestS3_ConflictIsRetried(t *testing.T) {
	srv := fencetest.NewFakeS3(t)
	st := srv.Store(t, "p")
	srv.Inject("PUT", fencetest.Conflict, fencetest.Conflict)
	if err := st.Create(context.Background(), "k", []byte("x")); err != nil {
		t.Fatalf("Create after two 409s: %v", err)
	}
	srv.Inject("PUT", fencetest.Conflict, fencetest.Conflict, fencetest.Conflict, fencetest.Conflict, fencetest.Conflict, fencetest.Conflict)
	err := st.Create(context.Background(), "k2", []byte("x"))
	if err == nil || errors.Is(err, fence.ErrExists) || !strings.Contains(err.Error(), "409") {
		t.Fatalf("Create after endless 409s = %v, want a 409 error that is not ErrExists", err)
	}
}

func TestS3_ServerErrorsAreRetriedThenReported(t *testing.T) {
	srv := fencetest.NewFakeS3(t)
	st := srv.Store(t, "p")
	srv.Inject("PUT", fencetest.InternalError, fencetest.InternalError)
	if err := st.Create(context.Background(), "k", []byte("x")); err != nil {
		t.Fatalf("Create after two 500s: %v", err)
	}
	srv.Inject("GET", fencetest.InternalError, fencetest.InternalError, fencetest.InternalError)
	if _, err := st.Get(context.Background(), "k", fence.Range{}); err == nil || !strings.Contains(err.Error(), "500") {
		t.Fatalf("Get after three 500s = %v, want the 500 reported", err)
	}
}

func TestProbe_RefusesStoreIgnoringIfNoneMatch(t *testing.T) {
	srv := fencetest.NewFakeS3(t)
	srv.IgnoreConditional = true
	err := fence.Probe(context.Background(), srv.Store(t, "p"))
	if !errors.Is(err, fence.ErrNoConditionalWrites) || !strings.Contains(err.Error(), srv.URL) {
		t.Fatalf("Probe = %v, want ErrNoConditionalWrites naming the endpoint", err)
	}
}

func TestParseURL(t *testing.T) {
	cfg, err := s3.ParseURL("s3://bkt/a/b?endpoint=http://127.0.0.1:9000&region=auto&path-style=true")
	if err != nil || cfg.Bucket != "bkt" || cfg.Prefix != "a/b" || cfg.Endpoint != "http://127.0.0.1:9000" || cfg.Region != "auto" || !cfg.PathStyle {
		t.Fatalf("s3 URL: %+v %v", cfg, err)
	}
	cfg, _ = s3.ParseURL("s3://b/p?endpoint=https://fly.storage.tigris.dev&region=auto")
	if !cfg.Consistent {
		t.Fatal("a Tigris endpoint does not ask for consistent conditional writes")
	}
	if cfg, _ = s3.ParseURL("s3://b/p?endpoint=https://fly.storage.tigris.dev&consistent=false"); cfg.Consistent {
		t.Fatal("consistent=false ignored")
	}
	if cfg, err = s3.ParseURL("s3://b/p?timeout=2s"); err != nil || cfg.Timeout != 2*time.Second {
		t.Fatalf("timeout=2s: %+v %v", cfg, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"s3://b/p?timeout=soon", "timeout"},
		{"s3://b/p?timeout=-1s", "timeout"},
		{"ftp://x/y", "unknown scheme"},
		{"file:///var/x", "not s3"},
		{"s3:///prefix", "without a bucket"},
		{"s3://b/../x", "prefix"},
		{"s3://b/p?endpoint=ftp://x", "endpoint"},
		{"s3://b/p?path-style=maybe", "path-style"},
		{"s3://b/p?colour=blue", "unknown s3 URL parameter"},
		{"s3://key:secret@b/p", "credentials"},
	} {
		_, err := s3.ParseURL(tc.in)
		if !errors.Is(err, fence.ErrBadURL) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseURL(%q) = %v, want ErrBadURL saying %q", tc.in, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseURL(%q) error shows the secret: %v", tc.in, err)
		}
	}
}

func TestS3_ConsistentHeader(t *testing.T) {
	srv := fencetest.NewFakeS3(t)
	st, err := s3.Open(context.Background(), s3.Config{Bucket: "b", Endpoint: srv.URL, Region: "auto",
		PathStyle: true, AccessKey: "k", SecretKey: "s", Consistent: true})
	if err != nil {
		t.Fatal(err)
	}
	st.Create(context.Background(), "k", []byte("x"))
	st.Get(context.Background(), "k", fence.Range{})
	if srv.Consistent != 2 {
		t.Fatalf("%d requests carried X-Tigris-Consistent, want 2", srv.Consistent)
	}
}

// FuzzS3ParseURL: any store URL parses or is an ErrBadURL, and an error never
// shows the URL's password.
func FuzzS3ParseURL(f *testing.F) {
	for _, s := range []string{"file:///tmp/x", "s3://b/p?endpoint=http://127.0.0.1:9000&path-style=true&timeout=2s",
		"s3://user:canary-pw@b/p", "ftp://x", "%zz", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, err := s3.ParseURL(s)
		if err != nil && !errors.Is(err, fence.ErrBadURL) {
			t.Fatalf("ParseURL(%q): %v is not ErrBadURL", s, err)
		}
		if err != nil && strings.Contains(s, ":canary-pw@") && strings.Contains(err.Error(), "canary-pw") {
			t.Fatalf("ParseURL(%q) error shows the password: %v", s, err)
		}
	})
}
