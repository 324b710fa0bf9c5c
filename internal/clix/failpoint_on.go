//go:build silt_failpoints

package clix

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// FailpointsBuilt tells whether this binary honours SILT_FAILPOINT: only a
// build with the silt_failpoints tag does (the crash tests build so);
// release builds cannot be made to kill themselves through the environment.
const FailpointsBuilt = true

// FailpointFromEnv turns SILT_FAILPOINT=NAME:N into a hook that kills the
// process with SIGKILL the Nth time it reaches NAME; nil when unset or
// malformed.
func FailpointFromEnv() func(string) { return failpoint(os.Getenv("SILT_FAILPOINT")) }

func failpoint(spec string) func(string) {
	name, nth, ok := strings.Cut(spec, ":")
	n, err := strconv.Atoi(nth)
	if spec == "" || !ok || err != nil || n < 1 {
		return nil
	}
	var hits atomic.Int64
	return func(at string) {
		if at == name && hits.Add(1) == int64(n) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
}
