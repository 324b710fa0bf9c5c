package faultproxy

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestHTTP_DelayAndSeen: a delayed method waits before it is forwarded,
// others do not; Seen counts requests by method, failures and delays
// included.
func TestHTTP_DelayAndSeen(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer backend.Close()
	px, err := StartHTTP(backend.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	do := func(method string) (int, time.Duration) {
		req, _ := http.NewRequest(method, px.URL+"/k", nil)
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, time.Since(start)
	}
	px.Delay("DELETE", 50*time.Millisecond)
	if _, took := do("DELETE"); took < 50*time.Millisecond {
		t.Fatalf("a delayed DELETE took %v", took)
	}
	px.Fail("DELETE", http.StatusServiceUnavailable, "SlowDown", 1)
	if code, took := do("DELETE"); code != http.StatusServiceUnavailable || took < 50*time.Millisecond {
		t.Fatalf("a delayed, failed DELETE: %d after %v", code, took)
	}
	do("GET")
	if px.Seen("DELETE") != 2 || px.Seen("GET") != 1 || px.Seen("PUT") != 0 {
		t.Fatalf("seen DELETE %d, GET %d, PUT %d; want 2, 1, 0", px.Seen("DELETE"), px.Seen("GET"), px.Seen("PUT"))
	}
}
