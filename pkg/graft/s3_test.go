package graft_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/fence"
	fences3 "github.com/silt-dev/silt/pkg/fence/s3"
	"github.com/silt-dev/silt/pkg/graft"
)

// s3Store returns a store on a fresh bucket of a server from scripts/servers.sh,
// verified in cleanup: whatever a test did, the remote must still verify.
func s3Store(t testing.TB, name string) *fences3.Store {
	t.Helper()
	srv := testserver.S3(t, name)
	bucket := strings.ToLower(fmt.Sprintf("graft-%d", testserver.Unique()))
	client := s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.Endpoint), UsePathStyle: true,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey}, nil
		})})
	if _, err := client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatalf("create bucket on %s: %v", name, err)
	}
	st, err := fences3.Open(context.Background(), fences3.Config{Bucket: bucket, Prefix: "silt", Endpoint: srv.Endpoint,
		Region: "us-east-1", PathStyle: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	if err := fence.Probe(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		v, err := graft.Open(context.Background(), t.TempDir(), "vol", st)
		if err != nil {
			t.Errorf("cleanup: open: %v", err)
			return
		}
		if _, err := v.VerifyRemote(context.Background()); err != nil {
			t.Errorf("cleanup: verify: %v", err)
		}
	})
	return st
}

func TestVolume_FourWritersOnRealS3(t *testing.T) {
	for _, name := range []string{"minio", "versitygw"} {
		t.Run(name, func(t *testing.T) {
			st := s3Store(t, name)
			ctx := context.Background()
			var wg sync.WaitGroup
			var mu sync.Mutex
			won, lost := 0, 0
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					v, err := graft.Open(ctx, t.TempDir(), "vol", st)
					if err != nil {
						t.Error(err)
						return
					}
					for i := range 8 {
						_, err := v.Commit(ctx, []graft.Page{{No: uint64(w*100 + i), Data: []byte("x")}}, nil)
						mu.Lock()
						switch {
						case graft.IsConflict(err):
							lost++
						case err != nil:
							t.Error(err)
						default:
							won++
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			v, err := graft.Open(ctx, t.TempDir(), "vol", st)
			if err != nil {
				t.Fatal(err)
			}
			if v.Head() != uint64(won) {
				t.Fatalf("head %d, won %d", v.Head(), won)
			}
			t.Logf("%s: %d commits won, %d races lost", name, won, lost)
		})
	}
}

// Compaction on real S3 servers: merged segments are streamed from a local
// file to the bucket (fence.FileCreator), and a cold reader on a fresh
// data directory reads every page once from them; cleanup verifies.
func TestCompact_OnRealS3(t *testing.T) {
	for _, name := range []string{"minio", "versitygw"} {
		t.Run(name, func(t *testing.T) {
			st := s3Store(t, name)
			ctx := context.Background()
			v, err := graft.Open(ctx, t.TempDir(), "vol", st)
			if err != nil {
				t.Fatal(err)
			}
			const n = 48
			for i := 1; i <= n; i++ {
				if _, err := v.Commit(ctx, []graft.Page{{No: uint64(i), Data: fmt.Appendf(nil, "page %d", i)}}, nil); err != nil {
					t.Fatal(err)
				}
			}
			res, err := v.Compact(ctx, graft.CompactOptions{MinEntries: 16})
			if err != nil || res.Merged != n || res.Entries != 3 {
				t.Fatalf("compact: %+v %v; want %d entries merged into 3", res, err, n)
			}
			cold, err := graft.Open(ctx, t.TempDir(), "vol", st)
			if err != nil {
				t.Fatal(err)
			}
			wantPages(t, pagesOf(t, cold), n)
		})
	}
}
