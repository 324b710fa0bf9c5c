package peers

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/benchratio"
)

// pipeFloor is P13 pipe's raw floor: the fewest seconds in which the same
// Node co-process (node/handler.js, started in the timing, as the worker
// starts it) answers jobs delivery lines of the worker's shape, with
// concurrency of them in flight, fed by a plain Go loop: no Redis, no
// consumer group, no records. At concurrency 1 one goroutine writes a line
// and reads its answer; above 1 a writer keeps concurrency lines ahead of
// the reader. silt's `worker run --pipe` cannot beat it: this is what the
// user's handler and the pipe between two processes cost on this machine.
func pipeFloor(tb testing.TB, nodePath, script string, jobs, concurrency int, delay time.Duration) time.Duration {
	lines := make([][]byte, jobs)
	for i := range lines { // the worker's line for entry i (cmd/worker appendDelivery), built before the timing
		lines[i] = fmt.Appendf(nil, `{"id":"EVT_%026d","stream_id":"1700000000000-%d","attempts":1,"deliveries":1,"group":"g","consumer":"w1","payload":{"n":"%d","user":"u%06d"}}`+"\n", i, i, i, i)
	}
	cmd := exec.Command("node", script+"/handler.js", strconv.FormatInt(delay.Milliseconds(), 10))
	cmd.Env = append(os.Environ(), "NODE_PATH="+nodePath)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		tb.Fatalf("node handler.js: %v", err)
	}
	out := bufio.NewReader(stdout)
	answer := func() {
		if _, err := out.ReadSlice('\n'); err != nil {
			tb.Fatalf("node handler.js: reading its answers: %v", err)
		}
	}
	if concurrency <= 1 {
		for _, line := range lines {
			if _, err := in.Write(line); err != nil {
				tb.Fatalf("node handler.js: %v", err)
			}
			answer()
		}
	} else {
		ahead := make(chan struct{}, concurrency)
		failed := make(chan error, 1)
		go func() {
			for _, line := range lines {
				ahead <- struct{}{}
				if _, err := in.Write(line); err != nil {
					failed <- err
					return
				}
			}
		}()
		for range lines {
			select {
			case err := <-failed:
				tb.Fatalf("node handler.js: %v", err)
			default:
			}
			answer()
			<-ahead
		}
	}
	took := time.Since(start)
	in.Close()
	if err := cmd.Wait(); err != nil {
		tb.Fatalf("node handler.js: %v", err)
	}
	return took
}

// medianRatio is the median over rounds of a[i] ÷ b[i].
func medianRatio(a, b []float64) float64 {
	ratios := make([]float64, min(len(a), len(b)))
	for i := range ratios {
		ratios[i] = a[i] / b[i]
	}
	return benchratio.Median(ratios)
}
