package peers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/benchratio"
	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// BenchmarkBullMQ_Ratio (P13): silt ÷ BullMQ 6.7, the job queue a Node or
// polyglot team would pick, on the same redis-server, rounds alternating.
// Each side handles the same number of jobs from a queue filled before its
// timing starts (BullMQ: addBulk; silt: AppendBatch into a stream read by
// a fresh group):
//
//   - go-noop-c1, go-noop-c8: silt's Go worker (Consumer.Run, a no-op
//     handler) ÷ BullMQ's Worker with a no-op processor, at concurrency 1
//     and 8 (goal >= 10);
//   - pipe-noop-c1, pipe-noop-c8: `worker run --pipe 'node handler.js'`
//     (the worker binary, its Node co-process started in the timing) ÷
//     BullMQ, the polyglot user's path (goal >= 2.5);
//   - pipe-10ms-c8: both with a Node handler taking 10 ms, concurrency 8
//     (goal >= 1; 800 jobs/s is the cap).
//
// Per job, silt reads (XREADGROUP of up to 1,000), records the handler's
// start, acks (XACK carried with the next read); BullMQ moves the job
// between lists and sets under a lock, keeps the completed job (its
// default) and writes its events stream. Both sides' redis-server CPU per
// job is reported (silt-redis-µs, bullmq-redis-µs). The pipe cases also
// time their raw floor beside BullMQ's round (pipeFloor, out of that
// round's time): reachable is the floor ÷ BullMQ, of-floor silt ÷ the
// floor, floor-items/s its rate. Needs BullMQ from
// `scripts/clients.sh --bench` (SILT_NODE_PATH).
//
//	cd bench && go test -run '^$' -bench BullMQ_Ratio -benchtime 3x ./peers
func BenchmarkBullMQ_Ratio(b *testing.B) {
	nodePath := os.Getenv("SILT_NODE_PATH")
	if _, err := os.Stat(filepath.Join(nodePath, "bullmq", "package.json")); err != nil {
		b.Fatalf("BullMQ is not installed: eval \"$(scripts/clients.sh --bench)\" (SILT_NODE_PATH=%q: %v)", nodePath, err)
	}
	script, _ := filepath.Abs("node")
	worker := filepath.Join(b.TempDir(), "worker")
	build := exec.Command("go", "build", "-o", worker, "./cmd/worker")
	build.Dir = "../.." // silt's module, not this one
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build the worker: %v\n%s", err, out)
	}
	srv := testserver.Redis(b)
	rdb := srv.Client(b)
	ctx := context.Background()
	for _, c := range []struct {
		name        string
		jobs        int
		concurrency int
		delay       time.Duration
		pipe        bool
	}{
		{"go-noop-c1", 10000, 1, 0, false},
		{"go-noop-c8", 10000, 8, 0, false},
		{"pipe-noop-c1", 10000, 1, 0, true},
		{"pipe-noop-c8", 10000, 8, 0, true},
		{"pipe-10ms-c8", 2000, 8, 10 * time.Millisecond, true},
	} {
		ks, _ := stream.NewKeyspace("", "p13")
		l, _ := stream.NewLog(rdb, ks, c.name, brand.EVT)
		batch := make([]stream.Fields, c.jobs)
		for i := range batch {
			batch[i] = stream.Fields{"user": fmt.Sprintf("u%06d", i), "n": strconv.Itoa(i)}
		}
		if _, err := l.AppendBatch(ctx, batch); err != nil {
			b.Fatal(err)
		}
		round := 0 // every group is new: b.Run calls the function more than once
		b.Run(c.name, func(b *testing.B) {
			var siltCPU, bullCPU time.Duration
			var siltSecs, bullSecs, floorSecs []float64 // per round, the pipe cases
			silt := func(tb testing.TB) int {
				round++
				group := fmt.Sprint("g", round)
				cpu0 := serverCPU(tb, rdb)
				defer func() { siltCPU += serverCPU(tb, rdb) - cpu0 }()
				if c.pipe {
					start := time.Now()
					n := pipeWorker(tb, worker, srv.URL(), nodePath, script, c.name, group, c.jobs, c.concurrency, c.delay)
					siltSecs = append(siltSecs, time.Since(start).Seconds())
					return n
				}
				cons, _ := stream.NewConsumer(l, group, "w1")
				cons.Block, cons.Concurrency, cons.MaxEntries = time.Millisecond, c.concurrency, int64(c.jobs)
				sum, err := cons.Run(ctx, func(context.Context, stream.Delivery) error {
					time.Sleep(c.delay)
					return nil
				})
				if err != nil || sum.Acked != int64(c.jobs) {
					tb.Fatalf("silt: %+v %v", sum, err)
				}
				return c.jobs
			}
			bull := func(tb testing.TB) int {
				round++
				r := bullmq(tb, script, nodePath, srv.Addr, fmt.Sprint("q", c.name, round), c.jobs, c.concurrency, c.delay)
				bullCPU += time.Duration(r.RedisCPU * float64(time.Second))
				if c.pipe { // the raw pipe floor, beside BullMQ's round and out of its time
					floor := pipeFloor(tb, nodePath, script, c.jobs, c.concurrency, c.delay)
					benchratio.Exclude(floor)
					bullSecs, floorSecs = append(bullSecs, r.Seconds), append(floorSecs, floor.Seconds())
				}
				return r.Jobs
			}
			benchratio.Compare(b, silt, bull)
			if c.pipe {
				// reachable: the raw pipe floor ÷ BullMQ, the most P13 pipe
				// can be here; of-floor: silt ÷ that floor.
				b.ReportMetric(float64(c.jobs)/benchratio.Median(floorSecs), "floor-items/s")
				b.ReportMetric(medianRatio(bullSecs, floorSecs), "reachable")
				b.ReportMetric(medianRatio(floorSecs, siltSecs), "of-floor")
			}
			perJob := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N*c.jobs) }
			b.ReportMetric(perJob(siltCPU), "silt-redis-µs")
			b.ReportMetric(perJob(bullCPU), "bullmq-redis-µs")
		})
	}
}

// pipeWorker runs `worker run --pipe 'node handler.js'` over the first
// jobs entries of the stream in a new group and returns how many it acked.
// The worker's start is in the round's time.
func pipeWorker(tb testing.TB, worker, redisURL, nodePath, script, name, group string, jobs, concurrency int, delay time.Duration) int {
	cmd := exec.Command(worker, "run", "--redis", redisURL, "--queue", "p13", "--stream", name, "--group", group,
		"--consumer", "w1", "--concurrency", strconv.Itoa(concurrency), "--max-entries", strconv.Itoa(jobs),
		"--handler-env", "NODE_PATH", "--pipe", fmt.Sprintf("node %s/handler.js %d", script, delay.Milliseconds()))
	cmd.Env = append(os.Environ(), "NODE_PATH="+nodePath)
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	if err := cmd.Run(); err != nil {
		tb.Fatalf("worker run --pipe: %v\n%s", err, errs.String())
	}
	var sum struct {
		Acked int `json:"acked"`
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil || sum.Acked != jobs {
		tb.Fatalf("worker run --pipe acked %d of %d (%v):\n%s%s", sum.Acked, jobs, err, out.String(), errs.String())
	}
	return sum.Acked
}

// bullmqRun is what node/bullmq.js prints.
type bullmqRun struct {
	Jobs     int     `json:"jobs"`
	Seconds  float64 `json:"seconds"`
	RedisCPU float64 `json:"redis_cpu_seconds"`
}

// bullmq runs node/bullmq.js: jobs added to a new queue, then a Worker
// timed until it completed them. Node's start and the adds are left out of
// the round's time (benchratio.Exclude): only the Worker's part counts.
func bullmq(tb testing.TB, script, nodePath, addr, queue string, jobs, concurrency int, delay time.Duration) bullmqRun {
	_, port, _ := strings.Cut(addr, ":")
	cmd := exec.Command("node", script+"/bullmq.js", port, strconv.Itoa(jobs), strconv.Itoa(concurrency), strconv.FormatInt(delay.Milliseconds(), 10), queue)
	cmd.Env = append(os.Environ(), "NODE_PATH="+nodePath)
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	var r bullmqRun
	if err == nil {
		err = json.Unmarshal(out.Bytes(), &r)
	}
	if err != nil || r.Jobs != jobs {
		tb.Fatalf("bullmq: %d of %d jobs (%v):\n%s%s", r.Jobs, jobs, err, out.String(), errs.String())
	}
	benchratio.Exclude(wall - time.Duration(r.Seconds*float64(time.Second)))
	return r
}
