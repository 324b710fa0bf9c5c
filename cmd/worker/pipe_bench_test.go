package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/benchratio"
	"github.com/silt-dev/silt/pkg/stream"
)

// BenchmarkPipe_Ratio: the worker loop with --concurrency 64 and a minimal
// Go co-process (this test binary: it reads each line's id and answers ok,
// buffering its answers until its input is drained) as its --pipe
// handler, run on one processor as `worker run --pipe` runs it (pipeProcs),
//
//   - /stdout (P10): ÷ the --stdout handler writing to io.Discard. The goal
//     is the worker process's own CPU per entry, --pipe ÷ --stdout <= 2
//     (cpu-ratio); the wall-clock ratio is printed beside it, with no
//     goal: on two cores the co-process, the user's code, shares them;
//
//   - /exec (P10b): ÷ the same minimal program as an --exec handler (one
//     process per entry), goal >= 50.
//
//     go test -run '^$' -bench Pipe_Ratio -benchtime 9x ./cmd/worker
func BenchmarkPipe_Ratio(b *testing.B) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const entries = 10000
	_, l, _, _, newGroup := benchStream(b, entries, stream.Fields{"do": "ok"})
	quiet := slog.New(slog.DiscardHandler)
	// run handles up to limit entries from the start of the stream in a
	// new group and returns how many it handled; set sets the consumer up
	// as runAction does for the handler.
	run := func(tb testing.TB, h stream.Handler, limit int64, set ...func(*stream.Consumer)) int {
		c, _ := stream.NewConsumer(l, newGroup(tb), "w1")
		c.Block, c.Concurrency, c.MaxEntries = time.Millisecond, 64, limit
		for _, f := range set {
			f(c)
		}
		sum, err := c.Run(ctx, h)
		if err != nil || sum.Acked != min(limit, entries) {
			tb.Fatalf("run: %+v %v", sum, err)
		}
		return int(sum.Acked)
	}
	pipe := func(tb testing.TB) int {
		defer pipeProcs(os.Getenv)() // as runAction runs --pipe
		p := newPipeHandler([]string{exe}, time.Minute, 0, []string{"SILT_TEST_COPROCESS=ok"}, nil, quiet, func(error) {})
		defer p.close(time.Second)
		return run(tb, p.handle, entries, func(c *stream.Consumer) { c.Admit = p.admit })
	}
	b.Run("stdout", func(b *testing.B) {
		// Wall clock (ratio), and the worker's own CPU per entry (cpu-ratio:
		// --pipe ÷ --stdout, the co-process's CPU left out: it is the
		// user's code, and on two cores it shares them with the worker).
		var pipeCPU, stdoutCPU []float64
		benchratio.Compare(b, benchratio.WithCPU(pipe, &pipeCPU),
			benchratio.WithCPU(func(tb testing.TB) int { return run(tb, stdoutHandler(io.Discard), entries) }, &stdoutCPU))
		benchratio.ReportCPURatio(b, "cpu-ratio", pipeCPU, stdoutCPU)
	})
	b.Run("exec", func(b *testing.B) {
		exec := execHandler([]string{exe}, time.Minute, []string{"SILT_TEST_COPROCESS=exec"}, nil, quiet)
		benchratio.Compare(b, pipe, func(tb testing.TB) int {
			return run(tb, exec, 300, func(c *stream.Consumer) { c.HandlerBegins = true })
		})
	})
}
