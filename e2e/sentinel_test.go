package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// failoverSeeds are the seeds of the Sentinel failover schedules:
// SILT_FAILOVER_SEEDS (comma-separated), else 1 and 2 (one kills the
// master, the other freezes it; each seed picks when).
func failoverSeeds(t *testing.T) []uint64 {
	raw := os.Getenv("SILT_FAILOVER_SEEDS")
	if raw == "" {
		return []uint64{1, 2}
	}
	var seeds []uint64
	for _, f := range strings.Split(raw, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			t.Fatalf("SILT_FAILOVER_SEEDS: %q: %v", f, err)
		}
		seeds = append(seeds, n)
	}
	return seeds
}

// TestFailover_Sentinel: producers append through Sentinel with
// --wait-replicas 1 while archiver run --loop archives and trims; the
// master is SIGKILLed (odd seeds) or SIGSTOPped past the sentinels'
// down-after (even seeds) at a point the seed picks, and Sentinel promotes
// a replica. The clients follow the promotion. After it, every receipt is
// in a cold read of the history exactly once, nothing is read twice, and a
// worker of the group handles every receipt at least once.
func TestFailover_Sentinel(t *testing.T) {
	for _, seed := range failoverSeeds(t) {
		t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) { sentinelSchedule(t, seed) })
	}
}

func sentinelSchedule(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5e471e1))
	kill := seed%2 == 1
	s := testserver.WithSentinels(t, 2)
	dir := t.TempDir()
	remote := "file://" + filepath.Join(dir, "remote")
	env := []string{"SILT_REDIS_URL=" + s.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g",
		"SILT_DATA_DIR=" + filepath.Join(dir, "data"), "SILT_ARCHIVE_REMOTE=" + remote}
	silt(t, "", env, "worker", "run", "--block", "100ms", "--stdout") // the group, from the start

	archiver := exec.Command(filepath.Join(binDir, "archiver"), "run", "--stream", "events", "--keep-last", "20", "--exact",
		"--loop", "--every", "100ms", "--redis-wait", "30s")
	archiver.Env = append(os.Environ(), env...)
	var archOut, archErr strings.Builder
	archiver.Stdout, archiver.Stderr = &archOut, &archErr
	if err := archiver.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { transcript.add(archOut.String(), archErr.String()) })

	var (
		mu       sync.Mutex
		receipts []string
		unknown  int // appends that exited non-zero: their entries may or may not exist
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	for p := range 2 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				var in strings.Builder
				for i := range 10 {
					fmt.Fprintf(&in, `{"producer":"%d","n":"%d-%d"}`+"\n", p, n, i)
				}
				cmd := exec.Command(filepath.Join(binDir, "worker"), "append", "--wait-replicas", "1", "--wait-timeout", "2s", "--redis-wait", "30s")
				cmd.Env = append(os.Environ(), env...)
				cmd.Stdin = strings.NewReader(in.String())
				out, err := cmd.Output()
				mu.Lock()
				receipts = append(receipts, strings.Fields(string(out))...)
				if err != nil {
					unknown++
				}
				mu.Unlock()
			}
		})
	}
	time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
	old := s.MasterAddr(t)
	master := s.Server(old)
	if kill {
		master.Stop()
	} else {
		master.Signal(syscall.SIGSTOP)
	}
	deadline := time.Now().Add(60 * time.Second)
	for s.MasterAddr(t) == old {
		if time.Now().After(deadline) {
			t.Fatalf("sentinel did not promote a replica within a minute")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !kill {
		master.Signal(syscall.SIGCONT) // back as a replica of the new master: sentinel reconfigures it
	}
	time.Sleep(time.Duration(1000+rng.IntN(1000)) * time.Millisecond)
	close(stop)
	wg.Wait()
	archiver.Process.Signal(syscall.SIGTERM)
	if err := archiver.Wait(); err != nil {
		t.Fatalf("archiver run --loop across the failover: %v\n%s", err, archErr.String())
	}
	if out, errOut, err := runArchiver(env, "run", "--stream", "events", "--keep-last", "20", "--exact"); err != nil && exitStatus(err) != 6 {
		t.Fatalf("archiver run after the failover: exit %d\n%s\n%s", exitStatus(err), out, errOut)
	}

	seen, lines := readIDs(t, append(env, "SILT_DATA_DIR="+filepath.Join(dir, "cold")))
	bad := missingOnce(seen, receipts)
	// A reader on a replica (replica_only) reads the same history, once
	// the replicas have it.
	if !kill {
		master.Stop() // the old master, a replica again, may still be resyncing: read from the other
	}
	waitReplicated(t, s)
	onReplica, _ := readIDs(t, append(env, "SILT_REDIS_URL="+s.URL()+"&replica_only=true", "SILT_DATA_DIR="+filepath.Join(dir, "cold-replica")))
	if n := len(missingOnce(onReplica, receipts)); n > 0 || len(onReplica) != len(seen) {
		t.Fatalf("a read from a replica (replica_only): %d receipts not read once, %d ids against %d on the master", n, len(onReplica), len(seen))
	}
	dups := 0
	for _, n := range seen {
		dups += max(n-1, 0)
	}
	handled := map[string]int{}
	out := silt(t, "", env, "worker", "run", "--consumer", "final", "--min-idle", "1ms", "--block", "300ms",
		"--archive-remote", remote, "--archive-cache", filepath.Join(dir, "cache"), "--stdout")
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var d struct {
			ID string `json:"id"`
		}
		if json.Unmarshal([]byte(line), &d) == nil {
			handled[d.ID]++
		}
	}
	unhandled := 0
	for _, id := range receipts {
		if handled[id] == 0 {
			unhandled++
		}
	}
	fault := "SIGSTOP"
	if kill {
		fault = "SIGKILL"
	}
	report(t, scenario{Name: "failover: sentinel, master " + fault, Runs: 4, Faults: 1, Detected: 1,
		counts: counts{Entries: len(receipts), Handled: len(handled), Lost: len(bad), Duplicates: dups}})
	t.Logf("seed %d (%s): %d receipts, %d appends of unknown outcome, %d read, %d handled", seed, fault, len(receipts), unknown, lines, len(handled))
	if len(receipts) == 0 {
		t.Fatal("no receipt: the producers never got through")
	}
	if len(bad) > 0 || dups > 0 || unhandled > 0 {
		t.Fatalf("%d receipts not read exactly once (%v), %d ids read twice, %d receipts never handled", len(bad), bad, dups, unhandled)
	}
}

// waitReplicated waits until the master's replicas acknowledged its writes
// (WAIT on a connection that wrote: a PING does not count, a SET does).
func waitReplicated(t *testing.T, s *testserver.Sentinels) {
	t.Helper()
	ctx := context.Background()
	c := s.Universal(t).(*redis.Client)
	conn := c.Conn()
	defer conn.Close()
	if err := conn.Set(ctx, "emq:{cm}:failover-probe", "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Wait(ctx, 1, 10*time.Second).Result(); err != nil || n < 1 {
		t.Fatalf("no replica acknowledged the master's writes: %d, %v", n, err)
	}
}
