package graft

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/silt-dev/silt/pkg/fence"
)

// VerifyReport says what Verify checked.
type VerifyReport struct {
	Commits  int   `json:"commits"`
	Segments int   `json:"segments"`
	Pages    int64 `json:"pages"`
	Bytes    int64 `json:"bytes"`
}

// VerifyRemote checks the remote copy: every commit object's checksum, the
// hash chain and LSN sequence, and every segment's SHA-256, page checksums
// and page ranges against its commit. The error names the first bad object.
func (v *Volume) VerifyRemote(ctx context.Context) (VerifyReport, error) {
	var rep VerifyReport
	keys, err := v.store.List(ctx, v.name+"/commits/", "", 0)
	if err != nil {
		return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
	}
	prev := ""
	for i, key := range keys {
		b, err := v.store.Get(ctx, key, fence.Range{})
		if err != nil {
			return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
		}
		c, err := DecodeCommit(key, b)
		if err != nil {
			return rep, err
		}
		if err := chained(key, c, uint64(i)+1, prev); err != nil {
			return rep, err
		}
		seg, err := v.store.Get(ctx, c.Segment.Key, fence.Range{})
		if err != nil {
			return rep, fmt.Errorf("verify volume %s: commit %s: %w", v.name, key, err)
		}
		if err := checkAgainst(c.Segment.Key, seg, c); err != nil {
			return rep, err
		}
		prev = c.Hash()
		rep.Commits, rep.Segments, rep.Pages, rep.Bytes = rep.Commits+1, rep.Segments+1, rep.Pages+int64(c.Pages), rep.Bytes+int64(len(seg))
	}
	return rep, nil
}

// VerifyLocal checks the local files the same way: commit files, the chain,
// and every segment file present (missing ones are fetched on demand).
func (v *Volume) VerifyLocal(ctx context.Context) (VerifyReport, error) {
	var rep VerifyReport
	v.mu.Lock()
	commits := slices.Clone(v.commits)
	v.mu.Unlock()
	prev := ""
	for i, c := range commits {
		path := v.localCommit(c.LSN)
		b, err := os.ReadFile(path)
		if err != nil {
			return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
		}
		lc, err := DecodeCommit(path, b)
		if err != nil {
			return rep, err
		}
		if err := chained(path, lc, uint64(i)+1, prev); err != nil {
			return rep, err
		}
		prev = lc.Hash()
		rep.Commits++
		seg, err := os.ReadFile(v.localSegment(c.Segment.Key))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return rep, fmt.Errorf("verify volume %s: %w", v.name, err)
		}
		if err := checkAgainst(v.localSegment(c.Segment.Key), seg, lc); err != nil {
			return rep, err
		}
		rep.Segments, rep.Pages, rep.Bytes = rep.Segments+1, rep.Pages+int64(c.Pages), rep.Bytes+int64(len(seg))
	}
	return rep, nil
}

func chained(name string, c *Commit, lsn uint64, prev string) error {
	switch {
	case c.LSN != lsn:
		return fmt.Errorf("commit %s: %w: LSN %d where %d was expected", name, ErrCorrupt, c.LSN, lsn)
	case c.Prev != prev:
		return fmt.Errorf("commit %s: %w: hash chain broken (prev %.12s, want %.12s)", name, ErrCorrupt, c.Prev, prev)
	}
	return nil
}

// checkAgainst verifies a segment's bytes and that its pages are exactly the
// commit's page ranges.
func checkAgainst(name string, b []byte, c *Commit) error {
	seg, err := checkSegment(name, b, c)
	if err != nil {
		return err
	}
	pages := seg.Pages()
	i := 0
	for _, r := range c.Ranges {
		for no := r.Lo; ; no++ {
			if i >= len(pages) || pages[i] != no {
				return fmt.Errorf("segment %s: %w: pages differ from commit %d's ranges at page %d", name, ErrCorrupt, c.LSN, no)
			}
			i++
			if no == r.Hi {
				break
			}
		}
	}
	if i != len(pages) {
		return fmt.Errorf("segment %s: %w: %d pages beyond commit %d's ranges", name, ErrCorrupt, len(pages)-i, c.LSN)
	}
	return nil
}

// Pull rebuilds the local copy from the remote: every commit and segment is
// fetched, verified and written locally, replacing what was there.
func (v *Volume) Pull(ctx context.Context) (VerifyReport, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var rep VerifyReport
	keys, err := v.store.List(ctx, v.name+"/commits/", "", 0)
	if err != nil {
		return rep, fmt.Errorf("pull volume %s: %w", v.name, err)
	}
	var chain []*Commit
	prev := ""
	for i, key := range keys {
		c, obj, seg, err := v.fetchPair(ctx, key, uint64(i)+1, prev)
		if err != nil {
			return rep, err
		}
		if err := v.writeFile(v.localSegment(c.Segment.Key), seg); err != nil {
			return rep, err
		}
		if err := v.writeFile(v.localCommit(c.LSN), obj); err != nil {
			return rep, err
		}
		chain, prev = append(chain, c), c.Hash()
		rep.Commits, rep.Segments, rep.Pages, rep.Bytes = rep.Commits+1, rep.Segments+1, rep.Pages+int64(c.Pages), rep.Bytes+int64(len(seg))
	}
	v.commits = nil
	v.loading = true
	for _, c := range chain {
		v.push(c)
	}
	v.loading = false
	if v.KeepMeta != nil {
		v.writeIndex()
	}
	clear(v.cache)
	return rep, nil
}

// fetchPair fetches and checks one remote commit and its segment.
func (v *Volume) fetchPair(ctx context.Context, key string, lsn uint64, prev string) (c *Commit, obj, seg []byte, err error) {
	if obj, err = v.store.Get(ctx, key, fence.Range{}); err != nil {
		return nil, nil, nil, fmt.Errorf("pull volume %s: %w", v.name, err)
	}
	if c, err = DecodeCommit(key, obj); err != nil {
		return nil, nil, nil, err
	}
	if err := chained(key, c, lsn, prev); err != nil {
		return nil, nil, nil, err
	}
	if seg, err = v.store.Get(ctx, c.Segment.Key, fence.Range{}); err != nil {
		return nil, nil, nil, fmt.Errorf("pull volume %s: %w", v.name, err)
	}
	return c, obj, seg, checkAgainst(c.Segment.Key, seg, c)
}

// GC removes segments no commit references: remote ones older than grace (a
// crashed or losing upload leaves them), and such local files. It returns how
// many remote objects it deleted.
func (v *Volume) GC(ctx context.Context, grace time.Duration) (int, error) {
	if err := v.Refresh(ctx); err != nil {
		return 0, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	referenced := map[string]bool{}
	for _, c := range v.commits {
		referenced[c.Segment.Key] = true
	}
	keys, err := v.store.List(ctx, v.name+"/segments/", "", 0)
	if err != nil {
		return 0, fmt.Errorf("gc volume %s: %w", v.name, err)
	}
	deleted := 0
	for _, k := range keys {
		if referenced[k] || time.Since(segmentTime(k)) < grace {
			continue
		}
		if err := v.store.Delete(ctx, k); err != nil {
			return deleted, fmt.Errorf("gc volume %s: %w", v.name, err)
		}
		deleted++
	}
	return deleted, v.gcLocal(referenced, grace)
}

func (v *Volume) gcLocal(referenced map[string]bool, grace time.Duration) error {
	files, err := os.ReadDir(filepath.Join(v.dir, "segments"))
	if err != nil {
		return err
	}
	for _, f := range files {
		key := v.name + "/segments/" + f.Name()
		if !referenced[key] && time.Since(segmentTime(key)) >= grace {
			os.Remove(filepath.Join(v.dir, "segments", f.Name()))
		}
	}
	return nil
}

// segmentTime reads the creation time from a segment key
// <volume>/segments/<lsn>-<unix ms>-<writer>; an unreadable key is old.
func segmentTime(key string) time.Time {
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
