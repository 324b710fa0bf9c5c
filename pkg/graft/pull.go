package graft

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/fence/durable"
)

// Pull rebuilds the local copy from the remote: every commit and segment is
// fetched, verified and written locally, replacing what was there; the
// newest checkpoint the chain confirms becomes the local base. It lists and
// reads as verify does: in pages, 8 commits ahead, segments over 4 MiB by
// ranges streamed into their local file. A chain whose old commits were
// dropped starts, as verify's does, at the checkpoint the drop left: the
// segments of its entries are pulled first, and it is the base unless a
// newer checkpoint is confirmed.
func (v *Volume) Pull(ctx context.Context) (VerifyReport, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var rep VerifyReport
	plan, err := v.planChain(ctx)
	if err != nil {
		return rep, fmt.Errorf("pull volume %s: %w", v.name, err)
	}
	start := plan.start
	cv := chainVerifier{v: v, recent: map[uint64]Entry{}}
	var startKey, newestKey, newestHash string
	if start > 0 {
		startKey = plan.ckAt[start]
		ck, err := cv.seed(ctx, startKey)
		if err != nil {
			return rep, err
		}
		for f, err := range v.seededSegments(ctx, startKey, ck) {
			if err != nil {
				return rep, fmt.Errorf("pull volume %s: %w", v.name, err)
			}
			if err := cv.pullSegment(ctx, fmt.Sprintf("entry %d of checkpoint %s", f.c.LSN, startKey), f, &rep); err != nil {
				return rep, err
			}
		}
		slices.Sort(cv.missing) // gone looks them up; the chain's come after, in order
	}
	chain := plan.scan.above(start)
	rep.ChainStart, rep.Unchained = start, plan.scan.keys-chain
	ckLSN := uint64(0) // the newest checkpoint above the start, if the chain reaches it
	if plan.newestCk > start && plan.newestCk <= start+uint64(chain) {
		ckLSN = plan.newestCk
	}
	_, err = cv.walk(ctx, "pull", start, chain, &rep, func(f verified) error {
		if err := cv.pullSegment(ctx, "commit "+f.key, f, &rep); err != nil {
			return err
		}
		if err := v.writeCommitFile(f.c.LSN, f.c.raw); err != nil {
			return err
		}
		if f.c.LSN == ckLSN {
			newestKey, newestHash = plan.ckAt[ckLSN], f.c.Hash()
		}
		return nil
	})
	if err != nil {
		return rep, err
	}
	if err := cv.gone(ctx); err != nil {
		return rep, err
	}
	os.Remove(v.localCheckpoint())
	if err := v.pullBase(ctx, newestKey, newestHash, startKey); err != nil {
		return rep, fmt.Errorf("pull volume %s: %w", v.name, err)
	}
	v.base, v.tail = nil, nil
	v.cacheMu.Lock()
	clear(v.cache)
	v.cacheMu.Unlock()
	v.leafMu.Lock()
	clear(v.leaves)
	v.leafMu.Unlock()
	return rep, v.loadLocal()
}

// pullBase writes the local base: the newest checkpoint (at newest) if the
// chain confirmed its commit (hash), else the checkpoint the chain starts
// at (start: a dropped chain has no commit files below it), else none (the
// commit files from LSN 1 are the base). The base's index nodes are
// fetched too, so that reads need nothing more from the remote.
func (v *Volume) pullBase(ctx context.Context, newest, hash, start string) error {
	if newest != "" {
		root, err := v.store.Get(ctx, newest, fence.Range{})
		var ck *checkpoint
		if err == nil {
			ck, err = decodeCheckpoint(newest, root)
		}
		if err == nil && ck.CommitHash == hash && v.placeBase(ctx, newest, ck, root) == nil {
			return nil
		}
		// A newest checkpoint that does not match the chain, or one with a
		// bad node, is not a base (verify names it; reindex repairs it).
	}
	if start == "" {
		return nil
	}
	root, err := v.store.Get(ctx, start, fence.Range{})
	if err != nil {
		return err
	}
	ck, err := decodeCheckpoint(start, root)
	if err != nil {
		return err
	}
	return v.placeBase(ctx, start, ck, root)
}

// placeBase fetches the index nodes of checkpoint ck (at key, encoded as
// root) into their local files, then writes root as the local checkpoint.
func (v *Volume) placeBase(ctx context.Context, key string, ck *checkpoint, root []byte) error {
	for ref, err := range v.leafRefs(ctx, ck, nil) {
		if err == nil {
			_, err = v.leaf(ctx, ref)
		}
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", key, err)
		}
	}
	return v.writeFile(v.localCheckpoint(), root)
}

// pullSegment writes the segment f fetched for c into its local file,
// checked against c (read by ranges into the file when it is large), and
// counts it. A missing one is noted: fine if a compaction or a prune
// replaced it, which gone checks at the end. what names the commit or entry.
func (cv *chainVerifier) pullSegment(ctx context.Context, what string, f verified, rep *VerifyReport) error {
	v, c, err := cv.v, f.c, f.segErr
	switch {
	case c.Segment.Key == "": // a prune commit has none
		return nil
	case errors.Is(err, errRanged):
		err = v.pullRanged(ctx, c)
	case err == nil:
		if err = checkAgainst(c.Segment.Key, f.seg, c); err == nil {
			err = v.writeFile(v.localSegment(c.Segment.Key), f.seg)
		}
	}
	switch {
	case errors.Is(err, fence.ErrNotFound):
		cv.missing = append(cv.missing, c.LSN) // compacted away, or an error found by gone()
	case errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNewerFormat):
		return err
	case err != nil:
		return fmt.Errorf("pull volume %s: %s: %w", v.name, what, err)
	default:
		rep.Segments, rep.Bytes = rep.Segments+1, rep.Bytes+c.Segment.Size
	}
	return nil
}

// pullRanged checks c's large segment by ranges (checkRanges) while
// writing them to a temp file, which becomes its local file once the whole
// segment checks out.
func (v *Volume) pullRanged(ctx context.Context, c *Commit) error {
	path := v.localSegment(c.Segment.Key)
	fsys := v.files()
	f, err := fsys.CreateTemp(filepath.Join(v.dir, "tmp"), "p-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := durable.FillWith(f, func(w io.Writer) error { return v.checkRanges(ctx, c, w) }); err != nil {
		return err
	}
	return staged{path: path, tmp: f.Name(), fs: fsys}.place()
}
