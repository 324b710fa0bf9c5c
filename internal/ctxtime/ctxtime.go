// Package ctxtime waits the way every loop of silt waits: for a duration
// or until its context is done, whichever comes first.
package ctxtime

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx is done, and returns ctx's error in that
// case. A d of zero or less returns at once.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
