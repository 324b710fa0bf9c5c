package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// Handlers that take real time, as users' do: the matrix of handler
// durations and worker modes, scheduler-like runs killed at random, and
// exec children that must die with their worker.

// perKillInHandler bounds how many handlers one SIGKILL can cut short.
func perKillInHandler(mode string) int {
	if mode == "concurrency-8" {
		return 8
	}
	return 1
}

// sleepyHandler is recordingHandler with a handler that takes d before it
// records the delivery (its effect) and exits 0.
func sleepyHandler(file string, d time.Duration) []string {
	return []string{"--", "sh", "-c", fmt.Sprintf(`read -r line; sleep %.3f; echo "$line" >> "%s"`, d.Seconds(), file)}
}

// handlerCell is one cell of the latency matrix.
type handlerCell struct {
	name    string
	sleep   time.Duration
	entries int
	args    []string // worker flags of the row
}

var handlerRows = []handlerCell{
	{"0ms", 0, 300, nil},
	{"50ms", 50 * time.Millisecond, 40, nil},
	// One batch of 6 × 2 s = 12 s at concurrency 1: longer than the 10 s
	// write timeout, which once expired before the batch's ack was sent.
	{"2s-batch-over-write-timeout", 2 * time.Second, 6, []string{"--count", "6"}},
	// One handler longer than the 10 s write timeout on its own.
	{"15s-handler-over-write-timeout", 15 * time.Second, 2, []string{"--count", "2"}},
	// Each handler outlasts --min-idle: a peer beating all the while must
	// not take entries still in progress.
	{"1.5s-over-min-idle", 1500 * time.Millisecond, 8, []string{"--count", "8", "--min-idle", "1s"}},
}

var handlerModes = []struct {
	name string
	args []string
}{
	{"plain", nil},
	{"archive-remote", nil}, // half the feed archived and trimmed first: the group catches it up
	{"dedupe-ttl", []string{"--dedupe-ttl", "1h"}},
	{"concurrency-8", []string{"--concurrency", "8"}},
}

// TestWorker_HandlerLatencyMatrix runs every handler duration in every
// mode with two workers looping as a scheduler would run them. Nobody dies
// or stops, so the checker must find nothing lost, no duplicate (no peer
// took work in progress), nothing dead-lettered and nothing pending.
func TestWorker_HandlerLatencyMatrix(t *testing.T) {
	for _, row := range handlerRows {
		for _, mode := range handlerModes {
			t.Run(row.name+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				latencyCell(t, row, mode.name, mode.args)
			})
		}
	}
}

func latencyCell(t *testing.T, row handlerCell, mode string, modeArgs []string) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
	if mode == "archive-remote" {
		env = faultEnv(srv, dir)
	}
	ids := feed(t, env, row.entries)
	if mode == "archive-remote" {
		if _, errOut, err := runArchiver(env, "run", "--stream", "events", "--keep-last", fmt.Sprint(row.entries/2)); err != nil {
			t.Fatalf("archiver: %v\n%s", err, errOut)
		}
		// A lease TTL shorter than a slow catch-up batch: the lease must be
		// renewed while the batch runs, or a peer catches up the same entries.
		modeArgs = []string{"--archive-remote", "file://" + filepath.Join(dir, "remote"), "--lease-ttl", "2s"}
	}
	rec := filepath.Join(dir, "handled")
	args := func(name string) []string {
		a := append([]string{"run", "--consumer", name, "--block", "300ms", "--max-attempts", "3", "--max-duration", "60s"}, row.args...)
		return append(append(a, modeArgs...), sleepyHandler(rec, row.sleep)...)
	}
	w1, w2 := loop(t, env, "worker", args("w1")...), loop(t, env, "worker", args("w2")...)
	deadline := time.Now().Add(3 * time.Minute)
	for len(handled(t, rec)) < len(ids) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	w1.finish()
	w2.finish()
	for _, l := range []*looper{w1, w2} {
		if l.failures > 0 {
			t.Fatalf("%d of %d worker runs failed: %s", l.failures, l.runs, l.lastErr)
		}
	}
	c := atLeastOnce(t, srv, newHistory(ids), rec)
	dead := srv.Client(t).XLen(context.Background(), deadKey).Val()
	report(t, scenario{Name: "slow handlers " + row.name + " " + mode, Runs: w1.runs + w2.runs, counts: c})
	if c.Duplicates != 0 || dead != 0 {
		t.Fatalf("no worker died or stopped, yet %d duplicates and %d dead letters: %s", c.Duplicates, dead, c)
	}
}

// TestWorker_ScheduledRunsKilledAtRandom runs workers the way a scheduler
// does (--max-duration), with handlers of 20-200 ms, and kills runs at
// random moments with SIGKILL or SIGTERM. No handler ever fails, so with
// --max-attempts 2 an entry may be dead-lettered only if kills cut its
// handler short at two starts (the handler logs each start): a kill burns
// an attempt only on entries whose handler started, and a slow batch acks
// its successes as they come. Duplicates come only from kills just after a
// handler finished, before its ack; with --dedupe-ttl the marker closes
// that window too.
func TestWorker_ScheduledRunsKilledAtRandom(t *testing.T) {
	for _, mode := range []struct {
		name string
		args []string
	}{{"plain", nil}, {"dedupe-ttl", []string{"--dedupe-ttl", "1h"}}, {"concurrency-8", []string{"--concurrency", "8"}}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			scheduledKills(t, mode.name, mode.args)
		})
	}
}

func scheduledKills(t *testing.T, mode string, modeArgs []string) {
	srv := testserver.Redis(t)
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
	entries, rounds := tier(150, 600), tier(12, 40)
	ids := feed(t, env, entries)
	rec := filepath.Join(t.TempDir(), "handled")
	started := rec + ".started" // every handler start, written before it works
	handler := []string{"--", "sh", "-c", `read -r line; echo "$line" >> "` + started + `"; sleep $(printf '0.%03d' $(( $(od -An -N1 -tu1 /dev/urandom) % 180 + 20 ))); echo "$line" >> "` + rec + `"`}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	sigkills, sigterms := 0, 0
	for i := range rounds {
		args := append([]string{"--consumer", []string{"w1", "w2"}[i%2], "--max-attempts", "2", "--min-idle", "1s",
			"--block", "300ms", "--max-duration", "3s", "--grace", "1s"}, modeArgs...)
		cmd, _, errOut := startWorker(t, env, append(args, handler...)...)
		time.Sleep(time.Duration(200+rng.IntN(2500)) * time.Millisecond)
		sig := []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM}[rng.IntN(2)]
		cmd.Process.Signal(sig)
		err := cmd.Wait()
		switch {
		case killedBySignal(err, syscall.SIGKILL):
			sigkills++
		case exitStatus(err) == 3 && sig == syscall.SIGTERM:
			sigterms++
		case err == nil: // it had finished its --max-duration before the signal
		case err != nil:
			t.Fatalf("worker %d after %v: %v\n%s", i, sig, err, errOut)
		}
	}
	t.Logf("%d runs killed with SIGKILL, %d stopped with SIGTERM", sigkills, sigterms)
	c := checkAtLeastOnce(t, srv, env, ids, rec)
	dead := srv.Client(t).XLen(context.Background(), deadKey).Val()
	report(t, scenario{Name: "scheduled runs killed at random " + mode, Runs: rounds + 1, Faults: sigkills + sigterms, counts: c})
	// No handler fails, so an entry is dead-lettered only when a kill hit
	// its handler while it ran, at each of its --max-attempts starts (a
	// poison entry would look the same); never for starts it did not have.
	starts := handled(t, started)
	for _, m := range srv.Client(t).XRange(context.Background(), deadKey, "-", "+").Val() {
		id := fmt.Sprint(m.Values["entry_id"])
		t.Logf("dead letter %s: attempts %v, deliveries %v, %d starts seen, %v", id, m.Values["attempts"], m.Values["deliveries"], starts[id], m.Values["reason"])
		if starts[id] < 2 {
			t.Errorf("%s dead-lettered after %d handler starts, fewer than --max-attempts 2 (%d kills)", id, starts[id], sigkills)
		}
	}
	if dead > int64(sigkills*perKillInHandler(mode)) {
		t.Fatalf("%d dead letters from %d SIGKILLs", dead, sigkills)
	}
	// A slow batch acks each success within ackEvery (20 ms), and the
	// running handlers die with the worker: a SIGKILL repeats at most the
	// handlers that had just finished, about one per concurrent handler; a
	// SIGTERM repeats nothing.
	perKill := 2
	if mode == "concurrency-8" {
		perKill = 16
	}
	if c.Duplicates > sigkills*perKill {
		t.Fatalf("%d duplicates from %d SIGKILLs (at most %d each): %s", c.Duplicates, sigkills, perKill, c)
	}
}

// TestWorker_ExecHandlerDiesWithItsWorker: a SIGKILLed worker takes its
// running exec handler with it (parent-death signal), so the handler never
// runs on beside the redelivery of its own entry.
func TestWorker_ExecHandlerDiesWithItsWorker(t *testing.T) {
	srv := testserver.Redis(t)
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
	feed(t, env, 1)
	pidFile := filepath.Join(t.TempDir(), "pid")
	// The shell replaces itself with sleep after writing its pid: the
	// handler process is the one the worker started.
	cmd, _, _ := startWorker(t, env, "--consumer", "w1", "--", "sh", "-c", `echo $$ > `+pidFile+`; exec sleep 60`)
	pid := waitPID(t, pidFile)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	deadline := time.Now().Add(3 * time.Second)
	for processAlive(pid) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	var d detector
	alive := processAlive(pid)
	d.fault(t, !alive, "exec handler %s outlived its SIGKILLed worker", pid)
	if alive {
		syscall.Kill(atoi(pid), syscall.SIGKILL)
	}
	report(t, scenario{Name: "exec handler dies with its SIGKILLed worker", Runs: 1, Faults: d.injected, Detected: d.detected, Promised: true})
}

// waitPID waits for a handler to write its pid to file and returns it.
func waitPID(t *testing.T, file string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(file); len(bytes.TrimSpace(b)) > 0 {
			return string(bytes.TrimSpace(b))
		}
	}
	t.Fatal("the handler never started")
	return ""
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid string) bool {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

func atoi(s string) int {
	var n int
	fmt.Sscan(s, &n)
	return n
}

// TestWorker_GraceExpiryKillsTheHandlerGroup: a handler that ignores
// SIGTERM and runs a child is killed with its child when --grace runs out,
// before the worker exits, and the stopped run exits 3 (interrupted).
func TestWorker_GraceExpiryKillsTheHandlerGroup(t *testing.T) {
	srv := testserver.Redis(t)
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
	feed(t, env, 1)
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd, out, errOut := startWorker(t, env, "--consumer", "w1", "--grace", "300ms",
		"--", "sh", "-c", `trap "" TERM; sleep 60 & echo $! > `+pidFile+`; wait`)
	pid := waitPID(t, pidFile)
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	if exitStatus(err) != 3 || !strings.Contains(out.String(), `"exit_reason":"cancelled"`) {
		t.Fatalf("worker after SIGTERM: %v, want exit 3\n%s%s", err, out, errOut)
	}
	var d detector
	alive := processAlive(pid) // checked once the worker is gone: no waiting
	d.fault(t, !alive, "the handler's child %s outlived the worker's grace", pid)
	if alive {
		syscall.Kill(atoi(pid), syscall.SIGKILL)
	}
	report(t, scenario{Name: "handler ignoring SIGTERM killed at the end of --grace", Runs: 1, Faults: d.injected, Detected: d.detected, Promised: true})
}

// TestWorker_NoHandlerOutlivesAKilledWorker: whatever the handler command
// does with its processes, a SIGKILLed worker leaves none of them running
// (within a second): a script that dash forks rather than replaces itself
// with, a compound command with a background child, a co-process with a
// child of its own, and eight handlers at once. Before the handler reaper,
// the first three ran on under PID 1, finishing entries the next run
// handled again.
func TestWorker_NoHandlerOutlivesAKilledWorker(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "handler.sh")
	// A plain script: dash forks it, the script forks sleep.
	if err := os.WriteFile(script, []byte("#!/bin/sh\nread -r line\necho $$ >> \"$PIDS\"\nsleep 60 &\necho $! >> \"$PIDS\"\nwait\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	coproc := filepath.Join(dir, "coproc.sh")
	if err := os.WriteFile(coproc, []byte("#!/bin/sh\necho $$ >> \"$PIDS\"\nsleep 60 &\necho $! >> \"$PIDS\"\nwhile read -r line; do :; done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		args  []string
		procs int // pids the handlers write before the kill
	}{
		{"exec-script-forked-by-dash", []string{"--exec", script}, 2},
		{"exec-compound", []string{"--exec", `read -r line; sleep 60 & echo $! >> "$PIDS"; echo $$ >> "$PIDS"; wait`}, 2},
		{"pipe-coprocess-with-a-child", []string{"--pipe", coproc}, 2},
		{"exec-script-concurrency-8", []string{"--concurrency", "8", "--exec", script}, 16},
	}
	survivors, kills := 0, 0
	var d detector // a kill is detected when every handler process died with the worker
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := testserver.Redis(t)
			pids := filepath.Join(t.TempDir(), "pids")
			env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g", "PIDS=" + pids}
			feed(t, env, 8)
			cmd, _, errOut := startWorker(t, env, append([]string{"--consumer", "w1", "--handler-env", "PIDS"}, tc.args...)...)
			var got []string
			for deadline := time.Now().Add(15 * time.Second); len(got) < tc.procs; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					cmd.Process.Kill()
					t.Fatalf("the handlers wrote %d of %d pids: %s", len(got), tc.procs, errOut)
				}
				b, _ := os.ReadFile(pids)
				got = strings.Fields(string(b))
			}
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			kills++
			time.Sleep(time.Second)
			var left []string
			for _, pid := range got {
				if processAlive(pid) {
					survivors++
					left = append(left, pid)
					syscall.Kill(atoi(pid), syscall.SIGKILL)
				}
			}
			d.fault(t, len(left) == 0, "handler processes %v outlived their SIGKILLed worker by a second", left)
		})
	}
	report(t, scenario{Name: "handler processes left by a SIGKILLed worker (detected: kills that took every handler process along)", Runs: kills,
		Faults: d.injected, Detected: d.detected, Promised: true, counts: counts{Lost: survivors}})
}

// TestWorker_FinishedHandlersAreNotRepeatedAfterAKill: handlers of 100 ms
// and 5 s at --concurrency 4 and 8, the worker SIGKILLed while the slow
// ones run. Every success is acked within about 20 ms of its handler's
// end, so after a kill no entry whose handler had finished more than 50 ms
// before it runs again (before, a success within 20 ms of the previous
// early ack waited for the batch's end).
func TestWorker_FinishedHandlersAreNotRepeatedAfterAKill(t *testing.T) {
	for _, concurrency := range []string{"4", "8"} {
		t.Run("concurrency-"+concurrency, func(t *testing.T) {
			srv := testserver.Redis(t)
			env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
			ids := feed(t, env, 40)
			dir := t.TempDir()
			starts, ends := filepath.Join(dir, "starts"), filepath.Join(dir, "ends")
			// Every fourth entry takes 5 s, the others 100 ms; each start and
			// end is recorded with its time in nanoseconds.
			handler := []string{"--", "sh", "-c", `doc=$(cat); id=$(echo "$doc" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p'); ` +
				`n=$(echo "$doc" | sed -n 's/.*"n":"\([0-9]*\)".*/\1/p'); echo "$id $(date +%s%N)" >> ` + starts + `; ` +
				`if [ $((n % 4)) -eq 0 ]; then sleep 5; else sleep 0.1; fi; echo "$id $(date +%s%N)" >> ` + ends}
			var kills []int64
			for round := range 4 {
				cmd, _, errOut := startWorker(t, env, append([]string{"--consumer", "w1", "--concurrency", concurrency, "--count", "8", "--block", "200ms"}, handler...)...)
				time.Sleep(time.Duration(700+200*round) * time.Millisecond)
				kills = append(kills, time.Now().UnixNano())
				cmd.Process.Signal(syscall.SIGKILL)
				if err := cmd.Wait(); err != nil && !killedBySignal(err, syscall.SIGKILL) {
					t.Fatalf("worker: %v\n%s", err, errOut)
				}
			}
			silt(t, "", env, "worker", append([]string{"run", "--consumer", "w1", "--concurrency", concurrency, "--block", "200ms"}, handler...)...)
			startsOf, endsOf := timesByID(t, starts), timesByID(t, ends)
			repeated := 0
			for _, id := range ids {
				if len(endsOf[id]) == 0 {
					t.Fatalf("%s never finished", id)
				}
				for _, e := range endsOf[id] {
					for _, s := range startsOf[id] {
						if s <= e {
							continue
						}
						// Run again after it finished: allowed only when a kill came
						// within 50 ms of its end, before its ack could be sent.
						for _, k := range kills {
							if e < k && k < s && k-e > int64(50*time.Millisecond) {
								repeated++
								t.Errorf("%s finished %s before a kill and ran again", id, time.Duration(k-e))
							}
						}
						break
					}
				}
			}
			report(t, scenario{Name: "finished handlers repeated after a SIGKILL (50 ms window), concurrency " + concurrency,
				Runs: len(kills) + 1, Faults: len(kills), counts: counts{Entries: len(ids), Duplicates: repeated}})
		})
	}
}

// timesByID reads "id nanoseconds" lines.
func timesByID(t *testing.T, file string) map[string][]int64 {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			t.Fatalf("%s: %q", file, line)
		}
		out[f[0]] = append(out[f[0]], n)
	}
	return out
}
