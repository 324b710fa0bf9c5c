package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// TestCluster_WorkerKillsAndArchiver runs the worker kill scenario and the
// archiver scenario against a 3-master, 3-replica cluster.
func TestCluster_WorkerKillsAndArchiver(t *testing.T) { killsAcrossArchive(t, testserver.Cluster(t)) }

// TestWorker_KillsAcrossArchive is the same scenario on one redis-server.
func TestWorker_KillsAcrossArchive(t *testing.T) { killsAcrossArchive(t, testserver.Redis(t)) }

// killsAcrossArchive kills workers at random while they read, with an
// archive run (which trims what the group has not read yet) half-way.
func killsAcrossArchive(t *testing.T, cl redisUnderTest) {
	cc := cl.Universal(t)
	dir := t.TempDir()
	env := []string{"SILT_REDIS_URL=" + cl.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g",
		"SILT_DATA_DIR=" + filepath.Join(dir, "data"), "SILT_ARCHIVE_REMOTE=file://" + filepath.Join(dir, "remote"),
		"SILT_ARCHIVE_CACHE=" + filepath.Join(dir, "cache"), "SILT_LEASE_TTL=1s"}
	ids := feed(t, env, tier(2000, 20000))
	rec := filepath.Join(dir, "handled")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	rounds := tier(6, 30)
	for i := range rounds {
		cmd, _, _ := startWorker(t, env, append([]string{"--consumer", fmt.Sprint("w", i%2), "--count", "50",
			"--concurrency", "4", "--min-idle", "300ms", "--block", "200ms"}, recordingHandler(rec)...)...)
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		if i%3 == 2 { // archive every third round: the rest of the group's reading crosses the archive
			silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "500", "--slice-entries", "200")
		}
	}
	silt(t, "", env, "worker", append([]string{"run", "--consumer", "final", "--min-idle", "1ms", "--block", "300ms",
		"--archive-remote", "file://" + filepath.Join(dir, "remote")}, recordingHandler(rec)...)...)
	for _, d := range cc.XRange(context.Background(), deadKey, "-", "+").Val() {
		t.Logf("dead letter %s: %s", d.Values["entry_id"], d.Values["reason"])
	}
	c := atLeastOnce(t, cl, newHistory(ids), rec)
	report(t, scenario{Name: "worker kills across archive runs", Runs: rounds + rounds/3 + 1, Faults: rounds, counts: c})
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "100")
	out := silt(t, "", env, "archiver", "read")
	if n := strings.Count(out, "\n"); n != len(ids) {
		t.Fatalf("merged read of %d entries, want %d", n, len(ids))
	}
	silt(t, "", env, "archiver", "verify")
}

// TestCluster_WorkerRandomKills is the worker kill scenario on a cluster
// (10 kills over 5,000 entries).
func TestCluster_WorkerRandomKills(t *testing.T) { randomKills(t, testserver.Cluster(t), 5000, 10) }

// TestCluster_ArchiverKillAtEachStep is the archiver kill scenario on a cluster.
func TestCluster_ArchiverKillAtEachStep(t *testing.T) { killAtEachStep(t, testserver.Cluster(t)) }

// TestCluster_Failover kills the master serving the queue while workers run;
// its replica takes over. Redis replication is asynchronous, so an append
// acknowledged just before the kill can be lost with the master: the test
// counts such losses and requires every entry that survived to be handled.
func TestCluster_Failover(t *testing.T) {
	cl := testserver.Cluster(t)
	cc := cl.Client(t)
	dir := t.TempDir()
	env := []string{"SILT_REDIS_URL=" + cl.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g", "SILT_REDIS_WAIT=20s"}
	ids := feed(t, env, 3000)
	rec := filepath.Join(dir, "handled")
	cmd, _, _ := startWorker(t, env, append([]string{"--consumer", "w1", "--count", "20", "--block", "200ms"}, recordingHandler(rec)...)...)
	time.Sleep(300 * time.Millisecond)
	master := cl.Master(t, streamKey)
	master.Stop()
	t.Logf("killed master %s", master.Addr)
	cmd.Wait() // it may finish, or fail on the lost connection
	cl.WaitOK(t)
	silt(t, "", env, "worker", append([]string{"run", "--consumer", "final", "--min-idle", "1ms", "--block", "500ms"}, recordingHandler(rec)...)...)
	counts := handled(t, rec)
	survived := map[string]bool{}
	for _, m := range cc.XRange(context.Background(), streamKey, "-", "+").Val() {
		survived[fmt.Sprint(m.Values["id"])] = true
	}
	lostInFailover, unhandled := 0, 0
	for _, id := range ids {
		switch {
		case !survived[id]:
			lostInFailover++
		case counts[id] == 0:
			unhandled++
		}
	}
	t.Logf("appended %d, survived the failover %d, lost with the master %d, handled %d distinct", len(ids), len(survived), lostInFailover, len(counts))
	if unhandled != 0 {
		t.Fatalf("%d entries that survived the failover were never handled", unhandled)
	}
}

// TestCluster_ArchiveAllManyStreams archives 100 streams in 100 queues
// (spread over the cluster's slots) with one run --all; a broken stream
// fails alone and the exit code says so.
func TestCluster_ArchiveAllManyStreams(t *testing.T) {
	cl := testserver.Cluster(t)
	cc := cl.Client(t)
	ctx := context.Background()
	for q := range 100 {
		ks, _ := stream.NewKeyspace("", fmt.Sprint("q", q))
		l, _ := stream.NewLog(cc, ks, "events", brand.EVT)
		batch := make([]stream.Fields, 30)
		for i := range batch {
			batch[i] = stream.Fields{"i": fmt.Sprint(i)}
		}
		if _, err := l.AppendBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	cc.Set(ctx, "emq:{broken}:stream:events", "not a stream", 0)
	dir := t.TempDir()
	env := []string{"SILT_REDIS_URL=" + cl.URL(), "SILT_DATA_DIR=" + filepath.Join(dir, "data"),
		"SILT_ARCHIVE_REMOTE=file://" + filepath.Join(dir, "remote")}
	out, errOut, err := runArchiver(env, "run", "--all", "--keep-last", "5", "--exact", "--concurrency", "8")
	if err == nil {
		t.Fatal("a run with a broken stream exited 0")
	}
	var sum struct {
		Streams []struct {
			Queue, Stream, Error string
			Archived, Trimmed    int64
		}
		Failed int
	}
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("summary %q: %v\n%s", out, err, errOut)
	}
	ok := 0
	for _, s := range sum.Streams {
		switch {
		case s.Queue == "broken" && s.Error == "":
			t.Fatal("the broken stream did not fail")
		case s.Queue != "broken" && (s.Archived != 25 || s.Trimmed != 25):
			t.Fatalf("stream {%s}:%s archived %d, trimmed %d: %s", s.Queue, s.Stream, s.Archived, s.Trimmed, s.Error)
		case s.Queue != "broken":
			ok++
		}
	}
	if ok != 100 || sum.Failed != 1 {
		t.Fatalf("%d streams archived, %d failed; want 100 and 1", ok, sum.Failed)
	}
}

// TestCluster_OneNodeURL gives the binaries one node's URL, no
// --redis-cluster: they find the cluster (INFO cluster) and reach the queues
// whose slots other masters serve, instead of failing with MOVED.
func TestCluster_OneNodeURL(t *testing.T) {
	cl := testserver.Cluster(t)
	cc := cl.Client(t)
	ctx := context.Background()
	node := "redis://" + cl.Nodes[0].Addr // as RedisCluster.URL gives each node
	nodeOf := map[string]bool{}           // the masters the queues landed on
	for q := range 12 {
		queue := fmt.Sprint("q", q)
		env := []string{"SILT_REDIS_URL=" + node, "SILT_QUEUE=" + queue, "SILT_STREAM=events"}
		feed(t, env, 3)
		silt(t, "", env, "worker", "run", "--group", "g", "--stdout")
		ks, _ := stream.NewKeyspace("", queue)
		key := ks.Stream("events")
		if n := cc.XLen(ctx, key).Val(); n != 3 {
			t.Fatalf("%s holds %d entries, want 3", key, n)
		}
		groups := cc.XInfoGroups(ctx, key).Val()
		if len(groups) != 1 || groups[0].Pending != 0 || groups[0].EntriesRead != 3 {
			t.Fatalf("%s: groups %+v, want g having read and acked 3", key, groups)
		}
		master, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		nodeOf[master.Options().Addr] = true
	}
	if len(nodeOf) < 2 {
		t.Fatalf("the queues landed on %d master(s): the test did not cross slots", len(nodeOf))
	}
}
