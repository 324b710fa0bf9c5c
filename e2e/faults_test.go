package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/faultproxy"
	"github.com/silt-dev/silt/internal/testing/testserver"
)

// looper runs one silt command again and again until stopped, counting runs
// and failures; a panic or an exit other than 0 and 1 fails the test.
type looper struct {
	runs, failures int
	lostRaces      int64
	mu             sync.Mutex // guards lastErr while the loop runs
	lastErr        string
	stop           chan struct{}
	done           chan struct{}
}

// lastError is the stderr of the loop's last failed run so far.
func (l *looper) lastError() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastErr
}

// waitFor polls cond until it holds, or fails the test after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, limit)
		}
	}
}

func loop(t *testing.T, env []string, bin string, args ...string) *looper {
	t.Helper()
	l := &looper{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			cmd := exec.CommandContext(ctx, filepath.Join(binDir, bin), args...)
			cmd.Env = append(os.Environ(), env...)
			var out, errOut strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &errOut
			err := cmd.Run()
			cancel()
			transcript.add(out.String(), errOut.String())
			l.runs++
			if err != nil {
				l.failures++
				l.mu.Lock()
				l.lastErr = errOut.String()
				l.mu.Unlock()
				// 1: a failure; 4: the archive refused as unproven (Redis
				// came back empty and no longer records it).
				if ee, ok := err.(*exec.ExitError); !ok || (ee.ExitCode() != 1 && ee.ExitCode() != 4) || strings.Contains(errOut.String(), "panic") {
					t.Errorf("%s %v: %v\n%s", bin, args, err, errOut.String())
				}
			}
			l.lostRaces += lostRaces(out.String())
		}
	}()
	return l
}

func (l *looper) finish() *looper {
	close(l.stop)
	<-l.done
	return l
}

func lostRaces(summary string) int64 {
	var sum struct {
		Streams []struct {
			LostRaces int64 `json:"lost_races"`
		}
	}
	json.Unmarshal([]byte(summary), &sum)
	var n int64
	for _, s := range sum.Streams {
		n += s.LostRaces
	}
	return n
}

// faultEnv is the environment of workers and archivers on srv's stream
// with an archive in dir.
func faultEnv(srv redisUnderTest, dir string) []string {
	return append(archiverEnv(srv, filepath.Join(dir, "data"), "file://"+filepath.Join(dir, "remote")),
		"SILT_GROUP=g", "SILT_ARCHIVE_CACHE="+filepath.Join(dir, "cache"), "SILT_REDIS_WAIT=3s")
}

// workerArgs are the arguments of a worker in the fault scenarios.
func workerArgs(name, rec string) []string {
	return append([]string{"run", "--consumer", name, "--count", "50", "--min-idle", "500ms", "--block", "200ms"},
		recordingHandler(rec)...)
}

var archiverArgs = []string{"run", "--stream", "events", "--keep-last", "200", "--slice-entries", "100"}

// TestFaults_RedisRestart kills redis-server (SIGKILL) and restarts it three
// times while a producer appends, two workers handle and an archiver
// archives. With appendonly yes and appendfsync always, nothing
// acknowledged is lost; with persistence off the loss must show in the
// checker's counts, and no program may crash.
func TestFaults_RedisRestart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		durable bool
	}{
		{"appendonly", []string{"--appendonly", "yes", "--appendfsync", "always"}, true},
		{"no-persistence", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testserver.Redis(t, tc.args...)
			dir := t.TempDir()
			env, rec := faultEnv(srv, dir), filepath.Join(dir, "handled")
			p := startProducer(t, srv, 2*time.Millisecond)
			w1 := loop(t, env, "worker", workerArgs("w1", rec)...)
			w2 := loop(t, env, "worker", workerArgs("w2", rec)...)
			ar := loop(t, env, "archiver", archiverArgs...)
			restarts := tier(3, 15)
			for i := range restarts {
				time.Sleep(800 * time.Millisecond)
				if !tc.durable && i == restarts-1 {
					// The refusal checked below needs a commit made before
					// Redis comes back empty; a loaded machine's archiver
					// may not have made one yet.
					waitFor(t, time.Minute, "archive commit before the last restart", func() bool {
						m, _ := filepath.Glob(filepath.Join(dir, "remote", "*", "commits", "*"))
						return len(m) > 0
					})
				}
				srv.Restart(t)
			}
			time.Sleep(800 * time.Millisecond)
			if !tc.durable {
				waitFor(t, time.Minute, "refusal by the archiver of the emptied Redis's remote", func() bool {
					return strings.Contains(ar.lastError(), "not proven to be this stream's")
				})
			}
			h := p.history()
			runs := w1.finish().runs + w2.finish().runs + ar.finish().runs
			failures := w1.failures + w2.failures + ar.failures
			t.Logf("%d runs, %d failed (last: %s)", runs, failures, strings.TrimSpace(ar.lastErr+w1.lastErr))
			status, errOut, err := runArchiver(env, "status")
			t.Logf("archiver status after the restarts: %v %s%s", err, status, errOut)

			if !tc.durable {
				// Nor does status report on an archive this Redis no
				// longer records.
				if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 4 || !strings.Contains(errOut, "never recorded") {
					t.Fatalf("archiver status of the emptied Redis's remote: %v\n%s%s", err, status, errOut)
				}
				// A Redis that came back empty holds none of the archive's
				// record: the archiver refuses to trim by the old watermark
				// until an operator adopts the remote as this stream's.
				// ("never recorded", or a run under way when Redis came back
				// empty: "lost the archive's record"; either way not proven.)
				if !strings.Contains(ar.lastErr, "not proven to be this stream's") {
					t.Fatalf("the archiver did not refuse the emptied Redis's remote: %s", ar.lastErr)
				}
				if _, errOut, err := runArchiver(env, "run", "--stream", "events", "--keep-last", "20", "--adopt-remote"); err != nil {
					t.Fatalf("archiver run --adopt-remote: %v\n%s", err, errOut)
				}
				status, errOut, err = runArchiver(env, "status")
				t.Logf("archiver status after the adoption: %v %s%s", err, status, errOut)
			}
			silt(t, "", env, "worker", append(workerArgs("final", rec), "--min-idle", "1ms")...)
			handledH := newHistory(h.appended)
			handledH.unacked = h.unacked
			handledH.loadHandled(t, rec)
			handledH.loadDead(t, srv.Universal(t), deadKey)
			hc := handledH.checkHandled()
			rc, fromArchive := archiveHistory(t, filepath.Join(binDir, "archiver"), env, h)
			t.Logf("handled: %s", hc)
			t.Logf("merged read: %s (%d from the archive)", rc, fromArchive)
			report(t, scenario{Name: "redis restart, " + tc.name + " (handled)", Runs: runs, Faults: restarts, Detected: failures, counts: hc})
			report(t, scenario{Name: "redis restart, " + tc.name + " (merged read)", Runs: runs, Faults: restarts, Detected: failures, counts: rc})
			if tc.durable && (hc.broken(false) || rc.broken(true)) {
				t.Fatalf("with appendonly yes: handled %s; read %s", hc, rc)
			}
			if !tc.durable && rc.Lost == 0 {
				t.Fatalf("persistence off lost nothing in the merged read (%s): the scenario did not test a loss", rc)
			}
			if !tc.durable && (err != nil || !strings.Contains(status, "the stream was recreated")) {
				t.Fatalf("archiver status does not say the stream was recreated: %v\n%s%s", err, status, errOut)
			}
			if fromArchive == 0 {
				t.Fatal("nothing was archived")
			}
		})
	}
}

// chaos injects a random fault on p every period until stop: cut every
// connection, delay each chunk by 20ms, or drop the replies for a while.
func chaos(p *faultproxy.Proxy, seed uint64, period time.Duration, stop chan struct{}) (faults chan int) {
	faults = make(chan int, 1)
	go func() {
		rng := rand.New(rand.NewPCG(seed, 7))
		n := 0
		defer func() { faults <- n }()
		for {
			select {
			case <-stop:
				p.SetDelay(0)
				p.DropReplies(false)
				return
			case <-time.After(period):
			}
			n++
			switch rng.IntN(3) {
			case 0:
				p.Cut()
			case 1:
				p.SetDelay(20 * time.Millisecond)
				time.Sleep(period / 2)
				p.SetDelay(0)
			case 2:
				p.DropReplies(true)
				time.Sleep(period / 2)
				p.DropReplies(false)
			}
		}
	}()
	return faults
}

// proxied is a Redis reached through a fault proxy.
type proxied struct {
	redisUnderTest
	addr string
}

func (p proxied) URL() string { return "redis://" + p.addr + "/0" }

// TestFaults_ProxyRedis puts a TCP fault proxy between the workers and
// archiver and Redis (the producer appends directly): cuts, delays and lost
// replies at random. Nothing is lost, and the history stays one.
func TestFaults_ProxyRedis(t *testing.T) {
	srv := testserver.Redis(t)
	px, err := faultproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	dir := t.TempDir()
	env, rec := faultEnv(proxied{srv, px.Addr}, dir), filepath.Join(dir, "handled")
	p := startProducer(t, srv, 2*time.Millisecond)
	stop := make(chan struct{})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	faults := chaos(px, seed, 300*time.Millisecond, stop)
	w1 := loop(t, env, "worker", workerArgs("w1", rec)...)
	w2 := loop(t, env, "worker", workerArgs("w2", rec)...)
	ar := loop(t, env, "archiver", archiverArgs...)
	time.Sleep(tier(6*time.Second, 60*time.Second))
	close(stop)
	nFaults := <-faults
	h := p.history()
	runs := w1.finish().runs + w2.finish().runs + ar.finish().runs
	failures := w1.failures + w2.failures + ar.failures
	t.Logf("%d faults, %d connections cut, %d reply bytes dropped; %d runs, %d failed", nFaults,
		px.Stats().Cut.Load(), px.Stats().DroppedBytes.Load(), runs, failures)
	direct := faultEnv(srv, dir)
	silt(t, "", direct, "worker", append(workerArgs("final", rec), "--min-idle", "1ms")...)
	hc := atLeastOnce(t, srv, newHistory(h.appended), rec)
	report(t, scenario{Name: "TCP faults between programs and Redis (handled)", Runs: runs, Faults: nFaults, Detected: failures, counts: hc})
	rc := checkRead(t, direct, h)
	report(t, scenario{Name: "TCP faults between programs and Redis (merged read)", Runs: runs, Faults: nFaults, Detected: failures, counts: rc})
	if ar.lostRaces != 0 {
		t.Fatalf("a lone archiver lost %d races: wrong fence verdicts", ar.lostRaces)
	}
}

// TestFaults_ProxyS3 puts the TCP fault proxy between the archiver and
// MinIO: cuts, delays and lost replies. A lone archiver never loses a race,
// so every lost race it reports would be a wrong fence verdict; nothing is
// trimmed without a commit, so nothing is lost.
func TestFaults_ProxyS3(t *testing.T) {
	srv := testserver.Redis(t)
	minio := testserver.S3(t, "minio")
	bucket := minio.CreateBucket(t)
	u, _ := url.Parse(minio.Endpoint)
	px, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	dir := t.TempDir()
	remote := func(endpoint string) string {
		return fmt.Sprintf("s3://%s/silt?endpoint=%s&region=us-east-1&path-style=true&timeout=2s", bucket, endpoint)
	}
	env := append(archiverEnv(srv, filepath.Join(dir, "data"), remote("http://"+px.Addr)), minio.Env()...)
	p := startProducer(t, srv, time.Millisecond)
	stop := make(chan struct{})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	faults := chaos(px, seed, 400*time.Millisecond, stop)
	ar := loop(t, env, "archiver", "run", "--stream", "events", "--keep-last", "100", "--slice-entries", "50")
	time.Sleep(tier(8*time.Second, 60*time.Second))
	close(stop)
	nFaults := <-faults
	ar.finish()
	h := p.history()
	t.Logf("%d faults, %d cuts, %d reply bytes dropped; %d runs, %d failed (last: %s)", nFaults, px.Stats().Cut.Load(),
		px.Stats().DroppedBytes.Load(), ar.runs, ar.failures, strings.TrimSpace(ar.lastErr))
	direct := append(archiverEnv(srv, filepath.Join(dir, "data"), remote(minio.Endpoint)), minio.Env()...)
	c := checkRead(t, direct, h)
	report(t, scenario{Name: "TCP faults between the archiver and MinIO", Runs: ar.runs, Faults: nFaults, Detected: ar.failures, counts: c})
	if ar.lostRaces != 0 {
		t.Fatalf("a lone archiver lost %d races: wrong fence verdicts", ar.lostRaces)
	}
	if ar.runs < 3 {
		t.Fatalf("only %d archiver runs", ar.runs)
	}
}

// minioBehindProxy starts MinIO with a new bucket and an HTTP fault proxy
// in front of it (closed with the test): the server (for its
// credentials), the proxy, and the archive remote URL through the proxy.
func minioBehindProxy(t *testing.T) (testserver.S3Server, *faultproxy.HTTP, string) {
	t.Helper()
	minio := testserver.S3(t, "minio")
	bucket := minio.CreateBucket(t)
	px, err := faultproxy.StartHTTP(minio.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	return minio, px, fmt.Sprintf("s3://%s/silt?endpoint=%s&region=us-east-1&path-style=true", bucket, px.URL)
}

// TestFaults_S3ErrorAnswers answers the archiver's requests with 500
// InternalError, 503 SlowDown and 409 ConditionalRequestConflict for a
// while: short bursts are retried with backoff and the run succeeds; a long
// burst fails the run; nothing is trimmed without a commit.
func TestFaults_S3ErrorAnswers(t *testing.T) {
	srv := testserver.Redis(t)
	minio, hp, s3url := minioBehindProxy(t)
	dir := t.TempDir()
	env := append(archiverEnv(srv, filepath.Join(dir, "data"), s3url), minio.Env()...)
	p := startProducer(t, srv, time.Millisecond)
	bursts := []struct {
		method, code string
		status, n    int
		fails        bool
	}{
		{"PUT", "SlowDown", http.StatusServiceUnavailable, 2, false},
		{"PUT", "InternalError", http.StatusInternalServerError, 2, false},
		{"PUT", "ConditionalRequestConflict", http.StatusConflict, 3, false},
		{"GET", "SlowDown", http.StatusServiceUnavailable, 2, false},
		{"", "SlowDown", http.StatusServiceUnavailable, 40, true},
		{"PUT", "ConditionalRequestConflict", http.StatusConflict, 40, true},
		{"PUT", "InternalError", http.StatusInternalServerError, 1, false},
	}
	runs, failures := 0, 0
	for i, b := range bursts {
		time.Sleep(100 * time.Millisecond)
		hp.Fail(b.method, b.status, b.code, b.n)
		out, errOut, err := runArchiver(env, "run", "--stream", "events", "--keep-last", "50", "--slice-entries", "100")
		runs++
		if err != nil {
			failures++
			if strings.Contains(errOut, "panic") || !strings.Contains(errOut, b.code) {
				t.Fatalf("burst %d failed without naming %s: %s", i, b.code, errOut)
			}
		}
		if (err != nil) != b.fails {
			t.Fatalf("burst %d (%d × %d %s): run error %v, want failure %v\n%s%s", i, b.n, b.status, b.code, err, b.fails, out, errOut)
		}
		if lr := lostRaces(out); lr != 0 {
			t.Fatalf("burst %d: %d lost races for a lone archiver", i, lr)
		}
		hp.Reset() // a burst not used up does not leak into the next run
	}
	h := p.history()
	c := checkRead(t, env, h)
	t.Logf("%d requests, %d answered with an injected error; %d of %d runs failed", hp.Requests.Load(), hp.Injected.Load(), failures, runs)
	report(t, scenario{Name: "S3 answers 500, 503 SlowDown, 409", Runs: runs + 1, Faults: int(hp.Injected.Load()), Detected: failures, counts: c})
}

// TestFaults_StoppedWorkerWakesLate stops a worker (SIGSTOP) in the middle
// of a batch; a peer reclaims its entries after min-idle and handles them;
// the stopped worker then wakes (SIGCONT), finishes its batch and acks late.
// Duplicates are counted, nothing is lost, nothing stays pending.
func TestFaults_StoppedWorkerWakesLate(t *testing.T) {
	srv := testserver.Redis(t)
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_GROUP=g"}
	ids := feed(t, env, 300)
	rec := filepath.Join(t.TempDir(), "handled")
	slow := []string{"--", "sh", "-c", `read -r line; sleep 0.01; echo "$line" >> "` + rec + `"`}
	cmd, out, errOut := startWorker(t, env, append([]string{"--consumer", "sleepy", "--count", "100", "--block", "200ms"}, slow...)...)
	for len(handled(t, rec)) < 20 {
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGSTOP)
	before := len(handled(t, rec))
	silt(t, "", env, "worker", append([]string{"run", "--consumer", "peer", "--min-idle", "500ms", "--block", "700ms"}, recordingHandler(rec)...)...)
	cmd.Process.Signal(syscall.SIGCONT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the woken worker: %v\n%s", err, errOut)
	}
	var sum struct{ Acked int64 }
	json.Unmarshal([]byte(strings.TrimSpace(out.String())), &sum)
	c := atLeastOnce(t, srv, newHistory(ids), rec)
	t.Logf("stopped after %d handled; the woken worker's summary: %s", before, strings.TrimSpace(out.String()))
	report(t, scenario{Name: "worker stopped (SIGSTOP), reclaimed, woken", Runs: 2, Faults: 1, counts: c})
	if c.Duplicates == 0 {
		t.Fatal("no duplicate: the stopped worker's batch was not reclaimed and finished late")
	}
	// Only the batch it was in the middle of: the batch it had read ahead
	// was reclaimed too, and is checked before it is handled.
	if c.Duplicates > 100 {
		t.Fatalf("%d duplicates: the woken worker handled more than its batch of 100 again", c.Duplicates)
	}
}

// TestFaults_EveryRequestBounded: Redis, then the object store, take every
// request and never answer (replies dropped, connections kept open). Each
// program must give up on its own, with a message naming the server, in
// bounded time: every request has a timeout.
func TestFaults_EveryRequestBounded(t *testing.T) {
	srv := testserver.Redis(t)
	rp, err := faultproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	dir := t.TempDir()
	env := append(faultEnv(proxied{srv, rp.Addr}, dir), "SILT_REDIS_WAIT=1s")
	feed(t, faultEnv(srv, dir), 50)
	rp.DropReplies(true)
	const bound = 45 * time.Second
	runs := 0
	var d detector
	for _, args := range [][]string{
		{"worker", "append", "a=1"},
		{"worker", "run", "--block", "200ms", "--", "true"},
		{"archiver", "run", "--stream", "events", "--keep-last", "1"},
		{"archiver", "read"},
	} {
		start := time.Now()
		code, _, errOut := exitCode(t, env, "", args[0], args[1:]...)
		took := time.Since(start)
		runs++
		t.Logf("%v against a silent Redis: exit %d after %v: %s", args, code, took.Round(time.Millisecond), strings.TrimSpace(errOut))
		d.fault(t, code == 1 && took <= bound && strings.Contains(errOut, rp.Addr),
			"%v: exit %d after %v, want 1 within %v naming %s", args, code, took, bound, rp.Addr)
	}
	rp.DropReplies(false)

	minio := testserver.S3(t, "minio")
	bucket := minio.CreateBucket(t)
	u, _ := url.Parse(minio.Endpoint)
	sp, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	s3env := append(archiverEnv(srv, filepath.Join(dir, "s3data"),
		fmt.Sprintf("s3://%s/silt?endpoint=http://%s&region=us-east-1&path-style=true&timeout=1s", bucket, sp.Addr)), minio.Env()...)
	sp.DropReplies(true)
	for _, args := range [][]string{{"run", "--stream", "events", "--keep-last", "1"}, {"read"}, {"status"}} {
		start := time.Now()
		code, _, errOut := exitCode(t, s3env, "", "archiver", args...)
		took := time.Since(start)
		runs++
		t.Logf("archiver %v against a silent store: exit %d after %v: %s", args, code, took.Round(time.Millisecond), strings.TrimSpace(errOut))
		d.fault(t, code == 1 && took <= bound && strings.Contains(errOut, sp.Addr),
			"archiver %v: exit %d after %v, want 1 within %v naming %s", args, code, took, bound, sp.Addr)
	}
	if n := srv.Client(t).XLen(context.Background(), streamKey).Val(); n != 50 {
		t.Fatalf("%d entries live after runs against a silent store, want 50 (no trim without a commit)", n)
	}
	report(t, scenario{Name: "silent Redis and silent store: every request bounded", Runs: runs, Faults: d.injected, Detected: d.detected, Promised: true})
}
