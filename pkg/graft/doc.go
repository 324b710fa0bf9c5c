// Package graft is silt's page store: a volume of pages addressed by uint64
// page numbers, versioned by commits (LSN 1, 2, ...), stored as checksummed
// segment files in a local data directory and replicated behind the
// create-only commit fence of package fence. It knows nothing of Redis.
//
// A commit writes its pages into one segment and creates
// commits/<20-digit LSN> with If-None-Match: *, holding the segment and the
// commit record after it (a packed commit: one PUT). On a store where a
// suffix read costs the whole object (an encrypted one) it uploads the
// segment under a unique key first, then creates the commit object. Only a
// committed segment exists for readers; a writer that loses the race for an
// LSN gets a *ConflictError carrying the winner's commit, and the volume
// adopts it. Remote layout under the store's prefix, per volume:
//
//	<volume>/commits/<20-digit LSN>
//	<volume>/segments/<20-digit LSN>-<13-digit unix ms>-<writer>   (compactions, unpacked commits)
//	<volume>/checkpoints/<20-digit 2^64-1-LSN>
//	<volume>/branches/..., <volume>/index/...
//
// Fixed-width names make listing order LSN order (checkpoints: newest
// first). Every 16 commits a checkpoint indexes the live segments, and every
// commit carries the entries since its base checkpoint, so opening a volume
// of any length reads a checkpoint and one commit, and a handle's memory is
// bounded by the checkpoint interval. Compact merges small segments; Prune
// moves the history's start; GC deletes what no state a reader may hold
// references. See docs/architecture.md, "Deep history".
//
// The code, a concept a file: volume.go (the handle and its options),
// open.go (open, catch up, jump to a checkpoint, refresh), chain.go (the
// commit chain: scan, read, link, plan, the start after a drop, fetch
// ahead), commit.go (both commit paths) and commitformat.go (the commit
// object), segment.go, checkpoint.go and index.go (the checkpoint and the
// index it roots), read.go, compact.go, prune.go, reindex.go, verify.go,
// pull.go, fetch.go (verified fetches, segments checked by ranges), gc.go,
// anchor.go (a commit at an LSN, for the archive's proof), files.go (local
// files) and errors.go. Opening a volume reads open.go, chain.go and
// checkpoint.go only.
package graft
