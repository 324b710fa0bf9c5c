package testserver

import (
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// S3Server is an S3-compatible server started by scripts/servers.sh.
type S3Server struct {
	Name      string // "minio" or "versitygw"
	Endpoint  string // http://127.0.0.1:port
	AccessKey string
	SecretKey string
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
	return s
}

var unique atomic.Int64

// Unique returns a number not returned before in this process, mixed with the
// time, for names of buckets and keys shared with other test processes.
func Unique() int64 {
	return time.Now().UnixNano()/1000 + unique.Add(1)
}
