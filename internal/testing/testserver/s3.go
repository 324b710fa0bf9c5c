package testserver

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// S3Server is an S3-compatible server started by scripts/servers.sh.
type S3Server struct {
	Name      string // "minio" or "versitygw"
	Endpoint  string // http://127.0.0.1:port
	AccessKey string
	SecretKey string
	// HTTPClient, when set, is what CreateBucket uses (a TLS server's CA).
	HTTPClient *http.Client
}

// S3 returns the server name ("minio" or "versitygw") from the SILT_<NAME>_*
// variables that `scripts/servers.sh start` prints. When they are absent the
// test fails naming the script (or skips with -short).
func S3(tb testing.TB, name string) S3Server {
	tb.Helper()
	prefix := map[string]string{"minio": "SILT_MINIO", "versitygw": "SILT_VERSITYGW"}[name]
	if prefix == "" {
		tb.Fatalf("testserver.S3: unknown server %q", name)
	}
	s := S3Server{
		Name:      name,
		Endpoint:  os.Getenv(prefix + "_ENDPOINT"),
		AccessKey: os.Getenv(prefix + "_ACCESS_KEY"),
		SecretKey: os.Getenv(prefix + "_SECRET_KEY"),
	}
	if s.Endpoint == "" || s.AccessKey == "" || s.SecretKey == "" {
		Absent(tb, name+" ("+prefix+"_ENDPOINT and keys)", `eval "$(scripts/servers.sh start `+name+`)"`)
	}
	Canary(s.SecretKey)
	return s
}

var unique atomic.Int64

// Unique returns a number not returned before in this process, mixed with the
// time, for names of buckets and keys shared with other test processes.
func Unique() int64 {
	return time.Now().UnixNano()/1000 + unique.Add(1)
}

// CreateBucket creates a fresh bucket on s and returns its name.
func (s S3Server) CreateBucket(tb testing.TB) string {
	tb.Helper()
	bucket := fmt.Sprintf("silt-%d", Unique())
	opts := s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(s.Endpoint), UsePathStyle: true,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: s.AccessKey, SecretAccessKey: s.SecretKey}, nil
		})}
	if s.HTTPClient != nil { // a nil *http.Client in the interface field would be used
		opts.HTTPClient = s.HTTPClient
	}
	client := s3.New(opts)
	if _, err := client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		tb.Fatalf("create bucket on %s: %v", s.Name, err)
	}
	return bucket
}

// URL returns the store URL of bucket on s (credentials go in the environment).
func (s S3Server) URL(bucket, prefix string) string {
	return fmt.Sprintf("s3://%s/%s?endpoint=%s&region=us-east-1&path-style=true", bucket, prefix, s.Endpoint)
}

// Env returns the AWS environment variables holding s's credentials.
func (s S3Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + s.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s.SecretKey}
}
