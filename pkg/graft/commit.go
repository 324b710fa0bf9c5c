package graft

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"slices"
	"time"

	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/fence"
)

// Commit writes pages as the next LSN with meta and returns the commit. The
// steps: segment written locally (fsync), uploaded create-only under a key
// unique to this writer, then the commit object created with If-None-Match:
// *, then the local head, whose directory is synced beside the caller
// (Sync waits for it; the next commit does). Losing the race for the LSN
// adopts the winner and returns a *ConflictError; nothing of ours becomes
// visible.
func (v *Volume) Commit(ctx context.Context, pages []Page, meta map[string]string) (*Commit, error) {
	byNo := func(a, b Page) int { return cmp.Compare(a.No, b.No) }
	if !slices.IsSortedFunc(pages, byNo) { // sort a copy: the caller's slice stays as it is
		pages = slices.Clone(pages)
		slices.SortFunc(pages, byNo)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	c, err := v.commit(ctx, pages, meta, nil)
	if err != nil {
		return nil, err
	}
	if v.CheckpointEvery >= 0 && v.checkpointDue() {
		if _, err := v.checkpoint(ctx); err != nil {
			// The commit stands; the next commit's tail carries on until a
			// checkpoint succeeds.
			v.warnf("checkpoint at commit %d not written: %v", c.LSN, err)
		}
	}
	return c, nil
}

// commit writes the next commit with v.mu held; with edit, the commit is
// changed before it is encoded (a compaction's fields).
func (v *Volume) commit(ctx context.Context, pages []Page, meta map[string]string, edit func(*Commit)) (_ *Commit, err error) {
	lsn := v.headLSN() + 1
	if edit == nil && !v.Unpacked {
		return v.commitPacked(ctx, lsn, pages, meta)
	}
	sum := sha256.New()
	seg, err := appendSegmentHashed(v.segBuf, lsn, pages, sum, nil)
	v.segBuf = nil
	if err != nil {
		return nil, err
	}
	defer func() {
		// Only a commit that went through hands its buffer on: after a
		// failed upload the HTTP transport may still be reading it.
		if err == nil && cap(seg) <= maxReusedSegment {
			v.segBuf = seg
		}
	}()
	c := v.newCommit(lsn, int64(len(seg)), hex.EncodeToString(sum.Sum(nil)), rangesOf(pages), uint64(len(pages)), meta)
	if edit != nil {
		edit(c)
	}
	if c.Segment.Key != "" { // a prune commit has none
		if err := v.writeSegment(ctx, c.Segment.Key, seg, c.Segment.SHA256); err != nil {
			return nil, err
		}
	}
	if err := v.put(ctx, c); err != nil {
		return nil, err
	}
	return c, nil
}

// recordSlack is room left after a packed commit's segment for its record
// and footer, so they are appended without copying the segment.
const recordSlack = 64 << 10

// commitPacked writes the next commit as one packed object (commit.go):
// the segment is laid out after the preamble and hashed once (beside its
// layout when large: appendSegmentHashed), the record and footer
// appended, and the object created with If-None-Match: * while the
// segment and the record are written and fsynced locally.
func (v *Volume) commitPacked(ctx context.Context, lsn uint64, pages []Page, meta map[string]string) (_ *Commit, err error) {
	n := len(packedPreamble)
	buf := v.segBuf[:0]
	v.segBuf = nil
	if size := n + segmentSize(pages) + recordSlack; cap(buf) < size {
		buf = make([]byte, 0, size)
	}
	buf = append(buf, packedPreamble...)
	sum := sha256.New()
	seg, err := appendSegmentHashed(buf[n:n], lsn, pages, sum, buf[:n])
	if err != nil {
		return nil, err
	}
	obj := buf[:n+len(seg)] // seg was laid out in buf's storage, after the preamble
	if &obj[n] != &seg[0] {
		obj = append(buf, seg...) // the same bytes: sum holds their hash
	}
	defer func() {
		if err == nil && cap(obj) <= maxReusedSegment {
			v.segBuf = obj
		}
	}()
	c := v.newCommit(lsn, int64(len(obj)), hex.EncodeToString(sum.Sum(nil)), rangesOf(pages), uint64(len(pages)), meta)
	c.Version, c.Segment.Key, c.Segment.Offset = packedVersion, v.commitKey(lsn), int64(n)
	obj, whole, err := appendPacked(obj, c, sum)
	if err != nil {
		return nil, err
	}
	// The local segment is staged, not written in place: its name is the
	// LSN's, which another writer may win (a format 1 segment's key is its
	// writer's own).
	if err := v.createCommit(ctx, c, obj, whole, obj[:c.Segment.Size]); err != nil {
		return nil, err
	}
	return c, nil
}

// hashBeside is how long a segment is, at least, for its hash to run on
// a goroutine of its own beside its layout.
const hashBeside = 1 << 20

// appendSegmentHashed is appendSegment that also writes head, then the
// segment, into sum. A segment of hashBeside bytes or more is hashed
// part by part, on a goroutine of its own, while the rest is laid out: a
// 4 MiB segment's layout (1.0-1.4 ms) goes beside its hash (2.4 ms)
// instead of before it, on a commit's path to its PUT.
func appendSegmentHashed(dst []byte, lsn uint64, pages []Page, sum hash.Hash, head []byte) ([]byte, error) {
	sum.Write(head)
	if segmentSize(pages) < hashBeside {
		seg, err := appendSegment(dst, lsn, pages)
		if err == nil {
			sum.Write(seg)
		}
		return seg, err
	}
	parts := make(chan []byte, 64)
	hashed := make(chan struct{})
	go func() {
		defer close(hashed)
		for p := range parts {
			sum.Write(p)
		}
	}()
	seg, err := appendSegmentTelling(dst, lsn, pages, func(p []byte) { parts <- p })
	close(parts)
	<-hashed
	return seg, err
}

// put creates the commit object of c, whose segment is stored, and makes c
// the head.
func (v *Volume) put(ctx context.Context, c *Commit) error {
	obj, err := c.Encode()
	if err != nil {
		return err
	}
	return v.createCommit(ctx, c, obj, "", nil)
}

// createCommit is the last step of both commit paths: it creates c's
// commit object (obj, with hashed its SHA-256 when known) with
// If-None-Match: *, while the local copy of c's record (and of segment,
// for a packed commit, which holds it) is written and fsynced beside it.
// Only once the remote holds the object are they renamed into place and c
// made the head. A lost race drops them, adopts the winner and returns a
// *ConflictError.
func (v *Volume) createCommit(ctx context.Context, c *Commit, obj []byte, hashed string, segment []byte) error {
	if err := v.Sync(); err != nil { // the commit before is durable here before this one exists anywhere
		return fmt.Errorf("commit %d: %w", c.LSN, err)
	}
	var local chan staged
	if segment != nil {
		local = make(chan staged, 1)
		go func() {
			s := v.stageFile(v.localSegment(c.Segment.Key), segment)
			if s.err == nil {
				v.failpoint(failpoint.SegmentWritten)
			}
			local <- s
		}()
	}
	record := make(chan staged, 1)
	go func() { record <- v.stageFile(v.localCommit(c.LSN), c.raw) }()
	err := v.create(ctx, v.commitKey(c.LSN), obj, hashed)
	rec := <-record
	var seg staged
	if local != nil {
		seg = <-local
	}
	if err != nil {
		rec.drop()
		if local != nil {
			seg.drop()
		}
		if errors.Is(err, fence.ErrExists) {
			return v.lost(ctx, c.LSN)
		}
		return fmt.Errorf("commit %d of volume %s: %w", c.LSN, v.name, err)
	}
	if local != nil {
		v.failpoint(failpoint.SegmentUploaded)
	}
	v.failpoint(failpoint.CommitPut)
	if local != nil {
		if seg.err != nil {
			rec.drop()
			return fmt.Errorf("volume %s: %w", v.name, seg.err)
		}
		if err := seg.placeCache(); err != nil {
			rec.drop()
			return err
		}
	}
	return v.placeHead(c, rec)
}

// create creates key with body, passing the body's SHA-256 (hashed) on to
// a store that takes it rather than hashing the body again.
func (v *Volume) create(ctx context.Context, key string, body []byte, hashed string) error {
	if hc, ok := v.store.(fence.HashedCreator); ok && hashed != "" {
		return hc.CreateHashed(ctx, key, body, hashed)
	}
	return v.store.Create(ctx, key, body)
}

// placeHead puts the local copy of c's committed record in place and makes
// c the head. Its directory is synced beside the caller (Sync): the remote
// already holds c, and a crash that loses the local copy leaves the volume
// one commit behind it, which the next open adopts from the remote.
func (v *Volume) placeHead(c *Commit, s staged) error {
	if s.err != nil {
		return s.err
	}
	ds, err := s.placeBeside()
	if err != nil {
		return err
	}
	v.syncMu.Lock()
	v.syncing = ds
	v.syncMu.Unlock()
	v.hint(c.LSN)
	v.push(c)
	v.failpoint(failpoint.HeadUpdated)
	return nil
}

// newCommit returns the commit of lsn for a segment of size bytes and
// SHA-256 sum holding pages pages in ranges; its segment key is new.
func (v *Volume) newCommit(lsn uint64, size int64, sum string, ranges []PageRange, pages uint64, meta map[string]string) *Commit {
	now := time.Now().UTC()
	c := &Commit{
		Version: plainVersion, Volume: v.name, LSN: lsn,
		Segment: SegmentRef{
			Key:  fmt.Sprintf("%s/segments/%s-%013d-%s", v.name, lsnName(lsn), now.UnixMilli(), v.writer),
			Size: size, SHA256: sum,
		},
		Ranges: ranges, Pages: pages, Meta: meta, Writer: v.writer, Time: now,
		Prev: v.headHash(), Base: v.baseLSN(),
	}
	// The tail is bounded: a writer whose checkpoints keep failing (or that
	// writes none) stops carrying one, and opens then probe commit by
	// commit from the newest checkpoint, as they would without tails.
	if (c.Base > 0 || len(v.tail) > 0) && len(v.tail) <= maxTail {
		for _, t := range v.tail {
			c.Tail = append(c.Tail, entryOf(t, v.KeepMeta))
		}
	} else {
		c.Base = 0
	}
	return c
}

// writeSegment stores the segment locally and uploads it, both at once:
// neither is visible to readers until the commit object exists.
func (v *Volume) writeSegment(ctx context.Context, key string, seg []byte, sha256hex string) error {
	local := make(chan error, 1)
	go func() {
		err := v.writeFile(v.localSegment(key), seg)
		if err == nil {
			v.failpoint(failpoint.SegmentWritten)
		}
		local <- err
	}()
	upErr := v.create(ctx, key, seg, sha256hex) // the commit already hashed the segment
	if err := <-local; err != nil {
		return fmt.Errorf("volume %s: %w", v.name, err)
	}
	if upErr != nil {
		return fmt.Errorf("upload segment %s: %w", key, upErr)
	}
	v.failpoint(failpoint.SegmentUploaded)
	return nil
}

// lost handles a commit race we lost: adopt the remote state and report the winner.
func (v *Volume) lost(ctx context.Context, lsn uint64) error {
	if err := v.refresh(ctx); err != nil {
		return fmt.Errorf("commit %d of volume %s lost a race; adopting the winner: %w", lsn, v.name, err)
	}
	if v.headLSN() < lsn {
		return fmt.Errorf("commit %d of volume %s: refused as existing, but not found on refresh", lsn, v.name)
	}
	return &ConflictError{LSN: lsn, Winner: v.commitAt(lsn)}
}
