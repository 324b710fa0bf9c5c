package graft

import (
	"context"
	"errors"
	"fmt"

	"github.com/silt-dev/silt/pkg/fence"
)

// RebuildIndex rebuilds the checkpoint index from the commit chain alone,
// for an index that verify names corrupt (a leaf or branch is shared by
// every later checkpoint, so a bad one would stay): it reads every commit,
// replaces the root at the head with one whose nodes are all written anew,
// and adopts it. After DropOldCommits the chain starts at a checkpoint:
// its nodes, all checked, are kept, and only what the commits above it
// change is written anew (see rebuildFrom). It holds every commit's entry
// in memory while it works. It returns the LSN of the new checkpoint (0:
// no commit above the chain's start, nothing to rebuild).
func (v *Volume) RebuildIndex(ctx context.Context) (uint64, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.base, v.tail = nil, nil
	if err := v.rebuildFrom(ctx); err != nil {
		return 0, fmt.Errorf("rebuild index of volume %s: %w", v.name, err)
	}
	if len(v.tail) == 0 {
		return 0, nil
	}
	// The root at the head may exist and name bad nodes: it goes first (a
	// root is not a commit: the fence is on commits; a writer racing this
	// one at the same LSN writes a root that names the same state).
	key := v.checkpointKey(v.headLSN())
	if err := v.store.Delete(ctx, key); err != nil && !errors.Is(err, fence.ErrNotFound) {
		return 0, fmt.Errorf("rebuild index of volume %s: %w", v.name, err)
	}
	return v.checkpoint(ctx)
}

// rebuildFrom reads what a rebuilt index is made from: the whole chain,
// or, when old commits were dropped, the checkpoint the chain starts at
// (as verify finds it) and the commits above it. That checkpoint's index
// is the genesis: every node is read and checked against its key and the
// totals, and a bad one is an error naming it (the commits that made it
// are gone); nodes written by later checkpoints are not read, and those
// the commits above change are written anew.
func (v *Volume) rebuildFrom(ctx context.Context) error {
	plan, err := v.planChain(ctx)
	if err != nil {
		return err
	}
	if plan.start == 0 {
		return v.linkChain(ctx, 1, plan.scan.keys, false)
	}
	key := plan.ckAt[plan.start]
	cv := chainVerifier{v: v, recent: map[uint64]Entry{}}
	ck, err := cv.seed(ctx, key)
	if err != nil {
		return fmt.Errorf("the chain starts at checkpoint %s (older commits were dropped), which cannot be rebuilt: %w", key, err)
	}
	v.base = ck
	return v.linkChain(ctx, plan.start+1, plan.scan.above(plan.start), false)
}
