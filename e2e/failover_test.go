package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
)

// Failover: Redis replicates asynchronously, so a replica promoted to
// master holds an older record of the archive than the remote, and may
// hold entries the archive lacks (written to it after the promotion while
// the old master still committed, or by a producer whose clock is behind).
// These tests run the real binaries against a real master and replica
// and check the promise at the point of harm: every entry the surviving
// node acknowledged is read back, then kept or archived, never trimmed
// unarchived; status counts what happened.

// replicated starts a master and a replica of it, synced.
func replicated(t *testing.T) (m, r *testserver.RedisServer) {
	t.Helper()
	m = testserver.Redis(t, "--repl-diskless-sync-delay", "0")
	_, port, _ := net.SplitHostPort(m.Addr)
	r = testserver.Redis(t, "--replicaof", "127.0.0.1", port)
	waitSynced(t, m, r)
	return m, r
}

// waitSynced waits until the replica r has every write of its master m.
func waitSynced(t *testing.T, m, r *testserver.RedisServer) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if info := r.Client(t).Info(ctx, "replication").Val(); strings.Contains(info, "master_link_status:up") {
			if n, err := m.Client(t).Wait(ctx, 1, time.Second).Result(); err == nil && n >= 1 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("replica %s never synced with %s", r.Addr, m.Addr)
}

// failoverPair starts a master and its replica, each with an archiver's
// environment of its own (its data directory) on one local-directory
// remote, under dir.
func failoverPair(t *testing.T) (m, r *testserver.RedisServer, envM, envR []string, dir string) {
	t.Helper()
	m, r = replicated(t)
	dir = t.TempDir()
	remote := "file://" + filepath.Join(dir, "remote")
	return m, r, archiverEnv(m, filepath.Join(dir, "data-m"), remote), archiverEnv(r, filepath.Join(dir, "data-r"), remote), dir
}

// promote makes r a master (REPLICAOF NO ONE), as Sentinel or an operator does.
func promote(t *testing.T, r *testserver.RedisServer) {
	t.Helper()
	if err := r.Client(t).SlaveOf(context.Background(), "NO", "ONE").Err(); err != nil {
		t.Fatalf("promote %s: %v", r.Addr, err)
	}
}

// readIDs runs archiver read with env and returns how often each branded
// id came back, and how many lines.
func readIDs(t *testing.T, env []string, args ...string) (map[string]int, int) {
	t.Helper()
	out := silt(t, "", env, "archiver", append([]string{"read"}, args...)...)
	seen := map[string]int{}
	lines := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var e struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("archiver read: %q: %v", line, err)
		}
		seen[e.ID]++
		lines++
	}
	return seen, lines
}

// missingOnce returns the ids of want that seen does not hold exactly once.
func missingOnce(seen map[string]int, want ...[]string) []string {
	var bad []string
	for _, ids := range want {
		for _, id := range ids {
			if seen[id] != 1 {
				bad = append(bad, fmt.Sprintf("%s (read %d times)", id, seen[id]))
			}
		}
	}
	return bad
}

// archiverStatus returns archiver status --format json with env.
func archiverStatus(t *testing.T, env []string) map[string]any {
	t.Helper()
	out := silt(t, "", env, "archiver", "status", "--format", "json")
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("archiver status: %q: %v", out, err)
	}
	return st
}

// TestFailover_SplitBrainKeepsEveryReceipt: replica R is promoted while
// clients of the old master M go on appending and M's archiver goes on
// committing. R acknowledges 30 entries that M's next commit moves the
// remote's W past. A merged read on R returns them; R's archiver, once
// its top passes that W, trims only what the archive holds and keeps
// them (exit 6), and status counts them.
func TestFailover_SplitBrainKeepsEveryReceipt(t *testing.T) {
	m, r, envM, envR, dir := failoverPair(t)
	run := []string{"run", "--stream", "events", "--keep-last", "10", "--exact"}

	base := feed(t, envM, 50)
	silt(t, "", envM, "archiver", run...)
	waitSynced(t, m, r)
	promote(t, r)
	onR := feed(t, envR, 30) // acknowledged by R, the new master
	time.Sleep(5 * time.Millisecond)
	onM := feed(t, envM, 30) // and by M, which still serves its clients
	silt(t, "", envM, "archiver", run...)

	seen, _ := readIDs(t, envR)
	if bad := missingOnce(seen, base, onR, onM[:20]); len(bad) > 0 {
		t.Fatalf("merged read on the promoted replica, before its run: %d entries not read exactly once: %v", len(bad), bad)
	}
	more := feed(t, envR, 30) // R's top passes the remote's W
	out, errOut, err := runArchiver(envR, run...)
	if code := exitStatus(err); code != 6 || !strings.Contains(out, `"kept_unarchived":30`) {
		t.Fatalf("archiver run on R: exit %d, want 6 with 30 entries kept:\n%s\n%s", code, out, errOut)
	}
	// A cold read (a fresh data directory) of R's history.
	seen, lines := readIDs(t, append(envR, "SILT_DATA_DIR="+filepath.Join(dir, "cold")))
	if bad := missingOnce(seen, base, onR, onM[:20], more); len(bad) > 0 {
		t.Fatalf("cold read after R's run: %d entries not read exactly once: %v", len(bad), bad)
	}
	st := archiverStatus(t, envR)
	if st["live_below_w_unarchived"] != 30.0 || st["recovered_never_held"] != 20.0 || st["lost_outside"] != 0.0 || st["stream_recreated"] != false {
		t.Fatalf("status on R: %v", st)
	}
	report(t, scenario{Name: "failover: split brain", Runs: 6, Faults: 1, Detected: 1, Promised: true,
		counts: counts{Entries: len(base) + len(onR) + len(more), Lost: len(missingOnce(seen, base, onR, more))}})
	t.Logf("R's run kept 30, read %d entries", lines)
}

// TestFailover_ProducerBehindTheWatermark: M archives entries its replica
// R never received, then dies, and R is promoted. A producer on R writes
// ids between R's top and the remote's W (a clock behind, or explicit
// ids). R's reads return them, R's run refuses (W above its top) without
// moving its record, and once R's top passes W its run keeps them.
func TestFailover_ProducerBehindTheWatermark(t *testing.T) {
	m, r, envM, envR, dir := failoverPair(t)
	run := []string{"run", "--stream", "events", "--keep-last", "5", "--exact"}
	ctx := context.Background()

	base := feed(t, envM, 40)
	silt(t, "", envM, "archiver", run...)
	waitSynced(t, m, r)
	// R stops receiving M's writes (its master is unreachable), M goes on.
	if err := r.Client(t).SlaveOf(ctx, "127.0.0.1", "1").Err(); err != nil {
		t.Fatal(err)
	}
	rTop := lastID(t, r.Client(t))
	time.Sleep(20 * time.Millisecond)
	lost := feed(t, envM, 30) // R never gets these
	silt(t, "", envM, "archiver", run...)
	m.Stop()
	promote(t, r)
	recBefore := r.Client(t).HGetAll(ctx, "emq:{cm}:archive:events").Val()

	// Two entries with explicit ids between R's top and the remote's W.
	behind := []string{}
	for i := range 2 {
		sid := brand.StreamID{MS: rTop.MS + 1 + uint64(i), Seq: 0}
		id, _ := brand.New(brand.EVT, sid)
		if err := r.Client(t).XAdd(ctx, &redis.XAddArgs{Stream: streamKey, ID: sid.String(), Values: []string{"id", id.String(), "n", "behind"}}).Err(); err != nil {
			t.Fatal(err)
		}
		behind = append(behind, id.String())
	}
	seen, _ := readIDs(t, envR)
	if bad := missingOnce(seen, base, lost[:25], behind); len(bad) > 0 {
		t.Fatalf("merged read on R: %d entries not read exactly once: %v", len(bad), bad)
	}
	if _, _, err := runArchiver(envR, run...); exitStatus(err) != 4 {
		t.Fatalf("archiver run on R with the remote's W above its top: exit %d, want 4 (refused)", exitStatus(err))
	}
	if after := r.Client(t).HGetAll(ctx, "emq:{cm}:archive:events").Val(); fmt.Sprint(after) != fmt.Sprint(recBefore) {
		t.Fatalf("a refused run moved the record: %v, then %v", recBefore, after)
	}
	time.Sleep(10 * time.Millisecond)
	more := feed(t, envR, 10)
	if out, errOut, err := runArchiver(envR, run...); exitStatus(err) != 6 || !strings.Contains(out, `"kept_unarchived":2`) {
		t.Fatalf("archiver run on R: exit %d, want 6 with 2 kept:\n%s\n%s", exitStatus(err), out, errOut)
	}
	seen, _ = readIDs(t, append(envR, "SILT_DATA_DIR="+filepath.Join(dir, "cold")))
	if bad := missingOnce(seen, base, lost[:25], behind, more); len(bad) > 0 {
		t.Fatalf("cold read on R after its run: %d entries not read exactly once: %v", len(bad), bad)
	}
	st := archiverStatus(t, envR)
	if st["live_below_w_unarchived"] != 2.0 || st["recovered_never_held"] != 25.0 || st["lost_outside"] != 0.0 {
		t.Fatalf("status on R: %v", st)
	}
	report(t, scenario{Name: "failover: producer behind the watermark", Runs: 6, Faults: 2, Detected: 2, Promised: true,
		counts: counts{Entries: len(base) + len(behind) + len(more), Lost: len(missingOnce(seen, base, behind, more))}})
}

// lastID is the stream's last entry id.
func lastID(t *testing.T, rdb *redis.Client) brand.StreamID {
	t.Helper()
	e, err := rdb.XRevRangeN(context.Background(), streamKey, "+", "-", 1).Result()
	if err != nil || len(e) != 1 {
		t.Fatalf("last entry: %v %v", e, err)
	}
	sid, err := brand.ParseStreamID(e[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	return sid
}

// TestFailover_AppendWaitsForReplicas: worker append --wait-replicas
// prints a receipt only once a replica holds the entry; with the replica
// gone it exits 7 naming the entries; a retry under the named id
// (--id) writes it once, and every receipt survives a promotion of the
// replica.
func TestFailover_AppendWaitsForReplicas(t *testing.T) {
	m, r := replicated(t)
	envM := []string{"SILT_REDIS_URL=" + m.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events"}
	var in strings.Builder
	for i := range 200 {
		fmt.Fprintf(&in, `{"n":"%d"}`+"\n", i)
	}
	receipts := strings.Fields(silt(t, in.String(), envM, "worker", "append", "--wait-replicas", "1", "--batch", "50"))
	if len(receipts) != 200 {
		t.Fatalf("%d receipts, want 200", len(receipts))
	}
	r.Stop()
	out, errOut, err := runWorkerCmd(envM, "append", "--wait-replicas", "1", "--wait-timeout", "200ms", "n=late")
	if exitStatus(err) != 7 || out != "" || !strings.Contains(errOut, "may or may not survive a failover: EVT_") {
		t.Fatalf("append with the replica down: exit %d, stdout %q, stderr %q; want exit 7, no receipt, the entry named", exitStatus(err), out, errOut)
	}
	named := regexp.MustCompile(`EVT_[0-9A-Z]{23}`).FindString(errOut)
	r.Restart(t)
	waitSynced(t, m, r)
	// The producer retries the entry under the id it was told of: written once.
	if got := strings.TrimSpace(silt(t, "", envM, "worker", "append", "--id", named, "--wait-replicas", "1", "n=late")); got != named {
		t.Fatalf("retry under --id %s printed %q", named, got)
	}
	receipts = append(receipts, named)
	m.Stop()
	promote(t, r)
	envR := []string{"SILT_REDIS_URL=" + r.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_DATA_DIR=" + t.TempDir()}
	seen, _ := readIDs(t, envR)
	if bad := missingOnce(seen, receipts); len(bad) > 0 {
		t.Fatalf("after the promotion, %d receipts not read exactly once: %v", len(bad), bad)
	}
	report(t, scenario{Name: "failover: receipts after WAIT", Runs: 3, Faults: 1, Detected: 1, Promised: true,
		counts: counts{Entries: len(receipts), Lost: len(missingOnce(seen, receipts))}})
}

// TestFailover_NativeProducersWaitForReplicas: the Python (redis-py) and
// Node (ioredis) producers of docs/producers with WAIT_REPLICAS=1 print
// their receipts while a replica acknowledges, and stop without one when
// it does not.
func TestFailover_NativeProducersWaitForReplicas(t *testing.T) {
	python, nodePath := os.Getenv("SILT_PYTHON"), os.Getenv("SILT_NODE_PATH")
	if python == "" || nodePath == "" {
		testserver.Absent(t, "the producer clients (python3-redis, ioredis)", `eval "$(scripts/clients.sh)"`)
	}
	m, r := replicated(t)
	env := append(os.Environ(), "REDIS_URL="+m.URL(), "STREAM="+streamKey, "KIND=EVT", "NODE_PATH="+nodePath, "WAIT_REPLICAS=1")
	producers := [][]string{{python, "../docs/producers/producer.py"}, {"node", "../docs/producers/producer.js"}}
	waitMS := "5000"
	produce := func(argv []string) (string, string, error) {
		cmd := exec.Command(argv[0], append(argv[1:], "5")...)
		cmd.Env = append(env, "WAIT_MS="+waitMS)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		return string(out), stderr.String(), err
	}
	for _, p := range producers {
		out, errOut, err := produce(p)
		if err != nil || len(strings.Fields(out)) != 5 {
			t.Fatalf("%s with a replica: %v, %q\n%s", p[1], err, out, errOut)
		}
	}
	r.Stop()
	waitMS = "300"
	for _, p := range producers {
		out, errOut, err := produce(p)
		if err == nil || out != "" || !strings.Contains(errOut, "may or may not survive a failover") {
			t.Fatalf("%s without its replica: %v, stdout %q, stderr %q; want a failure and no receipt", p[1], err, out, errOut)
		}
	}
}
