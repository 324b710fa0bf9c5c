package fencetest

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/silt-dev/silt/pkg/fence/s3"
)

// Fault is what the fake S3 server does to one request instead of answering it.
type Fault int

const (
	// Conflict answers 409 ConditionalRequestConflict without applying the request.
	Conflict Fault = iota + 1
	// InternalError answers 500 without applying the request.
	InternalError
	// LostReply applies the request, then drops the connection: the writer
	// never learns that its write landed.
	LostReply
	// RivalThenDrop stores another writer's object under the key, then drops
	// the connection without applying the request.
	RivalThenDrop
)

// FakeS3 is a minimal in-memory S3 (path style: PUT, GET with Range, HEAD,
// DELETE, ListObjectsV2) that honours If-None-Match: * and injects faults.
type FakeS3 struct {
	*httptest.Server

	// IgnoreConditional makes it overwrite objects despite If-None-Match,
	// as some stores do.
	IgnoreConditional bool

	mu      sync.Mutex
	objects map[string]fakeObject
	faults  map[string][]Fault // by HTTP method, consumed in order
	Puts    int                // PUT requests received
	// Consistent counts requests that carried X-Tigris-Consistent: true.
	Consistent int
}

type fakeObject struct {
	body []byte
	meta http.Header
	sse  http.Header // the x-amz-server-side-encryption* headers of its PUT
}

// SSE returns the server-side encryption headers bucket/key was written
// with (S3 keeps them; an SSE-C object is read only with its key's MD5).
func (f *FakeS3) SSE(path string) http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.objects[path].sse
}

// NewFakeS3 starts a fake S3 server, closed when t ends.
func NewFakeS3(t testing.TB) *FakeS3 {
	f := &FakeS3{objects: map[string]fakeObject{}, faults: map[string][]Fault{}}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

// Inject queues faults for the next requests with method.
func (f *FakeS3) Inject(method string, faults ...Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults[method] = append(f.faults[method], faults...)
}

// Object returns the stored body of bucket/key.
func (f *FakeS3) Object(path string) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.objects[path]
	return o.body, ok
}

// Store returns an s3.Store on bucket "b" of the fake server.
func (f *FakeS3) Store(t testing.TB, prefix string) *s3.Store {
	st, err := s3.Open(context.Background(), s3.Config{
		Bucket: "b", Prefix: prefix, Endpoint: f.URL, Region: "us-east-1", PathStyle: true,
		AccessKey: "fake", SecretKey: "fake",
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (f *FakeS3) nextFault(method string) Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := f.faults[method]
	if len(q) == 0 {
		return 0
	}
	f.faults[method] = q[1:]
	return q[0]
}

func (f *FakeS3) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Tigris-Consistent") == "true" {
		f.mu.Lock()
		f.Consistent++
		f.mu.Unlock()
	}
	bucket, key, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	path := bucket + "/" + key
	switch fault := f.nextFault(r.Method); fault {
	case Conflict:
		s3Error(w, 409, "ConditionalRequestConflict")
		return
	case InternalError:
		s3Error(w, 500, "InternalError")
		return
	case LostReply:
		f.apply(httptest.NewRecorder(), r, path)
		drop(w)
		return
	case RivalThenDrop:
		f.mu.Lock()
		f.objects[path] = fakeObject{body: []byte("rival"), meta: http.Header{}}
		f.mu.Unlock()
		drop(w)
		return
	}
	switch {
	case r.Method == http.MethodGet && key == "":
		f.list(w, r, bucket)
	default:
		f.apply(w, r, path)
	}
}

func drop(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

func s3Error(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>%s</Message></Error>`, code, code)
}

// apply performs an object request and writes its reply to w.
func (f *FakeS3) apply(w http.ResponseWriter, r *http.Request, path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, exists := f.objects[path]
	switch r.Method {
	case http.MethodPut:
		f.Puts++
		body, _ := io.ReadAll(r.Body)
		if exists && r.Header.Get("If-None-Match") == "*" && !f.IgnoreConditional {
			s3Error(w, 412, "PreconditionFailed")
			return
		}
		meta, sse := http.Header{}, http.Header{}
		for k, v := range r.Header {
			switch lk := strings.ToLower(k); {
			case strings.HasPrefix(lk, "x-amz-meta-"):
				meta[k] = v
			case strings.HasPrefix(lk, "x-amz-server-side-encryption"):
				sse[k] = v
			}
		}
		f.objects[path] = fakeObject{body: body, meta: meta, sse: sse}
		sum := md5.Sum(body)
		w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:])+`"`)
		w.WriteHeader(200)
	case http.MethodGet, http.MethodHead:
		if !exists {
			s3Error(w, 404, "NoSuchKey")
			return
		}
		const md5Header = "X-Amz-Server-Side-Encryption-Customer-Key-Md5"
		if want := o.sse.Get(md5Header); want != r.Header.Get(md5Header) {
			s3Error(w, 400, "InvalidRequest") // S3's answer to a read without the object's SSE-C key
			return
		}
		for k, v := range o.meta {
			w.Header()[k] = v
		}
		body, status := rangeOf(o.body, r.Header.Get("Range"))
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(status)
		if r.Method == http.MethodGet {
			w.Write(body)
		}
	case http.MethodDelete:
		delete(f.objects, path)
		w.WriteHeader(204)
	default:
		s3Error(w, 405, "MethodNotAllowed")
	}
}

// rangeOf serves "bytes=a-b", "bytes=a-" and "bytes=-n".
func rangeOf(body []byte, h string) ([]byte, int) {
	spec, ok := strings.CutPrefix(h, "bytes=")
	if !ok {
		return body, 200
	}
	if n, ok := strings.CutPrefix(spec, "-"); ok {
		last, _ := strconv.Atoi(n)
		return body[max(0, len(body)-last):], 206
	}
	a, b, _ := strings.Cut(spec, "-")
	from, _ := strconv.Atoi(a)
	to := len(body) - 1
	if b != "" {
		to, _ = strconv.Atoi(b)
	}
	from, to = min(from, len(body)), min(to+1, len(body))
	return body[from:to], 206
}

type listResult struct {
	XMLName     xml.Name `xml:"ListBucketResult"`
	Name        string
	Prefix      string
	KeyCount    int
	IsTruncated bool
	Contents    []struct{ Key string }
}

func (f *FakeS3) list(w http.ResponseWriter, r *http.Request, bucket string) {
	q := r.URL.Query()
	prefix, after := q.Get("prefix"), q.Get("start-after")
	f.mu.Lock()
	var keys []string
	for p := range f.objects {
		k := strings.TrimPrefix(p, bucket+"/")
		if strings.HasPrefix(p, bucket+"/") && strings.HasPrefix(k, prefix) && k > after {
			keys = append(keys, k)
		}
	}
	f.mu.Unlock()
	slices.Sort(keys)
	res := listResult{Name: bucket, Prefix: prefix, KeyCount: len(keys)}
	for _, k := range keys {
		res.Contents = append(res.Contents, struct{ Key string }{k})
	}
	w.Header().Set("Content-Type", "application/xml")
	xml.NewEncoder(w).Encode(res)
}
