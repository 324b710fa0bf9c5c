package stream

import (
	"context"
	"fmt"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
)

// TrimMaxLen trims the stream to about its newest n entries and returns how
// many entries it removed. Approximate trimming (exact false, XTRIM ~) removes
// only whole radix-tree nodes: it may keep more than n, never fewer.
func (l *Log) TrimMaxLen(ctx context.Context, n int64, exact bool) (int64, error) {
	var (
		removed int64
		err     error
	)
	if exact {
		removed, err = l.rdb.XTrimMaxLen(ctx, l.key, n).Result()
	} else {
		removed, err = l.rdb.XTrimMaxLenApprox(ctx, l.key, n, 0).Result()
	}
	if err != nil {
		return 0, fmt.Errorf("xtrim %s maxlen %d: %w", l.key, n, err)
	}
	return removed, nil
}

// TrimMinID removes entries with stream ids below min and returns how many it
// removed. Approximate trimming may keep some entries below min, never removes
// one at or above it.
func (l *Log) TrimMinID(ctx context.Context, min brand.StreamID, exact bool) (int64, error) {
	var (
		removed int64
		err     error
	)
	if exact {
		removed, err = l.rdb.XTrimMinID(ctx, l.key, min.String()).Result()
	} else {
		removed, err = l.rdb.XTrimMinIDApprox(ctx, l.key, min.String(), 0).Result()
	}
	if err != nil {
		return 0, fmt.Errorf("xtrim %s minid %s: %w", l.key, min, err)
	}
	return removed, nil
}

// TrimBefore removes entries minted before t (TrimMinID at t's first id).
func (l *Log) TrimBefore(ctx context.Context, t time.Time, exact bool) (int64, error) {
	return l.TrimMinID(ctx, brand.WindowStart(t), exact)
}
