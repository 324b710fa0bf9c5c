package graft

import (
	"context"
	"fmt"
	"maps"

	"github.com/silt-dev/silt/pkg/failpoint"
)

// Prune moves the start of a monotonic volume's history forward: a prune
// commit (format 2, no segment, the latest metadata carried forward) drops
// every entry whose pages are all below page below, then a checkpoint
// applies it. Readers that opened before it still read the dropped
// segments until gc removes them after its grace. It returns how many
// entries it dropped (0: none, and nothing is committed). A lost race to
// another writer drops nothing and returns a *ConflictError.
func (v *Volume) Prune(ctx context.Context, below uint64) (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.refresh(ctx); err != nil {
		return 0, err
	}
	if len(v.tail) > 0 {
		if _, err := v.checkpoint(ctx); err != nil {
			return 0, err
		}
	}
	if v.base == nil {
		return 0, nil
	}
	if !v.base.Monotonic {
		return 0, fmt.Errorf("prune volume %s: %w", v.name, ErrNotMonotonic)
	}
	n := 0
	for ref, err := range v.leafRefs(ctx, v.base, nil) {
		if err != nil {
			return 0, err
		}
		if ref.Hi < below {
			n += ref.Entries
			continue
		}
		entries, err := v.leaf(ctx, ref)
		if err != nil {
			return 0, err
		}
		for _, e := range entries {
			if e.hi() < below {
				n++
			}
		}
		break
	}
	if n == 0 {
		return 0, nil
	}
	c, err := v.commit(ctx, nil, maps.Clone(v.head().Meta), func(c *Commit) {
		c.Version, c.PruneBelow, c.Segment, c.Ranges, c.Pages = compactionVersion, below, SegmentRef{}, nil, 0
	})
	if err == nil {
		err = v.Sync()
	}
	if err != nil {
		return 0, err
	}
	v.failpoint(failpoint.PruneCommitted)
	if _, err := v.checkpoint(ctx); err != nil {
		return n, fmt.Errorf("prune volume %s: checkpoint after prune commit %d: %w", v.name, c.LSN, err)
	}
	return n, nil
}
