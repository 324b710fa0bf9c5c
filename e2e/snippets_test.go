package e2e

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// snippetDocs are the pages whose every sh block runs as printed.
var snippetDocs = []string{"README.md", "docs/usage.md"}

// skipMarker, on the line before a block, keeps it from running: it says
// why (a command that runs until stopped).
const skipMarker = "<!-- snippet: skip"

// snippet is one sh block of a page.
type snippet struct {
	doc  string
	line int // of the opening fence
	body string
	skip bool
}

// snippets returns the sh blocks of a page in order.
func snippets(t *testing.T, doc string) []snippet {
	t.Helper()
	f, err := os.Open(filepath.Join("..", doc))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []snippet
	var cur *snippet
	prev := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && line == "```sh":
			cur = &snippet{doc: doc, line: n, skip: strings.HasPrefix(prev, skipMarker)}
		case cur != nil && line == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.body += line + "\n"
		}
		if strings.TrimSpace(line) != "" {
			prev = line
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: a block is never closed", doc, cur.line)
	}
	return out
}

// TestSnippets runs every sh block of README.md and docs/usage.md as
// printed, in order, in one bash with -euo pipefail, from a copy of the
// repository's files, against a redis-server of its own: a block that
// fails (or holds a "..." placeholder) fails the test, naming its line.
// Placeholders are variables the test sets: WEBHOOK_URL (a server that
// answers 200), WEBHOOK_SECRET, COLLECTOR_URL (an OTLP endpoint that
// answers 200). The README's ./scripts/test.sh is the command running
// this test, so it alone is left out.
func TestSnippets(t *testing.T) {
	for _, doc := range snippetDocs {
		t.Run(strings.ReplaceAll(doc, "/", "_"), func(t *testing.T) {
			t.Parallel()
			runSnippets(t, doc)
		})
	}
}

func runSnippets(t *testing.T, doc string) {
	blocks := snippets(t, doc)
	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	ran := 0
	for _, b := range blocks {
		if b.skip {
			continue
		}
		if strings.Contains(b.body, "...") {
			t.Errorf("%s:%d: a runnable block holds a \"...\" placeholder; use a variable", b.doc, b.line)
		}
		body := b.body
		if doc == "README.md" {
			body = strings.ReplaceAll(body, "./scripts/test.sh", ": scripts/test.sh runs this test")
		}
		script.WriteString("echo '### " + b.doc + ":" + strconv.Itoa(b.line) + "'\n" + body)
		ran++
	}
	if ran == 0 {
		t.Fatalf("%s has no runnable sh block", doc)
	}
	srv := testserver.Redis(t)
	// The README adopts a stream under its own key, orders: silt's user
	// needs that key (docs/security.md), as a newcomer's would.
	if err := srv.Client(t).Do(context.Background(), "ACL", "SETUSER", testserver.SiltUser, "~orders").Err(); err != nil {
		t.Fatal(err)
	}
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(ok.Close)

	dir := copyRepo(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script.String())
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(),
		"SILT_REDIS_URL="+srv.URL(),
		"WEBHOOK_URL="+ok.URL+"/hook",
		"WEBHOOK_SECRET=snippet-test-secret",
		"COLLECTOR_URL="+ok.URL,
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	transcript.add(out.String())
	if err != nil {
		text := out.String()
		at := "before the first block"
		if i := strings.LastIndex(text, "### "); i >= 0 {
			at, _, _ = strings.Cut(text[i+4:], "\n")
			text = text[i:]
		}
		t.Fatalf("%s: the block at %s failed (%v); its output:\n%s", doc, at, err, tail(text, 60))
	}
	t.Logf("%s: %d blocks ran, %d marked not to run", doc, ran, len(blocks)-ran)
}

// copyRepo copies the files git tracks (as they are in the working tree)
// into a temporary directory: the snippets build and write there.
func copyRepo(t *testing.T) string {
	t.Helper()
	list, err := exec.Command("git", "-C", "..", "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files (the snippet test copies the repository's files): %v", err)
	}
	dir := t.TempDir()
	for _, name := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		src := filepath.Join("..", name)
		fi, err := os.Lstat(src)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the working tree, or not a file
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// cleanEnv is the test's environment without silt's variables: the
// snippets set their own, as a newcomer's shell would.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SILT_") && !strings.HasPrefix(kv, "EMQ_") && !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return env
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
