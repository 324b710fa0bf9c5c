package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

const (
	streamKey  = "emq:{cm}:stream:events"
	deadKey    = "emq:{cm}:dead:events:g"
	catchUpKey = "emq:{cm}:catchup:events:g"
)

// feed appends n entries with worker append and returns their branded ids.
func feed(t *testing.T, env []string, n int) []string {
	t.Helper()
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, `{"n":"%d"}`+"\n", i)
	}
	ids := strings.Fields(silt(t, in.String(), env, "worker", "append"))
	if len(ids) != n {
		t.Fatalf("appended %d, want %d", len(ids), n)
	}
	return ids
}

// recordingHandler is an exec handler that appends each delivery's JSON to
// file before the worker acks it (one short write, atomic with O_APPEND).
func recordingHandler(file string) []string {
	return []string{"--", "sh", "-c", `read -r line; echo "$line" >> "` + file + `"`}
}

// handled reads the recorder file: how often each id was handled.
func handled(t *testing.T, file string) map[string]int {
	t.Helper()
	h := newHistory(nil)
	h.loadHandled(t, file)
	return h.handled
}

// startWorker starts `worker run` as a child process.
func startWorker(t *testing.T, env []string, args ...string) (*exec.Cmd, *strings.Builder, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "worker"), append([]string{"run"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { transcript.add(out.String(), errOut.String()) }) // read after Wait
	return cmd, &out, &errOut
}

func killedBySignal(err error, sig syscall.Signal) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// checkAtLeastOnce runs one clean worker, then checks the history: every id
// handled or dead-lettered at least once, nothing pending. It returns the counts.
func checkAtLeastOnce(t *testing.T, srv redisUnderTest, env []string, ids []string, rec string) counts {
	t.Helper()
	silt(t, "", env, "worker", append([]string{"run", "--consumer", "final", "--min-idle", "1ms", "--block", "300ms"}, recordingHandler(rec)...)...)
	return atLeastOnce(t, srv, newHistory(ids), rec)
}

// atLeastOnce checks h (with the handler calls in rec and the group's dead
// letters) and that group g has nothing pending.
func atLeastOnce(t *testing.T, srv redisUnderTest, h *history, rec string) counts {
	t.Helper()
	rdb := srv.Universal(t)
	h.loadHandled(t, rec)
	h.loadDead(t, rdb, deadKey)
	c := h.checkHandled()
	pending := rdb.XPending(context.Background(), streamKey, "g").Val().Count
	gapsLeft := rdb.LLen(context.Background(), catchUpKey).Val()
	t.Logf("%s, pending %d, catch-up gaps left %d", c, pending, gapsLeft)
	if c.broken(false) || pending != 0 || gapsLeft != 0 {
		t.Fatalf("at least once broken: %s, pending %d, catch-up gaps left %d", c, pending, gapsLeft)
	}
	return c
}

// TestWorker_CrashAtEachPoint kills the worker with SIGKILL at each point of
// a batch; one clean run afterwards must leave nothing lost and nothing pending.
func TestWorker_CrashAtEachPoint(t *testing.T) {
	for _, point := range []string{"after-read", "mid-batch", "after-handle", "after-ack"} {
		t.Run(point, func(t *testing.T) {
			srv := testserver.Redis(t)
			env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
			ids := feed(t, env, 200)
			rec := filepath.Join(t.TempDir(), "handled")
			cmd, _, errOut := startWorker(t, append(env, "SILT_FAILPOINT="+point+":2"),
				append([]string{"--consumer", "w1", "--count", "50", "--block", "200ms"}, recordingHandler(rec)...)...)
			if err := cmd.Wait(); !killedBySignal(err, syscall.SIGKILL) {
				t.Fatalf("worker was not killed at %s: %v\n%s", point, err, errOut)
			}
			c := checkAtLeastOnce(t, srv, env, ids, rec)
			report(t, scenario{Name: "worker crash " + point, Runs: 2, Faults: 1, counts: c})
			// A kill between handle and ack redelivers what was handled and
			// not acked: here, since a batch that runs past 20 ms acks its
			// successes as they come, at most the last few of the batch.
			if point == "after-handle" && c.Duplicates > 50 {
				t.Fatalf("a kill after the handlers repeated %d entries, more than its batch of 50", c.Duplicates)
			}
		})
	}
}

// TestWorker_RandomKills kills workers at random moments while they work
// through a large feed with two consumer names, then runs one clean worker.
func TestWorker_RandomKills(t *testing.T) {
	entries, kills := tier(20000, 100000), tier(20, 100)
	if testing.Short() {
		entries, kills = 2000, 5
	}
	randomKills(t, testserver.Redis(t), entries, kills)
}

func randomKills(t *testing.T, srv redisUnderTest, entries, kills int) {
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
	ids := feed(t, env, entries)
	rec := filepath.Join(t.TempDir(), "handled")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	killed := 0
	for i := range kills {
		name := []string{"w1", "w2"}[i%2]
		cmd, _, errOut := startWorker(t, env, append([]string{"--consumer", name, "--count", "100", "--concurrency", "4",
			"--min-idle", "300ms", "--block", "200ms"}, recordingHandler(rec)...)...)
		time.Sleep(time.Duration(100+rng.IntN(900)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		if err := cmd.Wait(); killedBySignal(err, syscall.SIGKILL) {
			killed++
		} else if err != nil {
			t.Fatalf("worker %d failed: %v\n%s", i, err, errOut)
		}
	}
	t.Logf("%d of %d workers killed mid-run", killed, kills)
	c := checkAtLeastOnce(t, srv, env, ids, rec)
	report(t, scenario{Name: "worker random kills", Runs: kills + 1, Faults: killed, counts: c})
}

// TestWorker_SIGTERMMidBatch: in-flight handlers finish within the grace
// period, nothing unhandled is acked, the rest stays pending, exit code 0.
func TestWorker_SIGTERMMidBatch(t *testing.T) {
	srv := testserver.Redis(t)
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
	feed(t, env, 20)
	rec := filepath.Join(t.TempDir(), "handled")
	cmd, out, errOut := startWorker(t, env, "--consumer", "w1", "--count", "20", "--concurrency", "2", "--grace", "5s",
		"--", "sh", "-c", `read -r line; sleep 0.3; echo "$line" >> "`+rec+`"`)
	time.Sleep(800 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); exitStatus(err) != 3 {
		t.Fatalf("worker after SIGTERM: %v, want exit 3 (interrupted)\n%s", err, errOut)
	}
	var sum struct {
		Acked, Abandoned int64
		ExitReason       string `json:"exit_reason"`
	}
	json.Unmarshal([]byte(strings.TrimSpace(out.String())), &sum)
	counts := handled(t, rec)
	rdb := srv.Client(t)
	pending := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: streamKey, Group: "g", Start: "-", End: "+", Count: 100}).Val()
	pendingIDs := map[string]bool{}
	for _, p := range pending {
		pendingIDs[p.ID] = true
	}
	// Every entry not pending was acked; every acked entry must have been handled.
	for _, m := range rdb.XRange(context.Background(), streamKey, "-", "+").Val() {
		if !pendingIDs[m.ID] && counts[fmt.Sprint(m.Values["id"])] == 0 {
			t.Fatalf("entry %s acked but never handled", m.ID)
		}
	}
	if sum.ExitReason != "cancelled" || sum.Acked != int64(len(counts)) || sum.Acked == 0 || len(pending) != 20-len(counts) {
		t.Fatalf("summary %+v, handled %d, pending %d", sum, len(counts), len(pending))
	}
}

// exitStatus returns a finished command's exit code (0 for a nil error, -1
// when it did not exit by itself).
func exitStatus(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	return -1
}
