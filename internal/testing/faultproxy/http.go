package faultproxy

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// HTTP is a reverse proxy in front of an S3 endpoint that can answer with S3
// error documents instead of forwarding: 500 InternalError, 503 SlowDown,
// 409 ConditionalRequestConflict, for the next n requests of a method.
type HTTP struct {
	URL string // http://127.0.0.1:port

	srv      *http.Server
	mu       sync.Mutex
	failures []failure
	delays   map[string]time.Duration // by method
	seen     map[string]int64         // requests received, by method
	Requests atomic.Int64             // requests received
	Injected atomic.Int64             // requests answered with an injected error
}

type failure struct {
	method string // "" for any
	status int
	code   string
	left   int
}

// StartHTTP proxies a loopback port to target (an http:// URL).
func StartHTTP(target string) (*HTTP, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &HTTP{URL: "http://" + ln.Addr().String()}
	rp := httputil.NewSingleHostReverseProxy(u)
	h.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.Requests.Add(1)
		if d := h.arrived(r.Method); d > 0 {
			time.Sleep(d)
		}
		if f, ok := h.next(r.Method); ok {
			h.Injected.Add(1)
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(f.status)
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected by faultproxy</Message></Error>`, f.code)
			return
		}
		rp.ServeHTTP(w, r)
	})}
	go h.srv.Serve(ln)
	return h, nil
}

// Fail answers the next n requests with method (or any, for "") with status
// and the S3 error code.
func (h *HTTP) Fail(method string, status int, code string, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures = append(h.failures, failure{method: method, status: status, code: code, left: n})
}

func (h *HTTP) next(method string) (failure, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range h.failures {
		f := &h.failures[i]
		if f.left > 0 && (f.method == "" || f.method == method) {
			f.left--
			return *f, true
		}
	}
	return failure{}, false
}

// Delay holds every later request with method for d before it is
// answered, as a distant store would (0: no delay).
func (h *HTTP) Delay(method string, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.delays == nil {
		h.delays = map[string]time.Duration{}
	}
	h.delays[method] = d
}

// Seen returns how many requests with method the proxy has received.
func (h *HTTP) Seen(method string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[method]
}

// arrived counts a request and returns its delay.
func (h *HTTP) arrived(method string) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen == nil {
		h.seen = map[string]int64{}
	}
	h.seen[method]++
	return h.delays[method]
}

// Reset drops the failures not yet used up.
func (h *HTTP) Reset() {
	h.mu.Lock()
	h.failures = nil
	h.mu.Unlock()
}

// Close stops the proxy.
func (h *HTTP) Close() error { return h.srv.Close() }
