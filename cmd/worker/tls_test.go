package main

import (
	"strings"
	"testing"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// TestAppend_TLS: rediss:// to a TLS-only redis-server works with the test
// CA; an unknown CA, a name mismatch and plain text are refused.
func TestAppend_TLS(t *testing.T) {
	f := testserver.NewTLS(t, "127.0.0.1", "localhost")
	srv := testserver.RedisTLS(t, f)
	base := []string{"append", "--queue", "cm", "--stream", "events", "--redis-wait", "300ms"}
	tlsURL := "rediss://" + srv.Addr + "/0"

	code, out, errOut := runWorker(t, "", append(base, "--redis", tlsURL, "--redis-ca", f.CA, "a=1")...)
	if code != 0 || !strings.HasPrefix(out, "EVT_") {
		t.Fatalf("append over TLS: exit %d, %q %s", code, out, errOut)
	}
	code, _, errOut = runWorker(t, "", append(base, "--redis", tlsURL, "a=1")...)
	if code != 1 || !strings.Contains(errOut, "certificate") {
		t.Fatalf("unknown CA: exit %d, %s", code, errOut)
	}
	other := testserver.NewTLS(t, "db.example.org") // signed for another name only
	mismatch := testserver.RedisTLS(t, other)
	code, _, errOut = runWorker(t, "", append(base, "--redis", "rediss://"+mismatch.Addr+"/0", "--redis-ca", other.CA, "a=1")...)
	if code != 1 || !strings.Contains(errOut, "certificate") {
		t.Fatalf("name mismatch: exit %d, %s", code, errOut)
	}
	code, _, errOut = runWorker(t, "", append(base, "--redis", "redis://"+srv.Addr+"/0", "a=1")...)
	if code != 1 {
		t.Fatalf("plain text to a TLS port: exit %d, %s", code, errOut)
	}
	code, _, errOut = runWorker(t, "", append(base, "--redis", "redis://"+srv.Addr+"/0", "--redis-ca", f.CA, "a=1")...)
	if code != 2 || !strings.Contains(errOut, "--redis-ca") {
		t.Fatalf("--redis-ca with redis://: exit %d, %s", code, errOut)
	}
}

// rediss:// to a port that speaks plain Redis says it looks like a TLS
// mismatch, rather than only that a deadline passed.
func TestTLS_RedissToAPlainPortSaysSo(t *testing.T) {
	srv := testserver.Redis(t)
	url := strings.Replace(srv.URL(), "redis://", "rediss://", 1)
	code, _, errOut := runWorker(t, "", "status", "--redis", url, "--redis-wait", "1s", "--queue", "cm", "--stream", "events")
	if code != 1 || !strings.Contains(errOut, "rediss://") || !strings.Contains(errOut, "plain Redis") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}
