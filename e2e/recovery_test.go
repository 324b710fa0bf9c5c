package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// TestWorker_RecoversTrimmedPendingFromArchive: entries a dead worker left
// pending are archived and trimmed; a worker with --archive-remote delivers
// them from the archive, marked recovered.
func TestWorker_RecoversTrimmedPendingFromArchive(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	remote := "file://" + filepath.Join(dir, "remote")
	env := append(archiverEnv(srv, filepath.Join(dir, "data"), remote), "SILT_GROUP=g")
	ids := feed(t, env, 100)
	rdb := srv.Client(t)
	ctx := context.Background()
	rdb.XGroupCreate(ctx, streamKey, "g", "0")
	rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{streamKey, ">"}, Count: 100})
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "10", "--exact")
	out := silt(t, "", env, "worker", "run", "--consumer", "w1", "--min-idle", "1ms", "--block", "200ms",
		"--archive-cache", filepath.Join(dir, "cache"), "--stdout")
	recovered := strings.Count(out, `"recovered":true`)
	lines := strings.Count(out, "\n")
	if recovered != 90 || lines != 100 {
		t.Fatalf("%d deliveries, %d recovered; want 100 and 90", lines, recovered)
	}
	if !strings.Contains(out, ids[0]) {
		t.Fatal("the first entry was not delivered")
	}
}

// TestWorker_CatchesUpFromArchiveAfterKill: a group that never read what the
// archiver trimmed catches up from the archive, also when killed mid catch-up.
func TestWorker_CatchesUpFromArchiveAfterKill(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	remote := "file://" + filepath.Join(dir, "remote")
	env := append(archiverEnv(srv, filepath.Join(dir, "data"), remote), "SILT_GROUP=g",
		"SILT_ARCHIVE_CACHE="+filepath.Join(dir, "cache"))
	rdb := srv.Client(t)
	rdb.XGroupCreateMkStream(context.Background(), streamKey, "g", "0")
	ids := feed(t, env, 1000)
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "100", "--exact", "--slice-entries", "250")
	rec := filepath.Join(dir, "handled")
	args := append([]string{"--consumer", "w1", "--count", "50", "--block", "200ms", "--archive-remote", remote}, recordingHandler(rec)...)
	cmd, _, errOut := startWorker(t, append(env, "SILT_FAILPOINT=after-checkpoint:5"), args...)
	if err := cmd.Wait(); !killedBySignal(err, syscall.SIGKILL) {
		t.Fatalf("worker not killed mid catch-up: %v\n%s", err, errOut)
	}
	silt(t, "", env, "worker", append([]string{"run"}, args...)...)
	counts := handled(t, rec)
	for i, id := range ids {
		if counts[id] == 0 {
			t.Fatalf("entry %d (%s) never handled", i, id)
		}
	}
	if n := rdb.LLen(context.Background(), "emq:{cm}:catchup:events:g").Val(); n != 0 {
		t.Fatalf("%d gaps left", n)
	}
	t.Logf("handled %d distinct of %d", len(counts), len(ids))
}

// TestWorker_ReplayResumesAfterFailure replays archive and live history in
// order; a handler failure stops it, a rerun resumes at that entry.
func TestWorker_ReplayResumesAfterFailure(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	remote := "file://" + filepath.Join(dir, "remote")
	env := append(archiverEnv(srv, filepath.Join(dir, "data"), remote), "SILT_ARCHIVE_CACHE="+filepath.Join(dir, "cache"))
	ids := feed(t, env, 300)
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "50", "--exact")
	rec, marker := filepath.Join(dir, "handled"), filepath.Join(dir, "fail-once")
	os.WriteFile(marker, nil, 0o644)
	script := `read -r line; case "$line" in *'"n":"150"'*) if [ -e "` + marker + `" ]; then rm "` + marker + `"; exit 1; fi;; esac; echo "$line" >> "` + rec + `"`
	args := []string{"replay", "--name", "fix-1", "--archive-remote", remote, "--", "sh", "-c", script}
	if _, errOut, err := runWorkerCmd(env, args...); err == nil || !strings.Contains(errOut, "rerun to resume") {
		t.Fatalf("first replay: %v %s", err, errOut)
	}
	out := silt(t, "", env, "worker", args...)
	if !strings.Contains(out, `"done":true`) {
		t.Fatalf("second replay: %s", out)
	}
	b, _ := os.ReadFile(rec)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 300 {
		t.Fatalf("%d deliveries, want 300 (each once)", len(lines))
	}
	for i, line := range lines {
		if !strings.Contains(line, ids[i]) || !strings.Contains(line, `"replay":"fix-1"`) {
			t.Fatalf("delivery %d = %s, want %s with the replay name", i, line, ids[i])
		}
	}
}

func runWorkerCmd(env []string, args ...string) (string, string, error) {
	return runBin(filepath.Join(binDir, "worker"), env, args...)
}

// TestWorker_KilledAfterReclaimingTrimmedEntries: a dead peer's pending
// entries are archived and trimmed; XAUTOCLAIM hands them to a worker as
// deleted ids and removes them from the PEL in the same step. The worker is
// killed right then (SIGKILL after the read): nothing may be lost, so the
// claim must leave a durable record that the next run catches up from.
func TestWorker_KilledAfterReclaimingTrimmedEntries(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	remote := "file://" + filepath.Join(dir, "remote")
	env := append(archiverEnv(srv, filepath.Join(dir, "data"), remote), "SILT_GROUP=g", "SILT_ARCHIVE_CACHE="+filepath.Join(dir, "cache"))
	ids := feed(t, env, 100)
	rdb := srv.Client(t)
	ctx := context.Background()
	rdb.XGroupCreate(ctx, streamKey, "g", "0")
	rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{streamKey, ">"}, Count: 100})
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "10", "--exact")
	rec := filepath.Join(dir, "handled")
	args := append([]string{"--consumer", "w1", "--min-idle", "1ms", "--block", "200ms"}, recordingHandler(rec)...)
	cmd, _, errOut := startWorker(t, append(env, "SILT_FAILPOINT=after-read:1"), args...)
	if err := cmd.Wait(); !killedBySignal(err, syscall.SIGKILL) {
		t.Fatalf("worker not killed after the claim: %v\n%s", err, errOut)
	}
	silt(t, "", env, "worker", append([]string{"run"}, args...)...)
	c := atLeastOnce(t, srv, newHistory(ids), rec)
	report(t, scenario{Name: "worker killed after reclaiming trimmed entries", Runs: 3, Faults: 1, counts: c})
}

// TestWorker_ReplayOfANameRunsOnceAtATime: a second `worker replay --name`
// of a name a running replay holds is refused, naming where it runs, and
// hands nothing to its handler; `--restart` is refused the same way rather
// than forget the running replay's checkpoint under it.
func TestWorker_ReplayOfANameRunsOnceAtATime(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events"}
	ids := feed(t, env, 3)
	rec, started := filepath.Join(dir, "handled"), filepath.Join(dir, "started")
	slow := `cat >> "` + rec + `"; echo >> "` + rec + `"; if [ ! -e "` + started + `" ]; then touch "` + started + `"; sleep 2; fi`
	first := startHandling(t, env, started, "replay", "--name", "fix", "--exec", slow)
	host, _ := os.Hostname()
	second := filepath.Join(dir, "second")
	for _, args := range [][]string{{"replay", "--name", "fix", "--exec", "cat >> " + second}, {"replay", "--name", "fix", "--restart", "--exec", "cat >> " + second}} {
		code, _, errOut := exitCode(t, env, "", "worker", args...)
		if code != 1 || !strings.Contains(errOut, "a replay of this name is running on "+host) {
			t.Fatalf("worker %v beside a running replay: exit %d, %s; want it refused, naming the host", args, code, errOut)
		}
		if b, _ := os.ReadFile(second); len(b) != 0 {
			t.Fatalf("worker %v beside a running replay handed it entries: %s", args, b)
		}
	}
	if out, errOut, err := first.wait(); err != nil || !strings.Contains(out, `"replayed":3`) {
		t.Fatalf("the first replay: %v, %s %s", err, out, errOut)
	}
	b, _ := os.ReadFile(rec)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d deliveries, want the 3 once each:\n%s", len(lines), b)
	}
	for i, line := range lines {
		if !strings.Contains(line, ids[i]) {
			t.Fatalf("delivery %d = %s, want %s", i, line, ids[i])
		}
	}
}
