package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// producer appends small batches to the stream until stopped, recording every
// id Redis acknowledged.
type producer struct {
	mu      sync.Mutex
	ids     []string
	unknown int // entries of failed appends: maybe in the stream, maybe not
	stop    chan struct{}
	done    chan struct{}
}

// redisUnderTest is a single server or a cluster.
type redisUnderTest interface {
	URL() string
	Universal(tb testing.TB) redis.UniversalClient
}

func startProducer(t *testing.T, srv redisUnderTest, every time.Duration) *producer {
	t.Helper()
	ks, _ := stream.NewKeyspace("", "cm")
	l, err := stream.NewLog(srv.Universal(t), ks, "events", brand.EVT)
	if err != nil {
		t.Fatal(err)
	}
	p := &producer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for n := 0; ; n++ {
			select {
			case <-p.stop:
				return
			case <-time.After(every):
			}
			batch := []stream.Fields{{"n": fmt.Sprint(n), "pad": strings.Repeat("p", 40)}, {"n": fmt.Sprint(n), "k": "2"}}
			ids, err := l.AppendBatch(context.Background(), batch)
			p.mu.Lock()
			for _, id := range ids {
				p.ids = append(p.ids, id.String())
			}
			if err != nil {
				p.unknown += len(batch) - len(ids)
			}
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *producer) finish() []string {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ids
}

// history stops the producer and returns what it recorded.
func (p *producer) history() *history {
	h := newHistory(p.finish())
	h.unacked = p.unknown
	return h
}

// archiverEnv is the environment of archiver runs on one stream.
func archiverEnv(srv redisUnderTest, dataDir, remote string) []string {
	return []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events",
		"SILT_DATA_DIR=" + dataDir, "SILT_ARCHIVE_REMOTE=" + remote}
}

// runArchiver runs `archiver args...` to completion and returns its exit error.
func runArchiver(env []string, args ...string) (string, string, error) {
	return runBin(filepath.Join(binDir, "archiver"), env, args...)
}

// runBin runs bin to completion with env added and returns stdout, stderr
// and its exit error; the transcript keeps both.
func runBin(bin string, env []string, args ...string) (string, string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	transcript.add(out.String(), errOut.String())
	return out.String(), errOut.String(), err
}

// archiveHistory runs one clean archive pass with bin (the archiver), then
// checks the merged read against h. It returns the counts and how many
// entries came from the archive.
func archiveHistory(t *testing.T, bin string, env []string, h *history) (counts, int) {
	t.Helper()
	run := func(args ...string) string {
		out, errOut, err := runBin(bin, env, args...)
		if err != nil {
			t.Fatalf("archiver %v: %v\n%s", args, err, errOut)
		}
		return out
	}
	run("run", "--stream", "events", "--keep-last", "20")
	fromArchive := h.loadRead(t, run("read"))
	return h.checkRead(), fromArchive
}

// checkHistory runs one clean archive pass, then checks that the merged
// read holds every appended id exactly once, in order, and verify passes.
func checkHistory(t *testing.T, env []string, ids []string) counts {
	t.Helper()
	return checkRead(t, env, newHistory(ids))
}

// checkRead is checkHistory for a recorded history.
func checkRead(t *testing.T, env []string, h *history) counts {
	t.Helper()
	c, fromArchive := archiveHistory(t, filepath.Join(binDir, "archiver"), env, h)
	t.Logf("%s; read %d (%d from the archive)", c, len(h.read), fromArchive)
	if c.broken(true) {
		t.Fatalf("one history broken: %s", c)
	}
	if fromArchive == 0 {
		t.Fatal("nothing came from the archive: the test did not archive")
	}
	silt(t, "", env, "archiver", "verify")
	return c
}

// TestArchiver_NegativeControlTrimAboveW builds an archiver that trims one
// entry above the watermark on purpose: the history check must catch it.
func TestArchiver_NegativeControlTrimAboveW(t *testing.T) {
	dir := t.TempDir()
	broken := filepath.Join(dir, "archiver-broken")
	build := exec.Command("go", "build", "-tags", "silt_negative_trim", "-o", broken, "../cmd/archiver")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the negative control: %v\n%s", err, out)
	}
	srv := testserver.Redis(t)
	env := archiverEnv(srv, filepath.Join(dir, "data"), "file://"+filepath.Join(dir, "remote"))
	ids := feed(t, env, 500)
	cmd := exec.Command(broken, "run", "--stream", "events", "--keep-last", "100", "--slice-entries", "50", "--exact")
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("broken archiver: %v\n%s", err, out)
	}
	c, _ := archiveHistory(t, broken, env, newHistory(ids))
	report(t, scenario{Name: "negative control silt_negative_trim", Runs: 2, Faults: 1, Detected: b2i(c.broken(true)), counts: c})
	if !c.broken(true) || c.Lost == 0 {
		t.Fatal("the checker did not catch an archiver that trims above the watermark")
	}
}

// TestArchiver_KillAtEachStep kills `archiver run` with SIGKILL at each step
// boundary of a slice, five times each, while a producer appends.
func TestArchiver_KillAtEachStep(t *testing.T) { killAtEachStep(t, testserver.Redis(t)) }

func killAtEachStep(t *testing.T, srv redisUnderTest) {
	dir := t.TempDir()
	env := archiverEnv(srv, filepath.Join(dir, "data"), "file://"+filepath.Join(dir, "remote"))
	p := startProducer(t, srv, time.Millisecond)
	killed := 0
	for _, step := range []string{"after-fold", "segment-written", "segment-uploaded", "commit-put", "after-commit", "after-trim"} {
		for i := range 5 {
			time.Sleep(30 * time.Millisecond)
			_, errOut, err := runArchiver(append(env, fmt.Sprintf("SILT_FAILPOINT=%s:%d", step, 1+i%3)),
				"run", "--stream", "events", "--keep-last", "20", "--slice-entries", "25")
			switch {
			case killedBySignal(err, syscall.SIGKILL):
				killed++
			case err != nil:
				t.Fatalf("%s #%d: %v\n%s", step, i, err, errOut)
			}
		}
	}
	ids := p.finish()
	t.Logf("%d of 30 runs killed at their step", killed)
	if killed < 20 {
		t.Fatalf("only %d runs reached their failpoint", killed)
	}
	report(t, scenario{Name: "archiver kill at each step", Runs: 31, Faults: killed, counts: checkHistory(t, env, ids)})
}

// TestArchiver_RandomKills kills archiver runs at random moments.
func TestArchiver_RandomKills(t *testing.T) {
	kills := tier(50, 300)
	if testing.Short() {
		kills = 10
	}
	srv := testserver.Redis(t)
	dir := t.TempDir()
	env := archiverEnv(srv, filepath.Join(dir, "data"), "file://"+filepath.Join(dir, "remote"))
	p := startProducer(t, srv, 200*time.Microsecond)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 3))
	t.Logf("seed %d", seed)
	for range kills {
		cmd := exec.Command(filepath.Join(binDir, "archiver"), "run", "--stream", "events", "--keep-last", "20",
			"--slice-entries", "30", "--loop", "--every", "1ms")
		cmd.Env = append(os.Environ(), env...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(5+rng.IntN(60)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	}
	report(t, scenario{Name: "archiver random kills", Runs: kills + 1, Faults: kills, counts: checkHistory(t, env, p.finish())})
}

// TestArchiver_FourAtOnce starts four archivers on one stream and remote,
// three times: lost races happen, the history stays whole.
func TestArchiver_FourAtOnce(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	remote := "file://" + filepath.Join(dir, "remote")
	p := startProducer(t, srv, 100*time.Microsecond)
	time.Sleep(300 * time.Millisecond)
	lost := 0
	for round := range 3 {
		var wg sync.WaitGroup
		outs := make([]string, 4)
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				env := archiverEnv(srv, filepath.Join(dir, fmt.Sprint("data", i)), remote)
				out, errOut, err := runArchiver(env, "run", "--stream", "events", "--keep-last", "10", "--slice-entries", "7")
				if err != nil {
					t.Errorf("archiver %d round %d: %v\n%s", i, round, err, errOut)
				}
				outs[i] = out
			}()
		}
		wg.Wait()
		for _, out := range outs {
			var sum struct {
				Streams []struct {
					LostRaces int `json:"lost_races"`
				}
			}
			json.Unmarshal([]byte(out), &sum)
			for _, s := range sum.Streams {
				lost += s.LostRaces
			}
		}
	}
	t.Logf("%d lost races", lost)
	if lost == 0 {
		t.Fatal("no lost race: the archivers did not really race")
	}
	c := checkHistory(t, archiverEnv(srv, filepath.Join(dir, "data0"), remote), p.finish())
	report(t, scenario{Name: "four archivers at once (faults: lost races)", Runs: 13, Faults: lost, Detected: lost, counts: c})
}

// TestArchiver_MinIORestart stops MinIO mid-run: runs fail cleanly or go
// on, nothing is trimmed without a commit, nothing is lost.
func TestArchiver_MinIORestart(t *testing.T) {
	srv := testserver.Redis(t)
	minio := testserver.MinIO(t)
	bucket := minio.CreateBucket(t)
	dir := t.TempDir()
	env := append(archiverEnv(srv, filepath.Join(dir, "data"), minio.URL(bucket, "silt")), minio.Env()...)
	p := startProducer(t, srv, time.Millisecond)
	failures := 0
	for i := range 12 {
		if i == 4 {
			minio.Stop()
		}
		if i == 8 {
			minio.Start(t)
		}
		_, errOut, err := runArchiver(append(env, "SILT_REDIS_WAIT=1s"), "run", "--stream", "events", "--keep-last", "20", "--slice-entries", "50")
		if err != nil {
			failures++
			if strings.Contains(errOut, "panic") || !strings.Contains(errOut, "127.0.0.1") {
				t.Fatalf("run %d failed without naming the store: %s", i, errOut)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d of 12 runs failed while MinIO was down", failures)
	if failures == 0 {
		t.Fatal("no run failed while MinIO was down")
	}
	report(t, scenario{Name: "MinIO stopped and restarted", Runs: 13, Faults: 1, Detected: failures, counts: checkHistory(t, env, p.finish())})
}

// TestArchiver_CorruptionIsNamedAndPullRepairs corrupts a remote segment and
// a local page file.
func TestArchiver_CorruptionIsNamedAndPullRepairs(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	data, remote := filepath.Join(dir, "data"), filepath.Join(dir, "remote")
	env := archiverEnv(srv, data, "file://"+remote)
	feed(t, env, 300)
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "10", "--slice-entries", "100", "--exact")
	segs, _ := filepath.Glob(filepath.Join(data, "emq.cm.events", "segments", "*"))
	if len(segs) != 3 {
		t.Fatalf("%d local segments", len(segs))
	}
	// The local page file of the second commit.
	flipByte(t, segs[1])
	_, errOut, err := runArchiver(env, "verify")
	if err == nil || !strings.Contains(errOut, filepath.Base(segs[1])) {
		t.Fatalf("verify of a corrupt local file: %v %s", err, errOut)
	}
	if _, errOut, err := runArchiver(env, "read"); err == nil || !strings.Contains(errOut, filepath.Base(segs[1])) {
		t.Fatalf("read of a corrupt local file: %v %s", err, errOut)
	}
	silt(t, "", env, "archiver", "pull")
	silt(t, "", env, "archiver", "verify")
	if n := len(strings.Split(strings.TrimSpace(silt(t, "", env, "archiver", "read")), "\n")); n != 300 {
		t.Fatalf("after pull, read %d entries", n)
	}
	// Now the remote object: a packed commit, its segment first (the middle
	// byte is the segment's).
	remoteSegs, _ := filepath.Glob(filepath.Join(remote, "emq.cm.events", "commits", "*"))
	if len(remoteSegs) != 3 {
		t.Fatalf("%d remote commit objects, want 3", len(remoteSegs))
	}
	flipByte(t, remoteSegs[2])
	_, errOut, err = runArchiver(env, "verify")
	if err == nil || !strings.Contains(errOut, "emq.cm.events/commits/"+filepath.Base(remoteSegs[2])) || !strings.Contains(errOut, "repair: restore the named object") {
		t.Fatalf("verify of a corrupt remote object: %v %s; want the object and its repair named", err, errOut)
	}
}

func flipByte(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
