//go:build silt_failpoints

package clix

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/silt-dev/silt/pkg/failpoint"
)

// FailpointsBuilt tells whether this binary honours SILT_FAILPOINT: only a
// build with the silt_failpoints tag does (the crash tests build so);
// release builds cannot be made to kill themselves through the environment.
const FailpointsBuilt = true

// FailpointFromEnv turns SILT_FAILPOINT=NAME:N into a hook that kills the
// process with SIGKILL the Nth time it reaches NAME (nil when unset). A
// name that is not in failpoint.All or a bad N is an error: a crash test
// with a typo would otherwise kill nothing and pass.
func FailpointFromEnv() (failpoint.Func, error) { return parseFailpoint(os.Getenv("SILT_FAILPOINT")) }

func parseFailpoint(spec string) (failpoint.Func, error) {
	if spec == "" {
		return nil, nil
	}
	name, nth, ok := strings.Cut(spec, ":")
	n, err := strconv.Atoi(nth)
	if !ok || err != nil || n < 1 {
		return nil, fmt.Errorf("SILT_FAILPOINT=%q: want NAME:N, N a count from 1", spec)
	}
	fp, err := failpoint.Parse(name)
	if err != nil {
		return nil, fmt.Errorf("SILT_FAILPOINT: %w", err)
	}
	var hits atomic.Int64
	return func(at failpoint.Name) {
		if at == fp && hits.Add(1) == int64(n) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}, nil
}
