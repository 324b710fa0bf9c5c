package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// docExample returns the first fenced block of lang in docs/pipe.md: the
// tests run the examples exactly as the page prints them.
func docExample(t *testing.T, lang string) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "pipe.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```"+lang+"\n")
	if !ok {
		t.Fatalf("docs/pipe.md has no %s example", lang)
	}
	code, _, _ := strings.Cut(rest, "```")
	return code
}

// TestPipe_DocExamples runs the Python and Node handlers of docs/pipe.md
// as --pipe co-processes over 600 entries, 8 in flight: every entry is
// acked once but the poison ones, dead-lettered at their first attempt.
func TestPipe_DocExamples(t *testing.T) {
	for _, tc := range []struct{ lang, runtime, file string }{
		{"python", "python3", "handler.py"},
		{"javascript", "node", "handler.js"},
	} {
		t.Run(tc.runtime, func(t *testing.T) {
			if _, err := exec.LookPath(tc.runtime); err != nil {
				t.Skipf("%s is not on this machine: the %s example of docs/pipe.md is not run", tc.runtime, tc.lang)
			}
			dir := t.TempDir()
			script := filepath.Join(dir, tc.file)
			if err := os.WriteFile(script, []byte(docExample(t, tc.lang)), 0o644); err != nil {
				t.Fatal(err)
			}
			srv := testserver.Redis(t)
			env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
			var feed strings.Builder
			const n, poison = 600, 6
			for i := range n {
				kind := "order"
				if i%(n/poison) == 17 {
					kind = "poison"
				}
				fmt.Fprintf(&feed, `{"n":"%d","kind":"%s"}`+"\n", i, kind)
			}
			silt(t, feed.String(), env, "worker", "append")
			out := silt(t, "", append(env, "PATH="+os.Getenv("PATH")), "worker", "run", "--block", "100ms", "--concurrency", "8",
				"--handler-env", "PATH", "--pipe", tc.runtime+" "+script)
			var sum struct {
				Acked, Failed int64
				DeadLettered  int64 `json:"dead_lettered"`
			}
			json.Unmarshal([]byte(out), &sum)
			if sum.Acked != n-poison || sum.DeadLettered != poison || sum.Failed != 0 {
				t.Fatalf("worker run --pipe %s: %s", tc.runtime, out)
			}
		})
	}
}

// TestPipe_BrokenCoprocessStopsTheRun: a co-process that answers garbage is
// restarted --pipe-restarts times, then the run exits 1 naming the line;
// the entries stay pending with their attempts, none is dead-lettered.
func TestPipe_BrokenCoprocessStopsTheRun(t *testing.T) {
	srv := testserver.Redis(t)
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
	silt(t, strings.Repeat(`{"k":"v"}`+"\n", 50), env, "worker", "append")
	code, out, errOut := exitCode(t, env, "", "worker", "run", "--block", "100ms", "--pipe-restarts", "2",
		"--pipe", `while read -r line; do echo "not json"; done`)
	if code != 1 || !strings.Contains(errOut, "started 3 times") || !strings.Contains(errOut, `malformed result line "not json"`) {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	var sum struct {
		Acked        int64
		DeadLettered int64 `json:"dead_lettered"`
	}
	json.Unmarshal([]byte(out), &sum)
	if sum.Acked != 0 || sum.DeadLettered != 0 {
		t.Fatalf("a broken co-process acked or dead-lettered entries: %s", out)
	}
	var st struct{ Groups []struct{ Pending int64 } }
	status := silt(t, "", env, "worker", "status", "--json")
	if json.Unmarshal([]byte(status), &st) != nil || len(st.Groups) != 1 || st.Groups[0].Pending != 50 {
		t.Fatalf("status after the broken run (want 50 pending): %s", status)
	}
}

// TestPipe_SlowStartIsNotTheEntriesTime: a co-process that takes 2.5 s to
// start (an interpreter loading its libraries) under --handler-timeout 1s
// keeps its first deliveries: their timeout counts from its first answer.
// With --pipe-start-timeout 200ms it is ended at each start instead, and
// the run stops once its restarts are spent, the entries left pending.
func TestPipe_SlowStartIsNotTheEntriesTime(t *testing.T) {
	srv := testserver.Redis(t)
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
	const n = 40
	silt(t, strings.Repeat(`{"k":"v"}`+"\n", n), env, "worker", "append")
	slow := `sleep 2.5; exec sed -u -e 's/^{"id":"\([^"]*\)".*/{"id":"\1","ok":true}/'`
	code, out, errOut := exitCode(t, env, "", "worker", "run", "--block", "100ms", "--concurrency", "4",
		"--handler-timeout", "1s", "--pipe-start-timeout", "200ms", "--pipe-restarts", "1", "--pipe", slow)
	if code != 1 || !strings.Contains(errOut, "answered nothing") || !strings.Contains(errOut, "started 2 times") {
		t.Fatalf("--pipe-start-timeout 200ms: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = exitCode(t, env, "", "worker", "run", "--block", "100ms", "--concurrency", "4",
		"--handler-timeout", "1s", "--pipe", slow)
	var sum struct{ Acked, Failed int64 }
	json.Unmarshal([]byte(out), &sum)
	if code != 0 || sum.Acked != n || sum.Failed != 0 || strings.Contains(errOut, "restarting") {
		t.Fatalf("the default --pipe-start-timeout: exit %d\n%s\n%s", code, out, errOut)
	}
}
