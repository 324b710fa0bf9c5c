package stream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/brand"
)

// IDField is the entry field that holds the branded id.
const IDField = "id"

// Errors of the Log.
var (
	// ErrWrongKind means an id's kind is not the kind the stream holds.
	ErrWrongKind = errors.New("wrong kind")
	// ErrReservedField means a payload tried to set the "id" field.
	ErrReservedField = errors.New("reserved field")
	// ErrBehind means the stream top stayed ahead of the minter after every retry.
	ErrBehind = errors.New("stream top stays ahead of the minter")
	// ErrOversized means an entry is larger than the limit (MaxEntryBytes).
	ErrOversized = errors.New("entry over the size limit")
)

// EntryBytes is what an entry counts against a size limit: the bytes of its
// field names and values.
func EntryBytes(fields map[string]string) int {
	n := 0
	for k, v := range fields {
		n += len(k) + len(v)
	}
	return n
}

// Client is the part of go-redis package stream calls, and nothing more:
// *redis.Client, *redis.ClusterClient and redis.UniversalClient satisfy it,
// and a test double needs only these. Packages above stream (archive,
// export) call Redis only through stream's types: Log, Consumer and
// PolicyStore.
type Client interface {
	redis.Scripter // the package's Lua scripts
	Watch(ctx context.Context, fn func(*redis.Tx) error, keys ...string) error
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
	TxPipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
	Process(ctx context.Context, cmd redis.Cmder) error // replies read from their bytes (resp.go)
	Do(ctx context.Context, args ...any) *redis.Cmd     // and again through Do after an error reply

	XAdd(ctx context.Context, a *redis.XAddArgs) *redis.StringCmd
	XDel(ctx context.Context, stream string, ids ...string) *redis.IntCmd
	XLen(ctx context.Context, stream string) *redis.IntCmd
	XReadGroup(ctx context.Context, a *redis.XReadGroupArgs) *redis.XStreamSliceCmd
	XPendingExt(ctx context.Context, a *redis.XPendingExtArgs) *redis.XPendingExtCmd
	XAutoClaimWithDeleted(ctx context.Context, a *redis.XAutoClaimArgs) *redis.XAutoClaimWithDeletedCmd
	XGroupCreateMkStream(ctx context.Context, stream, group, start string) *redis.StatusCmd
	XInfoStream(ctx context.Context, key string) *redis.XInfoStreamCmd
	XInfoGroups(ctx context.Context, key string) *redis.XInfoGroupsCmd
	XInfoConsumers(ctx context.Context, key string, group string) *redis.XInfoConsumersCmd
	XTrimMaxLen(ctx context.Context, key string, maxLen int64) *redis.IntCmd
	XTrimMaxLenApprox(ctx context.Context, key string, maxLen, limit int64) *redis.IntCmd
	XTrimMinID(ctx context.Context, key string, minID string) *redis.IntCmd
	XTrimMinIDApprox(ctx context.Context, key string, minID string, limit int64) *redis.IntCmd

	Get(ctx context.Context, key string) *redis.StringCmd
	Type(ctx context.Context, key string) *redis.StatusCmd
	Del(ctx context.Context, keys ...string) *redis.IntCmd
	Set(ctx context.Context, key string, value any, expiration time.Duration) *redis.StatusCmd
	HGet(ctx context.Context, key, field string) *redis.StringCmd
	HSet(ctx context.Context, key string, values ...any) *redis.IntCmd
	HIncrBy(ctx context.Context, key, field string, incr int64) *redis.IntCmd
	HLen(ctx context.Context, key string) *redis.IntCmd
	HGetAll(ctx context.Context, key string) *redis.MapStringStringCmd
	HDel(ctx context.Context, key string, fields ...string) *redis.IntCmd
	HScan(ctx context.Context, key string, cursor uint64, match string, count int64) *redis.ScanCmd
	LIndex(ctx context.Context, key string, index int64) *redis.StringCmd
	LRange(ctx context.Context, key string, start, stop int64) *redis.StringSliceCmd
	LSet(ctx context.Context, key string, index int64, value any) *redis.StatusCmd
	LRem(ctx context.Context, key string, count int64, value any) *redis.IntCmd
}

var (
	_ Client = (*redis.Client)(nil)
	_ Client = (*redis.ClusterClient)(nil)
	_ Client = (redis.UniversalClient)(nil)
)

// Fields is an entry's payload: field names to values, without "id".
type Fields = map[string]string

// The defaults of a Log's knobs.
const (
	DefaultPageSize   = 1000 // entries a read fetches per XRANGE
	DefaultBatchSize  = 500  // entries AppendBatch writes in one atomic step
	DefaultMaxRetries = 8    // re-mints of an append after another writer got ahead
)

// Log appends branded entries to one stream and reads them back.
type Log struct {
	// PageSize is how many entries a read fetches per XRANGE.
	PageSize int64
	// BatchSize is the most entries AppendBatch writes in one atomic step.
	BatchSize int
	// MaxRetries bounds how often an append re-mints after another writer got ahead.
	MaxRetries int
	// MaxEntryBytes, when positive, refuses appends of entries larger than
	// this (EntryBytes) with ErrOversized, before anything is sent.
	MaxEntryBytes int
	// WaitReplicas, when positive, makes every append wait (WAIT) until
	// that many replicas acknowledged its entries, for at most WaitTimeout
	// (0: for ever); short of that the append returns a
	// *NotReplicatedError naming the entries, which may or may not exist.
	WaitReplicas int
	WaitTimeout  time.Duration

	rdb       Client
	ks        Keyspace
	name      string
	deadGroup string // set on a group's dead-letter log
	key       string
	minter    *brand.Minter
	kind      bound     // the stream's recorded kind is the minter's
	replies   replyHint // sizes ReadFlat's reply buffers
}

// NewLog returns the log of stream name in ks, holding ids of kind.
func NewLog(rdb Client, ks Keyspace, name string, kind brand.Kind) (*Log, error) {
	if err := ValidateName("stream", name); err != nil {
		return nil, err
	}
	m, err := brand.NewMinter(kind)
	if err != nil {
		return nil, err
	}
	return newLog(rdb, ks, name, ks.Stream(name), m), nil
}

func newLog(rdb Client, ks Keyspace, name, key string, m *brand.Minter) *Log {
	return &Log{PageSize: DefaultPageSize, BatchSize: DefaultBatchSize, MaxRetries: DefaultMaxRetries, rdb: rdb, ks: ks, name: name, key: key, minter: m}
}

// Name returns the stream's name.
func (l *Log) Name() string { return l.name }

// Keyspace returns the keyspace the stream lives in.
func (l *Log) Keyspace() Keyspace { return l.ks }

// DeadLetters returns the log of group's dead-letter stream, of the same kind.
func (l *Log) DeadLetters(group string) (*Log, error) {
	if err := ValidateName("group", group); err != nil {
		return nil, err
	}
	m, err := brand.NewMinter(l.Kind())
	if err != nil {
		return nil, err
	}
	dead := newLog(l.rdb, l.ks, l.name, l.ks.DeadLetter(l.name, group), m)
	dead.deadGroup = group
	return dead, nil
}

// DeadGroup returns the group whose dead letters this log holds, or "" for
// an ordinary stream. Name then returns the source stream's name.
func (l *Log) DeadGroup() string { return l.deadGroup }

// Key returns the stream's Redis key.
func (l *Log) Key() string { return l.key }

// Kind returns the kind of id the stream holds.
func (l *Log) Kind() brand.Kind { return l.minter.Kind() }

// Minter returns the log's minter, shared by all its appends.
func (l *Log) Minter() *brand.Minter { return l.minter }

// Append mints an id, writes the entry with XADD under that explicit stream id
// and returns the id. When another writer is ahead, it re-mints past the stream
// top and retries, at most MaxRetries times.
func (l *Log) Append(ctx context.Context, fields Fields) (brand.ID, error) {
	if err := l.checkFields(fields); err != nil {
		return brand.ID{}, err
	}
	if l.WaitReplicas > 0 { // the write and its WAIT on one connection
		ids, err := l.AppendBatch(ctx, []Fields{fields})
		if err != nil {
			return brand.ID{}, err
		}
		return ids[0], nil
	}
	if err := l.bindKind(ctx); err != nil {
		return brand.ID{}, err
	}
	for range l.MaxRetries + 1 {
		id := l.minter.Mint()
		err := l.rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.key, ID: id.StreamID.String(), Values: values(id, fields)}).Err()
		if err == nil {
			return id, nil
		}
		if !isBehind(err) {
			return brand.ID{}, fmt.Errorf("xadd %s: %w", l.key, oomNamed(err))
		}
		if err := l.catchUp(ctx); err != nil {
			return brand.ID{}, err
		}
	}
	return brand.ID{}, fmt.Errorf("append to %s: %w after %d retries", l.key, ErrBehind, l.MaxRetries)
}

// AppendID writes one entry under a caller-minted id. An id of another kind is
// refused before any command is sent. It does not retry: a stream top at or
// above id is returned as an error.
func (l *Log) AppendID(ctx context.Context, id brand.ID, fields Fields) error {
	if id.Kind != l.Kind() {
		return fmt.Errorf("append %s to %s: kind %s, stream holds %s: %w", id, l.key, id.Kind, l.Kind(), ErrWrongKind)
	}
	if err := l.checkFields(fields); err != nil {
		return err
	}
	if err := l.bindKind(ctx); err != nil {
		return err
	}
	err := l.rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.key, ID: id.StreamID.String(), Values: values(id, fields)}).Err()
	if err != nil {
		return fmt.Errorf("xadd %s %s: %w", l.key, id, oomNamed(err))
	}
	return nil
}

// Check tells whether Append would accept fields: no "id" field
// (ErrReservedField) and within MaxEntryBytes (ErrOversized).
func (l *Log) Check(fields Fields) error { return l.checkFields(fields) }

func (l *Log) checkFields(fields Fields) error {
	if _, ok := fields[IDField]; ok {
		return fmt.Errorf("payload sets field %q, which holds the branded id: %w", IDField, ErrReservedField)
	}
	if n := EntryBytes(fields); l.MaxEntryBytes > 0 && n > l.MaxEntryBytes {
		return fmt.Errorf("entry of %d bytes in %d fields, over the limit of %d: %w", n, len(fields), l.MaxEntryBytes, ErrOversized)
	}
	return nil
}

// values lays out an entry as the id field first, then the payload.
func values(id brand.ID, fields Fields) []string {
	out := make([]string, 0, 2+2*len(fields))
	out = append(out, IDField, id.String())
	for k, v := range fields {
		out = append(out, k, v)
	}
	return out
}

// isBehind reports whether XADD refused an id at or below the stream top.
func isBehind(err error) bool {
	return err != nil && strings.Contains(err.Error(), "equal or smaller than the target stream top")
}

// catchUp advances the minter past the stream top after XADD refused an id.
func (l *Log) catchUp(ctx context.Context) error { return l.catchUpWith(ctx, l.rdb) }

// ReplayCheckpoint returns the last stream id a named replay of the stream
// handled (ok false when it never handled one).
func (l *Log) ReplayCheckpoint(ctx context.Context, name string) (sid brand.StreamID, ok bool, err error) {
	if err := ValidateName("replay", name); err != nil {
		return sid, false, err
	}
	key := l.ks.Replay(l.name, name)
	last, err := l.rdb.Get(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return sid, false, nil
	case err != nil:
		return sid, false, fmt.Errorf("replay checkpoint %s: %w", key, err)
	}
	if sid, err = brand.ParseStreamID(last); err != nil {
		return sid, false, fmt.Errorf("replay checkpoint %s: %w", key, err)
	}
	return sid, true, nil
}

// SetReplayCheckpoint records sid as the last stream id a named replay of
// the stream handled.
func (l *Log) SetReplayCheckpoint(ctx context.Context, name string, sid brand.StreamID) error {
	if err := ValidateName("replay", name); err != nil {
		return err
	}
	key := l.ks.Replay(l.name, name)
	if err := l.rdb.Set(ctx, key, sid.String(), 0).Err(); err != nil {
		return fmt.Errorf("replay checkpoint %s: %w", key, err)
	}
	return nil
}

// ForgetReplay removes a named replay's checkpoint: its next run starts at
// the beginning of its range.
func (l *Log) ForgetReplay(ctx context.Context, name string) error {
	if err := ValidateName("replay", name); err != nil {
		return err
	}
	key := l.ks.Replay(l.name, name)
	if err := l.rdb.Del(ctx, key).Err(); err != nil {
		return fmt.Errorf("forget replay checkpoint %s: %w", key, err)
	}
	return nil
}
