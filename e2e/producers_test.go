package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
)

// TestProducers_NativeClientsAppendBrandedIDs runs the producer snippets of
// docs/producers with real clients no one here wrote (Debian's
// python3-redis, npm's ioredis, go-redis without silt), each appending
// with a branded id it minted itself, interleaved with silt's own appends.
// Every id a producer printed is a valid branded id of its entry, handled
// once by the worker, archived, and read back with its fields.
func TestProducers_NativeClientsAppendBrandedIDs(t *testing.T) {
	python, nodePath := os.Getenv("SILT_PYTHON"), os.Getenv("SILT_NODE_PATH")
	if python == "" || nodePath == "" {
		testserver.Absent(t, "the producer clients (python3-redis, ioredis)", `eval "$(scripts/clients.sh)"`)
	}
	srv := testserver.Redis(t)
	dir := t.TempDir()
	env := faultEnv(srv, dir)
	producerEnv := append(os.Environ(), "REDIS_URL="+srv.URL(), "STREAM="+streamKey, "KIND=EVT", "NODE_PATH="+nodePath)
	langOf := map[string]string{} // branded id -> the producer's language ("silt": silt's own)
	for _, id := range feed(t, env, 5) {
		langOf[id] = "silt"
	}
	for _, p := range []struct {
		lang string
		argv []string
	}{
		{"python", []string{python, "../docs/producers/producer.py", "40"}},
		{"node", []string{"node", "../docs/producers/producer.js", "40"}},
		{"go", []string{"go", "run", "../docs/producers/go", "40"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, p.argv[0], p.argv[1:]...)
		cmd.Env = producerEnv
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		cancel()
		if err != nil {
			t.Fatalf("%s producer: %v\n%s", p.lang, err, stderr.String())
		}
		ids := strings.Fields(string(out))
		if len(ids) != 40 {
			t.Fatalf("%s producer printed %d ids", p.lang, len(ids))
		}
		for _, s := range ids {
			if _, err := brand.Parse(s); err != nil {
				t.Fatalf("%s producer printed %q: %v", p.lang, s, err)
			}
			langOf[s] = p.lang
		}
		for _, id := range feed(t, env, 5) {
			langOf[id] = "silt"
		}
	}
	rec := filepath.Join(dir, "handled")
	out := silt(t, "", env, "worker", workerArgs("w1", rec)...)
	var sum struct{ Malformed, DeadLettered, Acked int }
	json.Unmarshal([]byte(out), &sum)
	handledIDs := handled(t, rec)
	if sum.Malformed != 0 || sum.DeadLettered != 0 || len(handledIDs) != len(langOf) {
		t.Fatalf("worker over %d entries: %s; %d handled", len(langOf), out, len(handledIDs))
	}
	for id := range langOf {
		if handledIDs[id] != 1 {
			t.Fatalf("%s (%s) handled %d times", id, langOf[id], handledIDs[id])
		}
	}
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "10", "--exact")
	lines := strings.Split(strings.TrimSpace(silt(t, "", env, "archiver", "read")), "\n")
	if len(lines) != len(langOf) {
		t.Fatalf("read %d entries of %d", len(lines), len(langOf))
	}
	for _, line := range lines {
		var r struct {
			ID, Error string
			Fields    map[string]string
		}
		json.Unmarshal([]byte(line), &r)
		lang, ok := langOf[r.ID]
		if !ok || r.Error != "" || (lang != "silt" && r.Fields["lang"] != lang) {
			t.Fatalf("read back %s", line)
		}
	}
	report(t, scenario{Name: "native producers (python3-redis, ioredis, go-redis) minting branded ids", Runs: 5, counts: counts{Entries: len(langOf)}})
}
