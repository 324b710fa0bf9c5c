package stream

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// ArchiveRecord is what Redis keeps of a stream's archive: the archiver
// writes it before the archive's first commit and after each one, so that
// a remote holding someone else's history (another Redis's stream of the
// same name under a shared prefix, a forged commit) cannot pass for this
// stream's archive. pkg/archive refuses to trim when the two disagree.
type ArchiveRecord struct {
	Identity string // chosen at the first commit; every commit carries it
	Volume   string // the archive's volume name
	Remote   string // where it was written, without secrets
	LSN      uint64 // the last commit recorded here (0: the first is under way)
	W        string // its watermark
}

// ArchiveRecord returns what Redis records of this log's archive; ok is
// false when nothing is recorded (never archived, or a Redis restored from
// before its first commit, or flushed).
func (l *Log) ArchiveRecord(ctx context.Context) (rec ArchiveRecord, ok bool, err error) {
	key := l.ks.Archived(l.name, l.deadGroup)
	m, err := l.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return rec, false, fmt.Errorf("archive record %s: %w", key, err)
	}
	if len(m) == 0 {
		return rec, false, nil
	}
	rec = ArchiveRecord{Identity: m["identity"], Volume: m["volume"], Remote: m["remote"], W: m["w"]}
	if rec.LSN, err = strconv.ParseUint(m["lsn"], 10, 64); err != nil || rec.Identity == "" {
		return rec, false, fmt.Errorf("archive record %s: identity %q, lsn %q: not a record silt wrote", key, m["identity"], m["lsn"])
	}
	return rec, true, nil
}

// RecordArchive writes rec as this log's archive record.
func (l *Log) RecordArchive(ctx context.Context, rec ArchiveRecord) error {
	key := l.ks.Archived(l.name, l.deadGroup)
	err := l.rdb.HSet(ctx, key, "identity", rec.Identity, "volume", rec.Volume, "remote", rec.Remote,
		"lsn", strconv.FormatUint(rec.LSN, 10), "w", rec.W).Err()
	if err != nil {
		return fmt.Errorf("archive record %s: %w", key, err)
	}
	return nil
}

// ClaimArchiveIdentity records identity as the archive's, with volume and
// remote, unless an identity is recorded already; it returns the one
// recorded. Archivers that start a stream's archive at the same time thus
// all commit under the first one.
func (l *Log) ClaimArchiveIdentity(ctx context.Context, identity, volume, remote string) (string, error) {
	key := l.ks.Archived(l.name, l.deadGroup)
	var got *redis.StringCmd
	_, err := l.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSetNX(ctx, key, "identity", identity)
		p.HSetNX(ctx, key, "volume", volume)
		p.HSetNX(ctx, key, "remote", remote)
		p.HSetNX(ctx, key, "lsn", "0")
		got = p.HGet(ctx, key, "identity")
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("archive record %s: %w", key, err)
	}
	return got.Val(), nil
}
