package graft

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/silt-dev/silt/pkg/fence"
)

// MinGrace is the smallest grace GC accepts unless forced: a reader or a
// writer in flight holds a state for at most this long.
const MinGrace = time.Minute

// GC removes what no state a reader may hold references, once older than
// grace: segments no entry names (a crashed or losing upload leaves them,
// and compaction replaces them), checkpoint roots superseded for longer
// than grace, and the leaves only they named; and such local segment
// files. A state a reader may hold is the current one or that of a
// checkpoint superseded less than grace ago. GC reads the current state
// first and never deletes a segment made for a commit above its head: one
// committed meanwhile, or in flight. It lists the remote in pages (gcPage
// keys) and holds the live segments as 16 bytes each, so a volume of a
// million segments never collected is collected in a few tens of
// megabytes. It returns how many remote objects it deleted.
func (v *Volume) GC(ctx context.Context, grace time.Duration, force bool) (int, error) {
	if grace < MinGrace && !force {
		return 0, fmt.Errorf("gc volume %s: %w: %s is under %s; a commit in flight could lose its segment (force to override)", v.name, ErrGraceTooShort, grace, MinGrace)
	}
	if err := v.Refresh(ctx); err != nil {
		return 0, err
	}
	head := v.Head()
	roots, err := v.keptRoots(ctx, grace)
	if err != nil {
		return 0, err
	}
	live, err := v.liveSegments(ctx, roots)
	if err != nil {
		return 0, fmt.Errorf("gc volume %s: %w", v.name, err)
	}
	garbage := func(key string) bool {
		return madeFor(key) <= head && !live.has(key) && time.Since(keyTime(key)) >= grace
	}
	deleted, err := v.deleteListed(ctx, v.name+"/segments/", garbage)
	if err != nil {
		return deleted, err
	}
	n, err := v.gcCheckpoints(ctx, roots, grace)
	deleted += n
	if err != nil {
		return deleted, err
	}
	return deleted, v.gcLocal(garbage)
}

// liveSegments returns the segments a reader may need: those of the
// current entries, of the tail (compaction commits not yet checkpointed)
// and of every entry the kept roots' leaves hold. A packed commit's
// segment is the commit object itself.
func (v *Volume) liveSegments(ctx context.Context, k kept) (liveSegments, error) {
	var live liveSegments
	for c, err := range v.Entries(ctx, nil) {
		if err != nil {
			return nil, err
		}
		live.add(c.Segment.Key)
	}
	for _, c := range v.state().tail {
		live.add(c.Segment.Key)
	}
	for _, ref := range k.leaves {
		entries, err := v.leaf(ctx, ref)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			live.add(e.Segment.Key)
		}
	}
	live.seal()
	return live, nil
}

// gcPage is how many keys gc lists at a time.
var gcPage = 50_000

// gcDeletes is how many deletes gc keeps in flight: the first gc of an
// archive that never had one deletes a segment per commit it compacted, a
// million requests for a year of 30-second commits, hours one at a time
// against an object store 20-50 ms away.
const gcDeletes = 16

// deleteListed deletes the keys under prefix that garbage picks, listing
// them a page at a time and deleting gcDeletes at once. The first failed
// delete stops it.
func (v *Volume) deleteListed(ctx context.Context, prefix string, garbage func(key string) bool) (int, error) {
	return v.deleteInOrder(ctx, "gc volume "+v.name, prefix, "", func(key string) (bool, bool) { return garbage(key), false })
}

// deleteInOrder deletes, gcDeletes at once, the keys under prefix after
// after that pick chooses, until the listing ends or pick says stop. The
// first failed delete stops it; op begins its errors.
func (v *Volume) deleteInOrder(ctx context.Context, op, prefix, after string, pick func(key string) (del, stop bool)) (int, error) {
	var deleted atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(gcDeletes)
	for k, err := range v.listedAfter(gctx, prefix, after) {
		if err != nil {
			if derr := g.Wait(); derr != nil {
				err = derr // a failed delete cancelled the listing
			} else {
				err = fmt.Errorf("%s: %w", op, err)
			}
			return int(deleted.Load()), err
		}
		if gctx.Err() != nil { // a delete failed (or ctx is done): issue no more
			break
		}
		del, stop := pick(k)
		if stop {
			break
		}
		if !del {
			continue
		}
		g.Go(func() error {
			if err := v.store.Delete(gctx, k); err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
			deleted.Add(1)
			return nil
		})
	}
	err := g.Wait()
	if err == nil && ctx.Err() != nil { // cancelled, not stopped by a failed delete
		err = fmt.Errorf("%s: %w", op, ctx.Err())
	}
	return int(deleted.Load()), err
}

// liveSegments is a set of segment keys held as their LSN and a 64-bit
// hash of the key: 16 bytes a segment. Two keys of one LSN whose hashes
// collide count as one, which can only keep an orphan, never lose a live
// segment.
type liveSegments []liveKey

type liveKey struct{ lsn, hash uint64 }

func liveKeyOf(key string) liveKey { return liveKey{madeFor(key), keyHash(key)} }

func (a liveKey) compare(b liveKey) int {
	return cmp.Or(cmp.Compare(a.lsn, b.lsn), cmp.Compare(a.hash, b.hash))
}

func (s *liveSegments) add(key string) { *s = append(*s, liveKeyOf(key)) }

// seal sorts the set; has needs it.
func (s liveSegments) seal() { slices.SortFunc(s, liveKey.compare) }

func (s liveSegments) has(key string) bool {
	_, ok := slices.BinarySearchFunc(s, liveKeyOf(key), liveKey.compare)
	return ok
}

func keyHash(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64()
}

// madeFor reads the LSN a segment key <volume>/segments/<lsn>-<ms>-<writer>
// or an index node key <volume>/index|branches/<lsn>-<ms>-<sha256> was made
// for; 0 when it has none.
func madeFor(key string) uint64 {
	name := key[strings.LastIndexByte(key, '/')+1:]
	digits, _, _ := strings.Cut(name, "-")
	lsn, _ := strconv.ParseUint(digits, 10, 64)
	return lsn
}

// DropOldCommits deletes the commit objects before the oldest checkpoint a
// reader may hold (as GC counts them, with the same grace), at most limit
// a call (0: all of them), gcDeletes at once, so a volume of a million
// commits keeps about as many objects as it has live segments. Readers
// never need those commits (they open from a checkpoint). Before deleting
// anything it marks how far it may delete (dropped/, newest first): verify
// and pull forgive commits missing up to the newest mark, however the drop
// ended (its limit, an error, a kill), and start the chain at the oldest
// checkpoint above them
// (VerifyReport.ChainStart, Unchained). It returns how many it deleted.
func (v *Volume) DropOldCommits(ctx context.Context, grace time.Duration, force bool, limit int) (int, error) {
	if grace < MinGrace && !force {
		return 0, fmt.Errorf("drop old commits of volume %s: %w: %s is under %s (force to override)", v.name, ErrGraceTooShort, grace, MinGrace)
	}
	k, err := v.keptRoots(ctx, grace)
	if err != nil || len(k.roots) == 0 {
		return 0, err
	}
	oldest, _ := checkpointLSN(k.roots[len(k.roots)-1]) // the root holds commit oldest whole
	prefix := v.name + "/commits/"
	first, err := v.store.List(ctx, prefix, "", 1)
	if err != nil {
		return 0, fmt.Errorf("drop old commits of volume %s: %w", v.name, err)
	}
	if len(first) == 0 {
		return 0, nil
	}
	if lsn, ok := keyLSN(first[0]); !ok || lsn > oldest {
		return 0, nil
	}
	// A packed commit holds its segment: it stays while a reader may need
	// that segment (until compaction replaced it and gc's grace passed).
	if err := v.Refresh(ctx); err != nil {
		return 0, fmt.Errorf("drop old commits of volume %s: %w", v.name, err)
	}
	live, err := v.liveSegments(ctx, k)
	if err != nil {
		return 0, fmt.Errorf("drop old commits of volume %s: %w", v.name, err)
	}
	if err := v.markDropped(ctx, oldest); err != nil {
		return 0, err
	}
	picked := 0
	return v.deleteInOrder(ctx, "drop old commits of volume "+v.name, prefix, "", func(key string) (bool, bool) {
		lsn, ok := keyLSN(key)
		if !ok || lsn > oldest || limit > 0 && picked >= limit {
			return false, true
		}
		if live.has(key) {
			return false, false
		}
		picked++
		return true, false
	})
}

// markDropped records, before a drop deletes anything, that the commits
// up to lsn may be gone, and removes the marks it supersedes.
func (v *Volume) markDropped(ctx context.Context, lsn uint64) error {
	mark := fmt.Appendf(nil, "{\"version\":1,\"volume\":%q,\"commits_up_to\":%d,\"writer\":%q,\"time\":%q}\n",
		v.name, lsn, v.writer, time.Now().UTC().Format(time.RFC3339Nano))
	if err := v.store.Create(ctx, v.droppedKey(lsn), mark); err != nil && !errors.Is(err, fence.ErrExists) {
		return fmt.Errorf("drop old commits of volume %s: mark: %w", v.name, err)
	}
	_, err := v.deleteInOrder(ctx, "drop old commits of volume "+v.name, v.name+"/dropped/", v.droppedKey(lsn),
		func(string) (bool, bool) { return true, false })
	return err
}

// kept is what gc keeps of the checkpoints: the roots a reader may hold
// (newest first), the leaves they name, and the roots to delete.
type kept struct {
	roots, stale []string
	nodes        map[string]bool // leaves and branches the kept roots name
	leaves       []nodeRef
	newest       uint64
}

// keptRoots reads the checkpoint roots newest first, keeping each until
// one older than grace (every root older than that was superseded over
// grace ago).
func (v *Volume) keptRoots(ctx context.Context, grace time.Duration) (kept, error) {
	k := kept{nodes: map[string]bool{}}
	roots, err := v.store.List(ctx, v.name+"/checkpoints/", "", 0) // newest first
	if err != nil {
		return k, fmt.Errorf("gc volume %s: %w", v.name, err)
	}
	for i, key := range roots {
		obj, err := v.store.Get(ctx, key, fence.Range{})
		if err != nil {
			return k, fmt.Errorf("gc volume %s: %w", v.name, err)
		}
		ck, err := decodeCheckpoint(key, obj)
		if err != nil {
			return k, fmt.Errorf("gc volume %s: %w (gc deletes nothing while a checkpoint is unreadable)", v.name, err)
		}
		for _, b := range ck.Branches {
			if k.nodes[b.Key] {
				continue // shared with a newer root: its leaves are listed
			}
			k.nodes[b.Key] = true
			refs, err := v.branch(ctx, b)
			if err != nil {
				return k, fmt.Errorf("gc volume %s: %w (gc deletes nothing while a checkpoint is unreadable)", v.name, err)
			}
			for _, l := range refs {
				if !k.nodes[l.Key] {
					k.nodes[l.Key] = true
					k.leaves = append(k.leaves, l)
				}
			}
		}
		k.roots, k.newest = append(k.roots, key), max(k.newest, ck.LSN)
		if time.Since(ck.Time) >= grace {
			k.stale = roots[i+1:]
			break
		}
	}
	return k, nil
}

// gcCheckpoints deletes the stale roots, then the leaves and branches no
// kept root names, once older than grace (a checkpoint in flight writes its
// nodes before its root).
func (v *Volume) gcCheckpoints(ctx context.Context, k kept, grace time.Duration) (int, error) {
	deleted := 0
	for _, key := range k.stale {
		if err := v.store.Delete(ctx, key); err != nil {
			return deleted, fmt.Errorf("gc volume %s: %w", v.name, err)
		}
		deleted++
	}
	if len(k.roots) == 0 {
		return deleted, nil
	}
	// A node made for a checkpoint above the newest root belongs to one in
	// flight: kept, whatever its writer's clock put in its key.
	garbage := func(key string) bool {
		return !k.nodes[key] && madeFor(key) <= k.newest && time.Since(keyTime(key)) >= grace
	}
	for _, dir := range []string{"/index/", "/branches/"} {
		n, err := v.deleteListed(ctx, v.name+dir, garbage)
		deleted += n
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

// gcLocal removes the local segment files garbage picks, reading the
// directory in chunks.
func (v *Volume) gcLocal(garbage func(key string) bool) error {
	dir := filepath.Join(v.dir, "segments")
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		files, err := f.ReadDir(1024)
		for _, file := range files {
			key := v.name + "/segments/" + file.Name()
			if !strings.Contains(file.Name(), "-") { // a packed commit's segment, named by its LSN
				key = v.name + "/commits/" + file.Name()
			}
			if garbage(key) {
				os.Remove(filepath.Join(dir, file.Name()))
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// keyTime reads the creation time from a segment key
// <volume>/segments/<lsn>-<unix ms>-<writer> or an index node key
// <volume>/index/<lsn>-<unix ms>-<sha256>; an unreadable key is old.
func keyTime(key string) time.Time {
	parts := strings.Split(filepath.Base(key), "-")
	if len(parts) != 3 {
		return time.Time{}
	}
	ms, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
