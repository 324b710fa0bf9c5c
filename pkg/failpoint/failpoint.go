// Package failpoint names every point at which silt's crash tests stop a
// process: the steps of a consumer's batch, of an archive slice and of a
// volume's commit, checkpoint and compaction. A Func set on a
// stream.Consumer, an archive.Archive or a graft.Volume is called at each
// point the work passes; the tests kill the process there and check that
// nothing is lost.
//
// Release binaries set no Func: the CLIs read SILT_FAILPOINT only when built
// with the silt_failpoints tag.
package failpoint

import (
	"fmt"
	"slices"
	"strings"
)

// Name is a failpoint.
type Name string

// Func is called at each failpoint the work passes.
type Func func(Name)

// The points of a stream.Consumer's batch.
const (
	AfterRead       Name = "after-read"       // a batch read, nothing handled yet
	MidBatch        Name = "mid-batch"        // one handler of a batch returned (and its dedupe marker written)
	AfterHandle     Name = "after-handle"     // a batch handled, not yet acked
	AfterAck        Name = "after-ack"        // a batch acked
	AfterCheckpoint Name = "after-checkpoint" // a catch-up batch settled and the gap's new head recorded
)

// The points of an archive.Archive's slice.
const (
	AfterFold   Name = "after-fold"   // a slice folded into local page files
	AfterCommit Name = "after-commit" // the slice's commit created behind the fence
	AfterTrim   Name = "after-trim"   // the stream trimmed below the new watermark
)

// The points of a graft.Volume.
const (
	SegmentWritten      Name = "segment-written"      // a commit's segment written locally
	SegmentUploaded     Name = "segment-uploaded"     // the segment created on the remote
	CommitPut           Name = "commit-put"           // the commit object created (the fence passed)
	HeadUpdated         Name = "head-updated"         // the local head moved to the commit
	CheckpointLeaves    Name = "checkpoint-leaves"    // a checkpoint's leaves and branches created
	CheckpointPut       Name = "checkpoint-put"       // the checkpoint's root created
	CompactionCommitted Name = "compaction-committed" // a compaction's commit created
	PruneCommitted      Name = "prune-committed"      // a history prune's commit created
)

// All lists every failpoint, in the order above.
var All = []Name{
	AfterRead, MidBatch, AfterHandle, AfterAck, AfterCheckpoint,
	AfterFold, AfterCommit, AfterTrim,
	SegmentWritten, SegmentUploaded, CommitPut, HeadUpdated, CheckpointLeaves, CheckpointPut, CompactionCommitted, PruneCommitted,
}

// Parse returns the failpoint of s, or an error listing the valid names.
func Parse(s string) (Name, error) {
	if slices.Contains(All, Name(s)) {
		return Name(s), nil
	}
	names := make([]string, len(All))
	for i, n := range All {
		names[i] = string(n)
	}
	return "", fmt.Errorf("unknown failpoint %q (one of %s)", s, strings.Join(names, ", "))
}
