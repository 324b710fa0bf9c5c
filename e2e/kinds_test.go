package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// TestKinds_OneQueueManyKinds drives a queue of six streams, one per kind,
// through the CLIs, naming the kind only at each stream's first append:
// every entry is handled, archived and read back with its own kind, and an
// append of the wrong kind is refused before any XADD reaches Redis.
func TestKinds_OneQueueManyKinds(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	base := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_DATA_DIR=" + filepath.Join(dir, "data"),
		"SILT_ARCHIVE_REMOTE=file://" + filepath.Join(dir, "remote"), "SILT_ARCHIVE_CACHE=" + filepath.Join(dir, "cache")}
	kinds := []string{"USR", "RMM", "RND", "JOB", "GES", "EVT"}
	const perStream = 40
	envOf := func(kind string) []string {
		return append(base, "SILT_STREAM="+strings.ToLower(kind)+"s", "SILT_GROUP=g")
	}
	for _, k := range kinds {
		env := envOf(k)
		first := silt(t, "", env, "worker", "append", "--kind", k, "n=0")
		var in strings.Builder
		for i := 1; i < perStream; i++ {
			fmt.Fprintf(&in, `{"n":"%d"}`+"\n", i)
		}
		rest := strings.Fields(silt(t, in.String(), env, "worker", "append")) // no --kind: the stream's
		for _, id := range append(rest, strings.TrimSpace(first)) {
			if !strings.HasPrefix(id, k+"_") {
				t.Fatalf("stream of %s minted %s", k, id)
			}
		}
	}
	rdb := srv.Client(t)
	before := xaddCalls(t, rdb)
	var d detector
	for _, k := range kinds {
		wrong := kinds[(slices.Index(kinds, k)+1)%len(kinds)]
		code, _, errOut := exitCode(t, envOf(k), "", "worker", "append", "--kind", wrong, "n=x")
		d.fault(t, code == 2 && strings.Contains(errOut, "holds "+k+" ids"), "%s append into the %s stream: exit %d, %s", wrong, k, code, errOut)
	}
	if after := xaddCalls(t, rdb); after != before {
		t.Fatalf("%d XADD reached Redis for refused appends", after-before)
	}
	for _, k := range kinds {
		out := silt(t, "", envOf(k), "worker", "run", "--block", "200ms", "--", "true")
		var sum struct{ Acked, Malformed, DeadLettered int64 }
		json.Unmarshal([]byte(out), &sum)
		if sum.Acked != perStream || sum.Malformed != 0 || sum.DeadLettered != 0 {
			t.Fatalf("worker run on the %s stream: %s", k, out)
		}
	}
	out := silt(t, "", base, "archiver", "run", "--all", "--keep-last", "10")
	var run struct {
		Streams []struct {
			Stream              string
			Archived, Malformed int64
		}
	}
	if err := json.Unmarshal([]byte(out), &run); err != nil {
		t.Fatalf("archiver summary %q: %v", out, err)
	}
	archived := 0
	for _, s := range run.Streams {
		if s.Malformed != 0 {
			t.Fatalf("archiver run --all counted %d malformed in %s: %s", s.Malformed, s.Stream, out)
		}
		archived += int(s.Archived)
	}
	if archived != len(kinds)*(perStream-10) {
		t.Fatalf("archived %d entries, want %d: %s", archived, len(kinds)*(perStream-10), out)
	}
	for _, k := range kinds {
		lines := strings.Split(strings.TrimSpace(silt(t, "", envOf(k), "archiver", "read")), "\n")
		fromArchive := 0
		for _, line := range lines {
			var e struct{ ID, Source, Error string }
			json.Unmarshal([]byte(line), &e)
			if !strings.HasPrefix(e.ID, k+"_") || e.Error != "" {
				t.Fatalf("read of the %s stream: %s", k, line)
			}
			if e.Source == "archive" {
				fromArchive++
			}
		}
		if len(lines) != perStream || fromArchive != perStream-10 {
			t.Fatalf("read of the %s stream: %d entries, %d from the archive", k, len(lines), fromArchive)
		}
	}
	report(t, scenario{Name: "one queue, six kinds, no --kind after the first append", Runs: 4 * len(kinds), Faults: d.injected,
		Detected: d.detected, Promised: true, counts: counts{Entries: len(kinds) * perStream, Handled: len(kinds) * perStream}})
}

// xaddCalls returns how many XADD commands the server has run.
func xaddCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	for _, line := range strings.Split(rdb.Info(context.Background(), "commandstats").Val(), "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_xadd:calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			return n
		}
	}
	return 0
}
