package main

import (
	"context"
	"strings"
	"testing"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// A Redis that may evict keys is refused (it deletes dead-letter streams and
// records to make room, silently), unless --allow-eviction, which warns.
func TestRun_EvictingRedisIsRefused(t *testing.T) {
	srv := testserver.Redis(t, "--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru")
	seedModes(t, srv, "a")
	args := []string{"run", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--group", "g", "--block", "100ms", "--", "true"}
	code, _, errOut := runWorker(t, "", args...)
	if code != 1 || !strings.Contains(errOut, "maxmemory-policy is allkeys-lru") || !strings.Contains(errOut, "--allow-eviction") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	withFlag := append(append([]string{}, args[:len(args)-2]...), "--allow-eviction", "--", "true")
	code, out, errOut := runWorker(t, "", withFlag...)
	if code != 0 || !strings.Contains(errOut, "warning: redis maxmemory-policy is allkeys-lru") || parseSummary(t, out).Acked != 1 {
		t.Fatalf("with --allow-eviction: exit %d, %s %s", code, out, errOut)
	}
}

// A full Redis (noeviction) still drains an existing group: the run sends
// no XGROUP CREATE for a group that exists and handles and acks what it
// reads, saying that starts go unrecorded; an append names the OOM.
func TestRun_FullRedisStillDrains(t *testing.T) {
	srv := testserver.Redis(t)
	seedModes(t, srv, "a", "b", "c")
	args := []string{"run", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--group", "g", "--block", "100ms", "--", "true"}
	first := append(append([]string{}, args[:len(args)-2]...), "--max-entries", "1", "--", "true")
	if code, out, errOut := runWorker(t, "", first...); code != 0 || parseSummary(t, out).Acked != 1 { // the group exists now
		t.Fatalf("first run: %s %s", out, errOut)
	}
	admin := srv.Client(t) // the ACL user may not CONFIG SET; the server's own client does
	if err := admin.Do(context.Background(), "CONFIG", "SET", "maxmemory", "1").Err(); err != nil {
		t.Fatalf("fill Redis: %v", err)
	}
	defer admin.Do(context.Background(), "CONFIG", "SET", "maxmemory", "0")
	code, out, errOut := runWorker(t, "", args...)
	if sum := parseSummary(t, out); code != 0 || sum.Acked != 2 || !strings.Contains(errOut, "redis is full") {
		t.Fatalf("drain of a full Redis: exit %d, %s %s", code, out, errOut)
	}
	for _, stdin := range []string{"", `{"x":"1"}` + "\n" + `{"x":"2"}` + "\n"} { // one entry; a batch (MULTI, EXECABORT)
		appendArgs := []string{"append", "--redis", srv.URL(), "--queue", "cm", "--stream", "events"}
		if stdin == "" {
			appendArgs = append(appendArgs, "x=1")
		}
		code, _, errOut = runWorker(t, stdin, appendArgs...)
		if code != 1 || !strings.Contains(errOut, "redis is full") || !strings.Contains(errOut, "OOM") {
			t.Fatalf("append to a full Redis: exit %d, %s", code, errOut)
		}
	}
}
