package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// TestDeadLetters_ArchivedReadAndRetriedFromTheArchive: dead letters are a
// stream like any other. archiver run --dead-letters archives them through
// the same fence and trims them; archiver read --dead-letters finds them,
// archive and live merged; worker dead retry --id takes one the archiver
// trimmed back from the archive, once: a second retry is refused.
func TestDeadLetters_ArchivedReadAndRetriedFromTheArchive(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	remote := "file://" + filepath.Join(dir, "remote")
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g",
		"SILT_DATA_DIR=" + filepath.Join(dir, "data"), "SILT_ARCHIVE_REMOTE=" + remote, "SILT_ARCHIVE_CACHE=" + filepath.Join(dir, "cache")}
	ids := strings.Fields(silt(t, `{"n":"1"}`+"\n"+`{"n":"2"}`+"\n"+`{"n":"3"}`+"\n"+`{"n":"4"}`+"\n"+`{"n":"5"}`+"\n", env, "worker", "append"))
	if len(ids) != 5 {
		t.Fatalf("appended %v", ids)
	}
	if out := silt(t, "", env, "worker", "run", "--block", "100ms", "--exec", "exit 65"); !strings.Contains(out, `"dead_lettered":5`) {
		t.Fatalf("worker run: %s", out)
	}
	deadKey := "emq:{cm}:dead:events:g"
	out := silt(t, "", env, "archiver", "run", "--stream", "events", "--dead-letters", "g", "--keep-last", "1", "--exact")
	if !strings.Contains(out, `"archived":4`) || srv.Client(t).XLen(t.Context(), deadKey).Val() != 1 {
		t.Fatalf("archiver run --dead-letters g: %s; %d dead letters live, want 1", out, srv.Client(t).XLen(t.Context(), deadKey).Val())
	}
	var sources []string
	for _, line := range strings.Split(strings.TrimSpace(silt(t, "", env, "archiver", "read", "--dead-letters", "g")), "\n") {
		var r struct {
			Source string
			Fields map[string]string
		}
		json.Unmarshal([]byte(line), &r)
		sources = append(sources, r.Source+":"+r.Fields["entry_id"])
	}
	want := []string{"archive:" + ids[0], "archive:" + ids[1], "archive:" + ids[2], "archive:" + ids[3], "live:" + ids[4]}
	if strings.Join(sources, " ") != strings.Join(want, " ") {
		t.Fatalf("archiver read --dead-letters g: %v, want %v", sources, want)
	}

	// Without the archive the trimmed dead letter is not found; with it,
	// it is handed to the handler once.
	got := filepath.Join(dir, "retried")
	if code, _, errOut := exitCode(t, env, "", "worker", "dead", "retry", "--id", ids[1], "--archive-remote", "", "--exec", "cat > "+got); code != 1 || !strings.Contains(errOut, "no such dead letter") {
		t.Fatalf("retry of a trimmed dead letter without the archive: exit %d, %s", code, errOut)
	}
	if out := silt(t, "", env, "worker", "dead", "retry", "--id", ids[1], "--exec", "cat > "+got); !strings.Contains(out, `"succeeded":1`) {
		t.Fatalf("retry from the archive: %s", out)
	}
	b, _ := os.ReadFile(got)
	var d struct {
		ID        string
		Recovered bool
		Payload   map[string]string
	}
	if err := json.Unmarshal(b, &d); err != nil || d.ID != ids[1] || d.Payload["n"] != "2" || !d.Recovered {
		t.Fatalf("the retried delivery: %s (%v)", b, err)
	}
	if code, _, errOut := exitCode(t, env, "", "worker", "dead", "retry", "--id", ids[1], "--exec", "true"); code != 1 || !strings.Contains(errOut, "retried before") {
		t.Fatalf("a second retry of the same archived dead letter: exit %d, %s", code, errOut)
	}
	// The live one is retried as before, and not again from the archive.
	if out := silt(t, "", env, "worker", "dead", "retry", "--id", ids[4], "--exec", "true"); !strings.Contains(out, `"succeeded":1`) {
		t.Fatalf("retry of the live dead letter: %s", out)
	}

	// The archive's history retention drops every dead letter archived;
	// the record of the two retried goes with them, and the dead letter is
	// no longer found at all.
	retried := "emq:{cm}:dead-retried:events:g"
	if n := srv.Client(t).HLen(t.Context(), retried).Val(); n != 2 {
		t.Fatalf("%d retried dead letters on record, want 2", n)
	}
	out = silt(t, "", env, "archiver", "run", "--stream", "events", "--dead-letters", "g", "--keep-last", "1", "--exact", "--archive-keep-for", "1ms")
	if !strings.Contains(out, `"retried_forgotten":2`) || srv.Client(t).Exists(t.Context(), retried).Val() != 0 {
		t.Fatalf("archiver run --dead-letters g --archive-keep-for 1ms: %s; want the 2 retried dead letters forgotten", out)
	}
	if code, _, errOut := exitCode(t, env, "", "worker", "dead", "retry", "--id", ids[1], "--exec", "true"); code != 1 || !strings.Contains(errOut, "no such dead letter") {
		t.Fatalf("a retry of a dead letter the history retention dropped: exit %d, %s", code, errOut)
	}
}

// TestDeadLetters_TwoRetriesAtOnceHandleARecordOnce: an operator's `worker
// dead retry --id` while a scheduled `--all` handles the same record is
// refused, naming the holder; a second `--all` leaves that record to the
// first and retries the rest. Each record reaches a handler once.
func TestDeadLetters_TwoRetriesAtOnceHandleARecordOnce(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
	ids := strings.Fields(silt(t, `{"n":"1"}`+"\n"+`{"n":"2"}`+"\n", env, "worker", "append"))
	if out := silt(t, "", env, "worker", "run", "--block", "100ms", "--exec", "exit 65"); !strings.Contains(out, `"dead_lettered":2`) {
		t.Fatalf("worker run: %s", out)
	}
	calls, started := filepath.Join(dir, "calls"), filepath.Join(dir, "started")
	// The first retry's handler takes its time over the first record.
	slow := `id=$(sed 's/.*"id":"\([^"]*\)".*/\1/'); echo "$id" >> ` + calls + `; [ "$id" = ` + ids[0] + ` ] && touch ` + started + ` && sleep 2; exit 0`
	first := startHandling(t, env, started, "dead", "retry", "--consumer", "scheduled", "--id", ids[0], "--exec", slow)
	record := `sed 's/.*"id":"\([^"]*\)".*/\1/' >> ` + calls
	code, _, errOut := exitCode(t, env, "", "worker", "dead", "retry", "--consumer", "operator", "--id", ids[0], "--exec", record)
	if code != 1 || !strings.Contains(errOut, "being retried") || !strings.Contains(errOut, `"scheduled"`) {
		t.Fatalf("a retry of the record another retry handles: exit %d, %s; want a refusal naming the holder", code, errOut)
	}
	if out := silt(t, "", env, "worker", "dead", "retry", "--consumer", "operator", "--all", "--exec", record); !strings.Contains(out, `"succeeded":1`) || !strings.Contains(out, `"elsewhere":1`) {
		t.Fatalf("retry --all beside it: %s; want the other record retried and this one left to the first", out)
	}
	if out, errOut, err := first.wait(); err != nil || !strings.Contains(out, `"succeeded":1`) {
		t.Fatalf("the first retry: %v, %s %s", err, out, errOut)
	}
	b, _ := os.ReadFile(calls)
	if got := strings.Fields(string(b)); len(got) != 2 || got[0] != ids[0] || got[1] != ids[1] {
		t.Fatalf("handler calls %v, want each of %v once", got, ids)
	}
	if n := srv.Client(t).XLen(t.Context(), "emq:{cm}:dead:events:g").Val(); n != 0 {
		t.Fatalf("%d dead letters left", n)
	}
}

// handling is a worker command run in the background, inside its handler.
type handling struct {
	cmd         *exec.Cmd
	out, errOut strings.Builder
}

// startHandling starts `worker args...` and returns once the file started
// exists (its handler made it). The process is killed at the test's end
// if it still runs.
func startHandling(t *testing.T, env []string, started string, args ...string) *handling {
	t.Helper()
	h := &handling{cmd: exec.Command(filepath.Join(binDir, "worker"), args...)}
	h.cmd.Env = append(os.Environ(), env...)
	h.cmd.Stdout, h.cmd.Stderr = &h.out, &h.errOut
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.cmd.Process.Kill() }) // a no-op once it exited
	deadline := time.Now().Add(30 * time.Second)
	for _, err := os.Stat(started); err != nil; _, err = os.Stat(started) {
		if time.Now().After(deadline) {
			t.Fatalf("worker %v: its handler did not start: %v\n%s", args, err, h.errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return h
}

// wait waits for the command to exit and returns its output.
func (h *handling) wait() (out, errOut string, err error) {
	err = h.cmd.Wait()
	transcript.add(h.out.String(), h.errOut.String())
	return h.out.String(), h.errOut.String(), err
}
