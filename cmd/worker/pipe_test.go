package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// TestMain lets the test binary act as a co-process: with
// SILT_TEST_COPROCESS=<mode> it speaks the --pipe protocol on stdin and
// stdout instead of running tests.
func TestMain(m *testing.M) {
	if len(os.Args) == 2 && os.Args[1] == reaperArg { // the handler reaper where there is no sh, re-executed from this test binary
		os.Exit(reaperMain(os.Stdin))
	}
	if mode := os.Getenv("SILT_TEST_COPROCESS"); mode != "" {
		coprocess(mode)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// coprocess answers each delivery by its payload's "do" field: ok, fail,
// poison (permanent), garbage (a malformed line), stranger (a result for
// another id), long (a line over maxResultLine), crash (exit 3), bye (answered ok, then exit 0), hang (no
// answer), deaf (no answer, and
// nothing read after it), late (answered after the
// next "ok", or newest first once the input is drained: out of order).
// Mode slowstart takes 700 ms to start, then answers as mode answer.
func coprocess(mode string) {
	if mode == "slowstart" { // an interpreter loading its libraries
		time.Sleep(700 * time.Millisecond)
		mode = "answer"
	}
	if mode == "exec" { // the same handler as an exec handler: read the delivery, succeed
		io.Copy(io.Discard, os.Stdin)
		return
	}
	// Answers are buffered and flushed before a read would block: a
	// minimal co-process that answers a burst in one write.
	r := bufio.NewReaderSize(os.Stdin, 64<<10)
	bw := bufio.NewWriter(os.Stdout)
	defer bw.Flush()
	if mode == "ok" { // the benchmark's: read the id, answer ok
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			var d struct{ ID string }
			json.Unmarshal(line, &d)
			bw.WriteString(`{"id":"` + d.ID + `","ok":true}` + "\n")
			if r.Buffered() == 0 {
				bw.Flush()
			}
		}
	}
	out := json.NewEncoder(bw)
	var held []string
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var d struct {
			ID      string
			Payload map[string]string
		}
		json.Unmarshal(line, &d)
		switch d.Payload["do"] {
		case "ok":
			out.Encode(map[string]any{"id": d.ID, "ok": true})
			for _, id := range held {
				out.Encode(map[string]any{"id": id, "ok": true})
			}
			held = nil
		case "late":
			held = append(held, d.ID)
		case "fail":
			out.Encode(map[string]any{"id": d.ID, "ok": false, "error": "declined"})
		case "poison":
			out.Encode(map[string]any{"id": d.ID, "ok": false, "error": "bad entry", "permanent": true})
		case "garbage":
			bw.WriteString("this is not JSON\n")
		case "stranger":
			out.Encode(map[string]any{"id": "EVT_01JC3T7QG0000000000000Z", "ok": true})
		case "crash":
			bw.Flush()
			os.Exit(3)
		case "long": // a line longer than a result line may be
			bw.WriteString(strings.Repeat("x", maxResultLine+1) + "\n")
		case "bye": // its answer, then exit 0 at once
			out.Encode(map[string]any{"id": d.ID, "ok": true})
			bw.Flush()
			os.Exit(0)
		case "hang":
		case "deaf":
			bw.Flush()
			select {} // until killed
		}
		if r.Buffered() == 0 { // input drained: the held ones, newest first, then flush
			for i := len(held) - 1; i >= 0; i-- {
				out.Encode(map[string]any{"id": held[i], "ok": true})
			}
			held = nil
			bw.Flush()
		}
	}
}

func delivery(i int, do string) stream.Delivery {
	id, _ := brand.New(brand.EVT, brand.StreamID{MS: 1796000000000, Seq: uint64(i)})
	return stream.Delivery{ID: id, StreamID: id.StreamID, Fields: stream.Fields{"do": do}}
}

func newTestPipe(t *testing.T, timeout time.Duration, restarts int) (*pipeHandler, *atomic.Value) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var stopped atomic.Value
	p := newPipeHandler([]string{exe}, timeout, restarts, []string{"SILT_TEST_COPROCESS=answer"}, nil,
		slog.New(slog.DiscardHandler), func(err error) { stopped.Store(err) })
	t.Cleanup(func() { p.close(time.Second) })
	return p, &stopped
}

func TestPipe_ResultsInAnyOrderManyInFlight(t *testing.T) {
	p, _ := newTestPipe(t, 10*time.Second, 0)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 64)
	for i := range errs {
		wg.Go(func() {
			do := "ok"
			if i%2 == 1 {
				do = "late" // answered after a later "ok": out of order
			}
			errs[i] = p.handle(ctx, delivery(i, do))
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	if p.starts != 1 {
		t.Fatalf("the co-process was started %d times", p.starts)
	}
}

func TestPipe_FailuresAndPermanent(t *testing.T) {
	p, _ := newTestPipe(t, 10*time.Second, 0)
	ctx := context.Background()
	if err := p.handle(ctx, delivery(1, "fail")); err == nil || stream.IsPermanent(err) || !strings.Contains(err.Error(), "declined") {
		t.Fatalf("fail: %v", err)
	}
	if err := p.handle(ctx, delivery(2, "poison")); !stream.IsPermanent(err) || !strings.Contains(err.Error(), "bad entry") {
		t.Fatalf("poison: %v", err)
	}
	if err := p.handle(ctx, delivery(3, "ok")); err != nil {
		t.Fatalf("ok after failures: %v", err)
	}
}

// A protocol break ends the co-process: what is in flight fails naming the
// break, the next delivery gets a new co-process, and after --pipe-restarts
// the run is stopped with ErrPipe.
func TestPipe_BreaksRestartThenStopTheRun(t *testing.T) {
	p, stopped := newTestPipe(t, 2*time.Second, 3)
	ctx := context.Background()
	for i, tc := range []struct{ do, want string }{
		{"garbage", "malformed result line"},
		{"stranger", "which is not in flight"},
		{"crash", "exited: exit status 3"},
		{"hang", "no result for"},
	} {
		err := p.handle(ctx, delivery(10+i, tc.do))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: %v, want an error saying %q", tc.do, err, tc.want)
		}
		if stopped.Load() != nil {
			t.Fatalf("the run was stopped after %d breaks of 4 allowed starts", i+1)
		}
	}
	err := p.handle(ctx, delivery(20, "ok"))
	if !errors.Is(err, ErrPipe) || !strings.Contains(err.Error(), "started 4 times") {
		t.Fatalf("fifth start: %v", err)
	}
	if stop, _ := stopped.Load().(error); !errors.Is(stop, ErrPipe) {
		t.Fatalf("the run was not stopped: %v", stop)
	}
}

// --handler-timeout is each delivery's own: deliveries answered in time
// keep the co-process for longer than the timeout in all, and a hung one
// ends it once it has waited the timeout, naming it.
func TestPipe_TimeoutIsEachDeliverys(t *testing.T) {
	// The co-process's start counts against its first delivery: a -race
	// build of this binary takes over 100 ms to start, more when loaded.
	const timeout = time.Second
	p, _ := newTestPipe(t, timeout, 1)
	p.inFlight = 1 // one at a time, as --concurrency 1 sends them
	ctx := context.Background()
	start := time.Now()
	for i := 0; time.Since(start) < 3*timeout; i++ {
		if err := p.handle(ctx, delivery(i, "ok")); err != nil {
			t.Fatalf("delivery %d, %s in: %v", i, time.Since(start), err)
		}
		time.Sleep(time.Millisecond)
	}
	if p.starts != 1 {
		t.Fatalf("the co-process was started %d times while every delivery was answered", p.starts)
	}
	hung := delivery(1<<20, "hang")
	start = time.Now()
	err := p.handle(ctx, hung)
	waited := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "no result for "+hung.ID.String()) {
		t.Fatalf("hang: %v", err)
	}
	if waited < timeout || waited > timeout+250*time.Millisecond {
		t.Fatalf("the hung delivery failed after %s, want its --handler-timeout %s", waited, timeout)
	}
}

// The co-process's start is not its deliveries' time: deliveries written
// while it loads count --handler-timeout from its first answer, at one and
// at eight in flight.
func TestPipe_SlowStartIsNotTheHandlersTime(t *testing.T) {
	for _, inFlight := range []int{1, 8} {
		const timeout = 300 * time.Millisecond // the co-process takes 700 ms to start
		p, _ := newTestPipe(t, timeout, 0)
		p.env, p.inFlight, p.startTimeout = []string{"SILT_TEST_COPROCESS=slowstart"}, inFlight, 5*time.Second
		var wg sync.WaitGroup
		errs := make([]error, inFlight)
		for i := range errs {
			wg.Go(func() { errs[i] = p.handle(context.Background(), delivery(i, "ok")) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%d in flight, delivery %d: %v", inFlight, i, err)
			}
		}
		if p.starts != 1 {
			t.Fatalf("%d in flight: the co-process was started %d times", inFlight, p.starts)
		}
		// Once it has answered, a delivery's timeout is its own again.
		start := time.Now()
		if err := p.handle(context.Background(), delivery(100, "hang")); err == nil || !strings.Contains(err.Error(), "hung?") {
			t.Fatalf("%d in flight, hang: %v", inFlight, err)
		}
		if waited := time.Since(start); waited < timeout || waited > timeout+250*time.Millisecond {
			t.Fatalf("%d in flight: the hung delivery failed after %s, want its --handler-timeout %s", inFlight, waited, timeout)
		}
	}
}

// A co-process that answers nothing is still ended: --pipe-start-timeout
// after its start, then --handler-timeout, the error naming both.
func TestPipe_StartTimeoutBoundsASilentCoprocess(t *testing.T) {
	const timeout, startTimeout = 200 * time.Millisecond, 400 * time.Millisecond
	p, _ := newTestPipe(t, timeout, 0)
	p.startTimeout = startTimeout
	start := time.Now()
	err := p.handle(context.Background(), delivery(1, "hang"))
	waited := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "answered nothing") || !strings.Contains(err.Error(), "--pipe-start-timeout 400ms") ||
		!strings.Contains(err.Error(), "more lines than the one it is sent") {
		t.Fatalf("hang: %v", err)
	}
	if waited < startTimeout+timeout || waited > startTimeout+timeout+250*time.Millisecond {
		t.Fatalf("the silent co-process was ended after %s, want --pipe-start-timeout %s and --handler-timeout %s", waited, startTimeout, timeout)
	}
}

// A co-process that stops reading its stdin holds the handler writing to
// it once the pipe is full, and queues the others' lines behind it: its
// --handler-timeout ends it, the write fails, and every delivery returns.
func TestPipe_CoprocessThatStopsReading(t *testing.T) {
	const timeout = 300 * time.Millisecond
	p, _ := newTestPipe(t, timeout, 1)
	ctx := context.Background()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 33)
	wg.Go(func() { errs[0] = p.handle(ctx, delivery(0, "deaf")) })
	time.Sleep(50 * time.Millisecond) // read before the rest are written
	pad := strings.Repeat("x", 16<<10)
	for i := 1; i < len(errs); i++ { // 512 KiB of lines: more than a pipe holds
		wg.Go(func() {
			d := delivery(i, "ok")
			d.Fields["pad"] = pad
			errs[i] = p.handle(ctx, d)
		})
	}
	wg.Wait()
	if waited := time.Since(start); waited > timeout+time.Second {
		t.Fatalf("the deliveries returned after %s, want about --handler-timeout %s", waited, timeout)
	}
	for i, err := range errs {
		if err == nil {
			t.Fatalf("delivery %d succeeded on a co-process that read nothing after the first", i)
		}
	}
	if !strings.Contains(errs[0].Error(), "no result for "+delivery(0, "").ID.String()) {
		t.Fatalf("the first delivery: %v", errs[0])
	}
	// A new co-process, given time to start: a -race build of this binary
	// takes a good part of the 300 ms on a loaded machine.
	p.timeout = 10 * time.Second
	if err := p.handle(ctx, delivery(100, "ok")); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
}

// A co-process that answers nothing (the usual cause: a buffered stdout)
// gets a WARN naming output buffering well before --handler-timeout, and
// the timeout's error says it answered nothing.
func TestPipe_SilentCoprocessIsWarnedOfBuffering(t *testing.T) {
	defer func(d time.Duration) { silenceWarn = d }(silenceWarn)
	silenceWarn = 200 * time.Millisecond
	p, _ := newTestPipe(t, 2*time.Second, 0)
	var logged strings.Builder
	var mu sync.Mutex
	p.log = slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logged.Write(b)
	}), nil))
	start := time.Now()
	err := p.handle(context.Background(), delivery(1, "hang"))
	if err == nil || !strings.Contains(err.Error(), "buffering its stdout") {
		t.Fatalf("hang: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logged.String(), "level=WARN") || !strings.Contains(logged.String(), "flush=True") ||
		!strings.Contains(logged.String(), "not after a batch of several") {
		t.Fatalf("no buffering warning within %s: %q", time.Since(start), logged.String())
	}
}

// An answer written just before the co-process exits is its delivery's
// verdict, whoever reads it: the delivery itself, or what reads the rest of
// stdout once the exit is seen. The next delivery starts a new one.
func TestPipe_AnswerBeforeTheExitStands(t *testing.T) {
	for _, inFlight := range []int{1, 8} {
		const exits = 4 // each a start of this test binary: about a second under -race
		p, _ := newTestPipe(t, 10*time.Second, exits)
		p.inFlight = inFlight
		ctx := context.Background()
		for i := range exits {
			if err := p.handle(ctx, delivery(i, "bye")); err != nil {
				t.Fatalf("--concurrency %d, delivery %d, answered before its co-process exited: %v", inFlight, i, err)
			}
			// A delivery sent while it is exiting fails (and is retried by
			// a later run): the next goes once this one is over.
			select {
			case <-p.cur.Load().dead:
			case <-time.After(5 * time.Second):
				t.Fatalf("--concurrency %d: the co-process that exited is not over", inFlight)
			}
		}
		if p.starts != exits {
			t.Fatalf("--concurrency %d: %d co-processes started for %d that each exited", inFlight, p.starts, exits)
		}
	}
}

// Once the run stops waiting for its handlers (the context handed to them
// is cancelled past --grace), the co-process is ended with what it has in
// flight, as an exec handler's process group is killed: the delivery
// reading its stdout and those waiting for their turn all return at once,
// and the next delivery starts a new one.
func TestPipe_GraceOverEndsTheCoprocess(t *testing.T) {
	for _, inFlight := range []int{1, 8} {
		p, _ := newTestPipe(t, time.Minute, 1)
		p.inFlight = inFlight
		ctx, cancel := context.WithCancelCause(context.Background())
		errs := make([]error, inFlight)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() { errs[i] = p.handle(ctx, delivery(i, "hang")) })
		}
		time.Sleep(100 * time.Millisecond)
		cp := p.cur.Load()
		if cp == nil || cp.over() {
			t.Fatalf("--concurrency %d: no co-process running", inFlight)
		}
		start := time.Now()
		cancel(errors.New("grace over"))
		wg.Wait()
		if waited := time.Since(start); waited > time.Second {
			t.Fatalf("--concurrency %d: the deliveries returned %s after the cancel", inFlight, waited)
		}
		for i, err := range errs {
			if err == nil || !strings.Contains(err.Error(), "grace over") {
				t.Fatalf("--concurrency %d, delivery %d: %v, want the cancel's cause", inFlight, i, err)
			}
		}
		select {
		case <-cp.dead:
		case <-time.After(time.Second):
			t.Fatalf("--concurrency %d: the co-process is still running after its deliveries were given up", inFlight)
		}
		if err := p.handle(context.Background(), delivery(100, "ok")); err != nil {
			t.Fatalf("--concurrency %d, after the cancel: %v", inFlight, err)
		}
	}
}

// A line longer than any result ends the co-process, saying so, rather
// than being buffered without bound.
func TestPipe_OverlongLineEndsIt(t *testing.T) {
	for _, inFlight := range []int{1, 8} {
		p, _ := newTestPipe(t, 10*time.Second, 1)
		p.inFlight = inFlight
		err := p.handle(context.Background(), delivery(1, "long"))
		if err == nil || !strings.Contains(err.Error(), "longer than 65536 bytes") {
			t.Fatalf("--concurrency %d: %v, want the over-long line named", inFlight, err)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
