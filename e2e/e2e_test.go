package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "silt-e2e-bin")
	if err != nil {
		panic(err)
	}
	// The binaries honour SILT_FAILPOINT (the crash tests' kills), which
	// only a silt_failpoints build does. SILT_BUILD_TAGS adds the tags of
	// the broken binaries of the negative controls (negative_test.go).
	tags := "silt_failpoints"
	if extra := os.Getenv("SILT_BUILD_TAGS"); extra != "" {
		tags += "," + extra
	}
	build := exec.Command("go", "build", "-tags", tags, "-o", dir+string(os.PathSeparator), "../cmd/worker", "../cmd/archiver")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		panic("build binaries: " + err.Error())
	}
	binDir = dir
	// scripts/servers.sh exports SILT_REDIS_URL, which the binaries read
	// as --redis: every test names its own server instead.
	os.Unsetenv("SILT_REDIS_URL")
	// Runs that name no data dir or archive cache use the defaults,
	// ./silt-data and ./silt-cache: keep them out of the source tree.
	os.Setenv("SILT_DATA_DIR", filepath.Join(dir, "silt-data"))
	os.Setenv("SILT_ARCHIVE_CACHE", filepath.Join(dir, "silt-cache"))
	code := m.Run()
	os.RemoveAll(dir)
	if leaks := transcript.leaks(); len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: a secret was printed by a silt binary:\n%s\n", strings.Join(leaks, "\n"))
		code = 1
	}
	os.Exit(code)
}

// transcript keeps what every silt binary printed in this process, so that
// TestMain can check that no secret (a Redis password, an S3 secret key, a
// canary) ever showed, in any test, on any path.
var transcript printed

type printed struct {
	mu    sync.Mutex
	texts []string
}

func (p *printed) add(texts ...string) {
	p.mu.Lock()
	p.texts = append(p.texts, texts...)
	p.mu.Unlock()
}

// leaks returns the lines that hold a secret, with the secret masked.
func (p *printed) leaks() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, secret := range testserver.Secrets() {
		for _, text := range p.texts {
			for _, line := range strings.Split(text, "\n") {
				if strings.Contains(line, secret) {
					out = append(out, strings.ReplaceAll(line, secret, "<secret>"))
				}
			}
		}
	}
	return out
}

// checkedRuns counts the binary runs whose output went through the transcript.
func checkedRuns() int {
	transcript.mu.Lock()
	defer transcript.mu.Unlock()
	return len(transcript.texts) / 2
}

// silt runs one of the binaries and returns stdout; it fails the test on a non-zero exit.
func silt(t *testing.T, stdin string, env []string, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a hang, not a slow run on a loaded machine under -race
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, bin), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	transcript.add(out.String(), errOut.String())
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", bin, args, err, errOut.String())
	}
	return out.String()
}

// TestQuickstart_AppendThenRead is the README's first command in small: a feed
// appended from JSON lines comes back in order, id for id, field for field.
func TestQuickstart_AppendThenRead(t *testing.T) {
	srv := testserver.Redis(t)
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events"}
	var feed strings.Builder
	for i := range 50 {
		feed.WriteString(`{"user":"u` + string(rune('a'+i%26)) + `","n":"` + strings.Repeat("x", i%5) + `"}` + "\n")
	}
	ids := strings.Fields(silt(t, feed.String(), env, "worker", "append"))
	if len(ids) != 50 {
		t.Fatalf("append printed %d ids, want 50", len(ids))
	}
	out := silt(t, "", env, "archiver", "read")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 50 {
		t.Fatalf("read printed %d lines, want 50", len(lines))
	}
	for i, line := range lines {
		var rec struct {
			ID, Source string
			Fields     map[string]string
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.ID != ids[i] || rec.Source != "live" || rec.Fields["user"] != "u"+string(rune('a'+i%26)) {
			t.Fatalf("line %d = %s, want id %s", i, line, ids[i])
		}
	}
}

// TestServers_S3Answer checks that the S3 servers the script started answer
// S3 requests (an unsigned request is refused with an S3 error document).
func TestServers_S3Answer(t *testing.T) {
	for _, name := range []string{"minio", "versitygw"} {
		t.Run(name, func(t *testing.T) {
			s := testserver.S3(t, name)
			resp, err := http.Get(s.Endpoint + "/")
			if err != nil {
				t.Fatalf("%s at %s: %v", name, s.Endpoint, err)
			}
			defer resp.Body.Close()
			var body bytes.Buffer
			body.ReadFrom(resp.Body)
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(body.String(), "<Error>") {
				t.Fatalf("%s answered %d %q, want 403 with an S3 error", name, resp.StatusCode, body.String())
			}
		})
	}
}
