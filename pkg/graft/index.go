package graft

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/silt-dev/silt/pkg/fence"
)

// The index under construction: branches, each a ref left as it is or its
// leaves in hand; leaves, each a ref left as it is or its entries in hand.
type (
	bchunk struct {
		ref    *nodeRef
		leaves []lchunk
	}
	lchunk struct {
		ref     *nodeRef
		entries []Entry
	}
)

// span is the page span of a chunk's entries (1, 0 when it has none: it
// overlaps nothing).
func (c *lchunk) span() (uint64, uint64) {
	switch {
	case c.ref != nil:
		return c.ref.Lo, c.ref.Hi
	case len(c.entries) == 0:
		return 1, 0
	}
	return c.entries[0].lo(), c.entries[len(c.entries)-1].hi()
}

func (c *bchunk) span() (uint64, uint64) {
	if c.ref != nil {
		return c.ref.Lo, c.ref.Hi
	}
	lo, hi, any := uint64(0), uint64(0), false
	for i := range c.leaves {
		l, h := c.leaves[i].span()
		if l > h {
			continue
		}
		if !any {
			lo = l
		}
		hi, any = h, true
	}
	if !any {
		return 1, 0
	}
	return lo, hi
}

// index is the builder: it opens (materialises) only the nodes a change
// touches.
type index struct {
	v        *Volume
	ctx      context.Context
	lsn      uint64 // the checkpoint's
	branches []bchunk
}

func (x *index) openBranch(i int) error {
	b := &x.branches[i]
	if b.ref == nil {
		return nil
	}
	refs, err := x.v.branch(x.ctx, *b.ref)
	if err != nil {
		return err
	}
	refs = slices.Clone(refs) // the cached branch stays as it is
	b.ref, b.leaves = nil, make([]lchunk, len(refs))
	for j := range refs {
		b.leaves[j] = lchunk{ref: &refs[j]}
	}
	return nil
}

func (x *index) openLeaf(i, j int) error {
	l := &x.branches[i].leaves[j]
	if l.ref == nil {
		return nil
	}
	entries, err := x.v.leaf(x.ctx, *l.ref)
	if err != nil {
		return err
	}
	l.ref, l.entries = nil, slices.Clone(entries)
	return nil
}

// appendEntry adds e after every entry: into the last leaf when it is not
// full, else a new one.
func (x *index) appendEntry(e Entry) error {
	n := len(x.branches)
	if n > 0 && x.branches[n-1].ref != nil && x.branches[n-1].ref.Children >= branchSize {
		// A full branch takes no more leaves; its last leaf may have room.
		refs, err := x.v.branch(x.ctx, *x.branches[n-1].ref)
		if err != nil {
			return err
		}
		if refs[len(refs)-1].Children >= leafSize {
			x.branches = append(x.branches, bchunk{})
			n++
		}
	}
	if n == 0 {
		x.branches = append(x.branches, bchunk{})
		n++
	}
	if err := x.openBranch(n - 1); err != nil {
		return err
	}
	b := &x.branches[n-1]
	m := len(b.leaves)
	if m > 0 && b.leaves[m-1].ref != nil && b.leaves[m-1].ref.Children < leafSize {
		if err := x.openLeaf(n-1, m-1); err != nil {
			return err
		}
	}
	if m == 0 || b.leaves[m-1].ref != nil {
		b.leaves = append(b.leaves, lchunk{})
		m++
	}
	b.leaves[m-1].entries = append(b.leaves[m-1].entries, e)
	return nil
}

// replace puts compaction entry e in place of the entries inside its span.
// An entry that straddles the span's edge means the compaction was built on
// another state: corrupt.
func (x *index) replace(e Entry) error {
	r := *e.Replaces
	overlaps := func(lo, hi uint64) bool { return lo <= hi && hi >= r.Lo && lo <= r.Hi }
	placed := false
	for i := range x.branches {
		if !overlaps(x.branches[i].span()) {
			continue
		}
		if err := x.openBranch(i); err != nil {
			return err
		}
		for j := range x.branches[i].leaves {
			if !overlaps(x.branches[i].leaves[j].span()) {
				continue
			}
			if err := x.openLeaf(i, j); err != nil {
				return err
			}
			l := &x.branches[i].leaves[j]
			kept := l.entries[:0:0]
			for _, y := range l.entries {
				switch {
				case y.hi() < r.Lo || y.lo() > r.Hi:
					kept = append(kept, y)
				case y.lo() >= r.Lo && y.hi() <= r.Hi:
					if !placed {
						kept, placed = append(kept, e), true
					}
				default:
					return fmt.Errorf("%w: compaction commit %d replaces pages %d-%d, entry %d straddles them (%d-%d)", ErrCorrupt, e.LSN, r.Lo, r.Hi, y.LSN, y.lo(), y.hi())
				}
			}
			l.entries = kept
		}
	}
	if !placed {
		return fmt.Errorf("%w: compaction commit %d replaces pages %d-%d, which no entry holds", ErrCorrupt, e.LSN, r.Lo, r.Hi)
	}
	return nil
}

// prune drops every entry whose pages are all below page below: whole
// branches and leaves by their refs, the boundary leaf opened.
func (x *index) prune(below uint64) error {
	var kept []bchunk
	for i := range x.branches {
		if lo, hi := x.branches[i].span(); lo <= hi && hi < below {
			continue
		} else if lo >= below || lo > hi {
			kept = append(kept, x.branches[i])
			continue
		}
		if err := x.openBranch(i); err != nil {
			return err
		}
		var leaves []lchunk
		for j := range x.branches[i].leaves {
			l := &x.branches[i].leaves[j]
			if lo, hi := l.span(); lo <= hi && hi < below {
				continue
			} else if lo < below && lo <= hi {
				if err := x.openLeaf(i, j); err != nil {
					return err
				}
				l.entries = slices.DeleteFunc(l.entries, func(e Entry) bool { return e.hi() < below })
			}
			leaves = append(leaves, *l)
		}
		if len(leaves) > 0 {
			kept = append(kept, bchunk{leaves: leaves})
		}
	}
	x.branches = kept
	return nil
}

// buildIndex applies the commits after base to its index: a commit of new
// pages is appended; a compaction commit takes the place of the entries
// inside the span it replaces. Nodes nothing touched keep their keys; the
// entries and leaf refs in hand are packed into full nodes and uploaded.
// A volume stays monotonic while every appended commit's pages are above
// all earlier ones.
func (v *Volume) buildIndex(ctx context.Context, base *checkpoint, tail []*Commit) ([]nodeRef, bool, error) {
	x := &index{v: v, ctx: ctx, lsn: tail[len(tail)-1].LSN}
	mono, top, seen := true, uint64(0), false
	if base != nil {
		mono = base.Monotonic
		for i := range base.Branches {
			x.branches = append(x.branches, bchunk{ref: &base.Branches[i]})
			top, seen = max(top, base.Branches[i].Hi), true
		}
	}
	for _, c := range tail {
		e := entryOf(c, v.KeepMeta)
		var err error
		if e.PruneBelow > 0 {
			if !mono {
				return nil, false, fmt.Errorf("%w: prune commit %d in a volume whose pages are not in commit order", ErrCorrupt, e.LSN)
			}
			err = x.prune(e.PruneBelow)
		} else if e.Replaces == nil {
			if seen && e.lo() <= top {
				mono = false
			}
			top, seen = max(top, e.hi()), true
			err = x.appendEntry(e)
		} else if !mono {
			err = fmt.Errorf("%w: compaction commit %d in a volume whose pages are not in commit order", ErrCorrupt, e.LSN)
		} else {
			err = x.replace(e)
		}
		if err != nil {
			return nil, false, err
		}
	}
	refs, err := x.pack()
	return refs, mono, err
}

// pack uploads the nodes in hand: entries into leaves of leafSize, leaf
// refs into branches of branchSize, consecutive ones in hand packed
// together so the full nodes before the change keep their keys.
func (x *index) pack() ([]nodeRef, error) {
	var out, leafRefs []nodeRef
	var entries []Entry
	flushEntries := func() error {
		for len(entries) > 0 {
			n := min(len(entries), leafSize)
			ref, err := x.putLeaf(entries[:n])
			if err != nil {
				return err
			}
			leafRefs, entries = append(leafRefs, ref), entries[n:]
		}
		return nil
	}
	flushLeaves := func() error {
		if err := flushEntries(); err != nil {
			return err
		}
		for len(leafRefs) > 0 {
			n := min(len(leafRefs), branchSize)
			ref, err := x.putBranch(leafRefs[:n])
			if err != nil {
				return err
			}
			out, leafRefs = append(out, ref), leafRefs[n:]
		}
		return nil
	}
	for _, b := range x.branches {
		if b.ref != nil {
			if err := flushLeaves(); err != nil {
				return nil, err
			}
			out = append(out, *b.ref)
			continue
		}
		for _, l := range b.leaves {
			if l.ref != nil {
				if err := flushEntries(); err != nil {
					return nil, err
				}
				leafRefs = append(leafRefs, *l.ref)
				continue
			}
			entries = append(entries, l.entries...)
		}
	}
	return out, flushLeaves()
}

// putLeaf and putBranch upload a node and return its ref, which
// summarises it for the searches of its parent.
func (x *index) putLeaf(entries []Entry) (nodeRef, error) {
	first, last := entries[0], entries[len(entries)-1]
	ref := nodeRef{Children: len(entries), Entries: len(entries), Lo: first.lo(), Hi: last.hi(), FirstLSN: first.LSN, LastLSN: last.LSN, Last: last.Meta}
	for _, e := range entries {
		ref.Lo, ref.Hi, ref.Bytes = min(ref.Lo, e.lo()), max(ref.Hi, e.hi()), ref.Bytes+e.Segment.Size
	}
	return ref, x.putNode("index", &ref, entries)
}

func (x *index) putBranch(leaves []nodeRef) (nodeRef, error) {
	first, last := leaves[0], leaves[len(leaves)-1]
	ref := nodeRef{Children: len(leaves), Lo: first.Lo, Hi: last.Hi, FirstLSN: first.FirstLSN, LastLSN: last.LastLSN, Last: last.Last}
	for _, l := range leaves {
		ref.Entries, ref.Bytes = ref.Entries+l.Entries, ref.Bytes+l.Bytes
		ref.Lo, ref.Hi = min(ref.Lo, l.Lo), max(ref.Hi, l.Hi)
	}
	return ref, x.putNode("branches", &ref, leaves)
}

func (x *index) putNode(dir string, ref *nodeRef, children any) error {
	obj, err := sealed(children)
	if err != nil {
		return err
	}
	ref.Key, ref.Size = x.v.nodeKey(dir, x.lsn, obj), int64(len(obj))
	if err := x.v.store.Create(x.ctx, ref.Key, obj); err != nil && !errors.Is(err, fence.ErrExists) { // same key: same bytes
		return fmt.Errorf("checkpoint node of volume %s: %w", x.v.name, err)
	}
	return nil
}
