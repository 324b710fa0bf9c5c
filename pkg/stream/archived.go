package stream

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// ArchiveRecord is what Redis keeps of a stream's archive, the anchor of
// its proof: the archiver writes it before the archive's first commit and
// after each one, so that a remote holding someone else's history (another
// Redis's stream of the same name under a shared prefix, a forged commit)
// or less history than was committed (a rolled-back or lagging bucket)
// cannot pass for this stream's archive. The record only moves forward
// (RecordArchive). pkg/archive refuses to commit, trim or read when the
// remote does not reach it.
type ArchiveRecord struct {
	Identity string // chosen at the first commit (or an adoption); commits above the anchor carry it
	Volume   string // the archive's volume name
	Remote   string // where it was written, without secrets
	LSN      uint64 // the last commit recorded here (0: the first is under way)
	W        string // its watermark
	Hash     string // its chain hash (graft.Commit.Hash); "" in records of older builds
	// AdoptedFrom is the identity the archive had before this Redis
	// adopted it ("" when it never was).
	AdoptedFrom string
	// Recovered counts the archived entries this Redis never held: those
	// of commits another node made (the master before a failover, the
	// other side of a split brain) that the record moved over. Completeness
	// (entries-added = archived + live) holds once they are taken off.
	Recovered int64
	// AddRecovered is what RecordArchive adds to Recovered with the move.
	AddRecovered int64
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
	rec = ArchiveRecord{Identity: m["identity"], Volume: m["volume"], Remote: m["remote"], W: m["w"], Hash: m["hash"], AdoptedFrom: m["adopted_from"]}
	if rec.LSN, err = strconv.ParseUint(m["lsn"], 10, 64); err != nil || rec.Identity == "" {
		return rec, false, fmt.Errorf("archive record %s: identity %q, lsn %q: not a record silt wrote", key, m["identity"], m["lsn"])
	}
	if r := m["recovered"]; r != "" {
		if rec.Recovered, err = strconv.ParseInt(r, 10, 64); err != nil {
			return rec, false, fmt.Errorf("archive record %s: recovered %q: not a number", key, r)
		}
	}
	return rec, true, nil
}

// ErrRecordLost is returned by RecordArchive when Redis no longer holds
// the record under rec's identity: it was flushed, restarted without
// persistence or restored while the archiver ran.
var ErrRecordLost = errors.New("Redis lost the archive's record during the run (restarted without persistence, flushed or restored?)")

// recordScript updates the archive record only while it holds the same
// identity (a write after a flush must not make an emptied Redis look as
// if it had always recorded the archive) and only forward: an LSN below
// the one recorded is refused (a crash between a commit and its record
// leaves the remote ahead of Redis, never behind; two archivers racing
// each record their own commit, the newer stays).
//
// The entries another node archived that this Redis never held are
// counted with the move that takes the record over their commits.
//
// KEYS: record. ARGV: identity, volume, remote, lsn, w, hash, recovered.
var recordScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'identity') ~= ARGV[1] then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'lsn') or '0') > tonumber(ARGV[4]) then return 2 end
redis.call('HSET', KEYS[1], 'volume', ARGV[2], 'remote', ARGV[3], 'lsn', ARGV[4], 'w', ARGV[5], 'hash', ARGV[6])
if tonumber(ARGV[7]) > 0 then redis.call('HINCRBY', KEYS[1], 'recovered', ARGV[7]) end
return 1
`)

// RecordArchive moves this log's archive record forward to rec (the LSN,
// W and hash of a commit read back from the remote). The record must exist
// under rec.Identity (see ClaimArchiveIdentity); else it returns
// ErrRecordLost and writes nothing. A record already above rec.LSN stays
// as it is (newer reports that), and that is no error: a peer recorded a
// later commit of the same chain.
func (l *Log) RecordArchive(ctx context.Context, rec ArchiveRecord) (newer bool, err error) {
	key := l.ks.Archived(l.name, l.deadGroup)
	n, err := recordScript.Run(ctx, l.rdb, []string{key}, rec.Identity, rec.Volume, rec.Remote,
		strconv.FormatUint(rec.LSN, 10), rec.W, rec.Hash, strconv.FormatInt(rec.AddRecovered, 10)).Int()
	if err != nil {
		return false, fmt.Errorf("archive record %s: %w", key, err)
	}
	if n == 0 {
		return false, fmt.Errorf("archive record %s: %w", key, ErrRecordLost)
	}
	return n == 2, nil
}

// adoptScript records an adopted archive under a new identity, only when
// Redis holds no record of the stream's archive (an adoption never
// replaces a record: that would undo the proof).
//
// KEYS: record. ARGV: identity, volume, remote, lsn, w, hash, adopted_from.
var adoptScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'identity', ARGV[1], 'volume', ARGV[2], 'remote', ARGV[3], 'lsn', ARGV[4], 'w', ARGV[5], 'hash', ARGV[6], 'adopted_from', ARGV[7])
return 1
`)

// ErrRecorded is returned by AdoptArchive when Redis holds a record of
// the stream's archive already.
var ErrRecorded = errors.New("Redis holds a record of this stream's archive already")

// AdoptArchive records rec (an archive found on a remote, with a new
// identity) as this stream's, when nothing is recorded yet; else it
// returns ErrRecorded and writes nothing.
func (l *Log) AdoptArchive(ctx context.Context, rec ArchiveRecord) error {
	key := l.ks.Archived(l.name, l.deadGroup)
	n, err := adoptScript.Run(ctx, l.rdb, []string{key}, rec.Identity, rec.Volume, rec.Remote,
		strconv.FormatUint(rec.LSN, 10), rec.W, rec.Hash, rec.AdoptedFrom).Int()
	if err != nil {
		return fmt.Errorf("archive record %s: %w", key, err)
	}
	if n == 0 {
		return fmt.Errorf("archive record %s: %w", key, ErrRecorded)
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
