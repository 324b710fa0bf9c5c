package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// seedModes appends one entry per mode, in order, and returns their ids.
func seedModes(t *testing.T, srv *testserver.RedisServer, modes ...string) []brand.ID {
	t.Helper()
	ks, _ := stream.NewKeyspace("", "cm")
	l, _ := stream.NewLog(srv.Client(t), ks, "events", brand.EVT)
	batch := make([]stream.Fields, len(modes))
	for i, m := range modes {
		batch[i] = stream.Fields{"mode": m}
	}
	ids, err := l.AppendBatch(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func parseSummary(t *testing.T, out string) summaryLine {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var s summaryLine
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil {
		t.Fatalf("summary %q: %v", out, err)
	}
	return s
}

func TestRun_Webhook(t *testing.T) {
	const secret = "s3cr3t"
	srv := testserver.Redis(t)
	ids := seedModes(t, srv, "200", "400", "429-then-200", "500", "drop")
	var mu sync.Mutex
	calls := map[string]int{}
	var problems []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var doc deliveryDoc
		json.Unmarshal(body, &doc)
		m := hmac.New(sha256.New, []byte(secret))
		m.Write(body)
		mu.Lock()
		if r.Header.Get("Idempotency-Key") != doc.ID {
			problems = append(problems, "idempotency key "+r.Header.Get("Idempotency-Key")+" for "+doc.ID)
		}
		if r.Header.Get("X-Silt-Signature") != "sha256="+hex.EncodeToString(m.Sum(nil)) {
			problems = append(problems, "bad signature for "+doc.ID)
		}
		mode := doc.Payload["mode"]
		calls[mode]++
		n := calls[mode]
		mu.Unlock()
		switch mode {
		case "200":
			w.WriteHeader(200)
		case "400":
			w.WriteHeader(400)
		case "429-then-200":
			if n == 1 {
				w.WriteHeader(429)
				return
			}
			w.WriteHeader(200)
		case "500":
			w.WriteHeader(500)
		case "drop":
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		}
	}))
	defer hook.Close()
	code, out, errOut := runWorker(t, "", "run", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--group", "g",
		"--block", "100ms", "--webhook", hook.URL, "--webhook-secret", secret, "--webhook-retries", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	sum := parseSummary(t, out)
	if sum.Acked != 2 || sum.DeadLettered != 1 || sum.Failed != 2 {
		t.Fatalf("summary %+v; want 200 and 429-then-200 acked, 400 dead, 500 and drop pending", sum)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["500"] != 3 || calls["drop"] != 3 || calls["400"] != 1 {
		t.Fatalf("calls %v: want 3 tries of 500 and drop (2 retries), 1 of 400", calls)
	}
	if len(problems) > 0 {
		t.Fatalf("server saw: %v", problems)
	}
	p := srv.Client(t).XPending(context.Background(), "emq:{cm}:stream:events", "g").Val()
	if p.Count != 2 || p.Lower != ids[3].StreamID.String() {
		t.Fatalf("pending %+v, want the 500 and the dropped one", p)
	}
	if strings.Contains(errOut, secret) {
		t.Fatal("webhook secret printed")
	}
}

func TestRun_ExecExitCodes(t *testing.T) {
	srv := testserver.Redis(t)
	seedModes(t, srv, "ok", "bad", "fail")
	dir := t.TempDir()
	seen := filepath.Join(dir, "seen")
	script := `doc=$(cat); echo "$doc" >> ` + seen + `
case "$doc" in *'"mode":"bad"'*) echo "bad data" >&2; exit 65;; *'"mode":"fail"'*) echo "first"; echo "cannot reach the ledger" >&2; exit 3;; esac`
	code, out, errOut := runWorker(t, "", "run", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--group", "g",
		"--block", "100ms", "--exec", script)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	sum := parseSummary(t, out)
	if sum.Acked != 1 || sum.DeadLettered != 1 || sum.Failed != 1 {
		t.Fatalf("summary %+v", sum)
	}
	if !strings.Contains(errOut, "bad data") {
		t.Fatalf("handler stderr not logged: %s", errOut)
	}
	// A failed attempt says why at the default level: the entry, the
	// attempt, the exit status and the last line of its stderr.
	if !containsLine(errOut, "level=WARN", "handler failed", "attempt=1", "exit status 3", "last stderr line: cannot reach the ledger") {
		t.Fatalf("no WARN line saying why the handler failed: %s", errOut)
	}
	b, _ := os.ReadFile(seen)
	var doc deliveryDoc
	json.Unmarshal([]byte(strings.Split(string(b), "\n")[0]), &doc)
	if doc.Group != "g" || doc.Attempts != 1 || doc.Payload["mode"] != "ok" || !strings.HasPrefix(doc.ID, "EVT_") {
		t.Fatalf("stdin document %s", b)
	}
	// With --fail-on-error a scheduler sees the failure: exit 5, the
	// summary printed as always.
	seedModes(t, srv, "fail")
	code, out, errOut = runWorker(t, "", "run", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--group", "g",
		"--block", "100ms", "--fail-on-error", "--exec", script)
	if code != 5 || parseSummary(t, out).Failed == 0 || !strings.Contains(errOut, "handlers failed") {
		t.Fatalf("--fail-on-error: exit %d, %s %s", code, out, errOut)
	}
	// Dead-letter retry through a handler given after --.
	code, out, errOut = runWorker(t, "", "dead", "retry", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--group", "g", "--all", "--", "true")
	if code != 0 || !strings.Contains(out, `"succeeded":1`) {
		t.Fatalf("dead retry: exit %d %s %s", code, out, errOut)
	}
}

func TestRun_StdoutAndTimeout(t *testing.T) {
	srv := testserver.Redis(t)
	ids := seedModes(t, srv, "a", "b")
	code, out, errOut := runWorker(t, "", "run", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--group", "g", "--block", "100ms", "--stdout")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], ids[0].String()) {
		t.Fatalf("stdout %q", out)
	}
	if parseSummary(t, errOut).Acked != 2 {
		t.Fatalf("summary on stderr: %s", errOut)
	}
	seedModes(t, srv, "slow")
	code, out, errOut = runWorker(t, "", "run", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--group", "g", "--block", "100ms",
		"--handler-timeout", "200ms", "--", "sleep", "5")
	if sum := parseSummary(t, out); code != 0 || sum.Failed != 1 {
		t.Fatalf("timeout: exit %d, %+v", code, sum)
	}
	if !containsLine(errOut, "level=WARN", "timed out after 200ms (--handler-timeout)") {
		t.Fatalf("a timeout does not name --handler-timeout: %s", errOut)
	}
}

// containsLine reports whether one line of out holds every part.
func containsLine(out string, parts ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

func TestRun_UsageErrors(t *testing.T) {
	base := []string{"run", "--queue", "cm", "--stream", "events"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--exec", "true"}, "--group"},
		{[]string{"--group", "g"}, "exactly one handler"},
		{[]string{"--group", "g", "--exec", "true", "--stdout"}, "--exec and --stdout"},
		{[]string{"--group", "g", "--webhook", "ftp://x"}, "--webhook"},
		{[]string{"--group", "g b", "--stdout"}, "--group"},
		{[]string{"--group", "g", "--stdout", "--count", "-1"}, "--count"},
		{[]string{"--group", "g", "--stdout", "--block", "0s"}, "--block"},
		{[]string{"--group", "g", "--stdout", "--concurrency", "0"}, "--concurrency"},
		{[]string{"--group", "g", "--pipe", "cat", "--pipe-start-timeout", "-1s"}, "--pipe-start-timeout"},
		{[]string{"--group", "g", "--pipe", "cat", "--pipe-start-timeout", "soon"}, "pipe-start-timeout"},
	} {
		srv := testserver.Redis(t)
		code, _, errOut := runWorker(t, "", append(append(base, "--redis", srv.URL()), tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %s", tc.args, code, errOut, tc.want)
		}
	}
	code, _, errOut := runWorker(t, "", "dead", "retry", "--queue", "cm", "--stream", "s", "--group", "g", "--stdout")
	if code != 2 || !strings.Contains(errOut, "--all") {
		t.Errorf("dead retry without --id or --all: %d %s", code, errOut)
	}
}

func TestStatus_Table(t *testing.T) {
	srv := testserver.Redis(t)
	seedModes(t, srv, "x")
	runWorker(t, "", "run", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--group", "g", "--block", "50ms", "--", "false")
	code, out, errOut := runWorker(t, "", "status", "--redis", srv.URL(), "--queue", "cm", "--stream", "events")
	if code != 0 {
		t.Fatalf("exit %d %s", code, errOut)
	}
	for _, want := range []string{"length (XLEN)    1", "group g", "pending                1", "oldest pending", "dead letters           0"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
}

// A handler that times out is killed with everything it started: the
// process group goes, not only the shell.
func TestRun_HandlerTimeoutKillsItsProcessGroup(t *testing.T) {
	srv := testserver.Redis(t)
	seedModes(t, srv, "slow")
	pidFile := filepath.Join(t.TempDir(), "pid")
	code, out, errOut := runWorker(t, "", "run", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--group", "g",
		"--block", "100ms", "--handler-timeout", "300ms", "--exec", `sleep 30 & echo $! > `+pidFile+`; wait`)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if sum := parseSummary(t, out); sum.Failed != 1 {
		t.Fatalf("summary %+v, want the timed-out entry left pending", sum)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	deadline := time.Now().Add(2 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the handler's child %s outlived its timeout", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid string) bool {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

// A webhook's redirect is never followed: the entry is dead-lettered with
// the status and the Location, and the host it points at sees nothing. The
// handler timeout bounds the whole call, retries included.
func TestRun_WebhookRedirectsAreNotFollowed(t *testing.T) {
	srv := testserver.Redis(t)
	seedModes(t, srv, "301", "302", "307", "slow")
	var elsewhere sync.Map
	var slowCalls atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Store(r.Method+" "+r.URL.Path, true)
	}))
	defer other.Close()
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var doc deliveryDoc
		json.NewDecoder(r.Body).Decode(&doc)
		switch mode := doc.Payload["mode"]; mode {
		case "slow":
			slowCalls.Add(1)
			time.Sleep(300 * time.Millisecond)
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			code, _ := strconv.Atoi(mode)
			w.Header().Set("Location", other.URL+"/took-it")
			w.WriteHeader(code)
		}
	}))
	defer hook.Close()
	code, out, errOut := runWorker(t, "", "run", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--group", "g",
		"--block", "100ms", "--webhook", hook.URL, "--webhook-retries", "5", "--handler-timeout", "500ms")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if sum := parseSummary(t, out); sum.DeadLettered != 3 || sum.Acked != 0 || sum.Failed != 1 {
		t.Fatalf("summary %+v: want the three redirects dead-lettered and the slow one pending", sum)
	}
	elsewhere.Range(func(k, _ any) bool { t.Errorf("the redirect target got %v", k); return true })
	dead := srv.Client(t).XRange(context.Background(), "emq:{cm}:dead:events:g", "-", "+").Val()
	for _, d := range dead {
		if r := fmt.Sprint(d.Values["reason"]); !strings.Contains(r, "redirect") || !strings.Contains(r, "/took-it") {
			t.Errorf("dead letter reason %q names neither the redirect nor its Location", r)
		}
	}
	if n := slowCalls.Load(); n == 0 || n > 2 {
		t.Fatalf("a 500 ms timeout let %d tries of 300 ms through", n)
	}
}

// With --log-format json every line on stderr is JSON, the final error
// line too; a repeated flag names the Redis hint only for --redis.
func TestRun_JSONLogsToTheLastLine(t *testing.T) {
	code, _, errOut := runWorker(t, "", "run", "--log-format", "json", "--redis", "redis://127.0.0.1:1/0", "--redis-wait", "0s",
		"--queue", "cm", "--stream", "events", "--group", "g", "--stdout")
	if code != 1 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, line := range strings.Split(strings.TrimSpace(errOut), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not a JSON line with --log-format json: %q", line)
		}
	}
	if !strings.Contains(errOut, `"level":"ERROR"`) || !strings.Contains(errOut, `"exit_code":1`) {
		t.Fatalf("no final error record: %s", errOut)
	}
	// The OpenTelemetry SDK's complaints (an unreachable collector) are
	// JSON records of the run's logger too.
	srv := testserver.Redis(t)
	seedModes(t, srv, "a")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	code, _, errOut = runWorker(t, "", "run", "--log-format", "json", "--redis", srv.URL(), "--queue", "cm", "--stream", "events",
		"--group", "g", "--block", "100ms", "--stdout")
	for _, line := range strings.Split(strings.TrimSpace(errOut), "\n") {
		if line != "" && !json.Valid([]byte(line)) {
			t.Fatalf("exit %d; not a JSON line with --log-format json and telemetry failing: %q", code, line)
		}
	}
	os.Unsetenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	_, _, errOut = runWorker(t, "", "run", "--queue", "cm", "--queue", "dd", "--stream", "events")
	if !strings.Contains(errOut, "given 2 times") || strings.Contains(errOut, "Redis URLs") {
		t.Fatalf("repeated --queue: %s", errOut)
	}
}

// worker status of a stream that does not exist says so and fails; a stray
// argument to a command that takes none is a usage error.
func TestStatus_MissingStreamAndStrayArguments(t *testing.T) {
	srv := testserver.Redis(t)
	code, out, errOut := runWorker(t, "", "status", "--redis", srv.URL(), "--queue", "cm", "--stream", "nosuch")
	if code != 1 || !strings.Contains(errOut, "does not exist") || out != "" {
		t.Fatalf("status of a missing stream: exit %d %q %s", code, out, errOut)
	}
	seedModes(t, srv, "a")
	code, _, errOut = runWorker(t, "", "status", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "[--json]")
	if code != 2 || !strings.Contains(errOut, "takes no arguments") {
		t.Fatalf("status with a stray argument: exit %d %s", code, errOut)
	}
}
