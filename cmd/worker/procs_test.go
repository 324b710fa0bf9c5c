package main

import (
	"runtime"
	"testing"
	"time"
)

func TestPipeProcs_OneUnlessTheEnvironmentSays(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(3))
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "GOMAXPROCS" {
				return v
			}
			return ""
		}
	}
	restore := pipeProcs(env(""))
	for deadline := time.Now().Add(5 * time.Second); runtime.GOMAXPROCS(0) != 1 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // set by a goroutine of its own
	}
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Errorf("a --pipe run with GOMAXPROCS unset runs on %d processors, want 1", n)
	}
	restore()
	if n := runtime.GOMAXPROCS(0); n != 3 {
		t.Errorf("after the run: %d processors, want the 3 from before", n)
	}
	restore = pipeProcs(env("3"))
	if n := runtime.GOMAXPROCS(0); n != 3 {
		t.Errorf("with GOMAXPROCS=3 in the environment: %d processors, want 3", n)
	}
	restore()
	if n := runtime.GOMAXPROCS(0); n != 3 {
		t.Errorf("after the run: %d processors, want 3", n)
	}
}
