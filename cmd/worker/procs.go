package main

import "runtime"

// pipeProcs runs the worker's own Go code on one processor for a run with
// a co-process handler (--pipe), unless the environment sets GOMAXPROCS,
// and returns what puts the setting back.
//
// The handler's work is the co-process's: the worker moves lines between
// it and Redis, and most of its CPU an entry goes to waking the goroutine
// a result is for. With more than one processor the Go scheduler hands
// that goroutine to another thread, and keeps a thread spinning in search
// of work, on the cores the co-process and Redis need. On two cores, with
// a Node co-process answering at once, `worker run --pipe` at
// --concurrency 8 took 8% longer with two processors than with one, and
// its own CPU an entry fell by a quarter with one
// (docs/perf/2026-12-06-a-pipe-worker-on-one-processor.md). One processor
// moves about 70,000 lines a second through a Go co-process that answers
// at once (BenchmarkPipe_Ratio under GOMAXPROCS=1), more than most
// co-processes answer; one that answers faster on many threads can be
// given more with GOMAXPROCS. An --exec handler is not limited: its runs
// were no faster on one.
//
// The setting is made in a goroutine of its own: it stops the world, which
// at the start of a run waited 2-3 ms here for the threads already
// running, and the run's connection to Redis goes on meanwhile.
func pipeProcs(getenv func(string) string) (restore func()) {
	if getenv("GOMAXPROCS") != "" {
		return func() {}
	}
	was := runtime.GOMAXPROCS(0) // 0 reads, without stopping the world
	set := make(chan struct{})
	go func() {
		runtime.GOMAXPROCS(1)
		close(set)
	}()
	return func() {
		<-set
		runtime.GOMAXPROCS(was)
	}
}
