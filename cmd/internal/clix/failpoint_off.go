//go:build !silt_failpoints

package clix

import "github.com/silt-dev/silt/pkg/failpoint"

// FailpointsBuilt tells whether this binary honours SILT_FAILPOINT: a
// release build (this one) does not.
const FailpointsBuilt = false

// FailpointFromEnv is nil in a release build: SILT_FAILPOINT is ignored.
func FailpointFromEnv() (failpoint.Func, error) { return nil, nil }
