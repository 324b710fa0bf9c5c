package stream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/brand"
)

// A stream holds ids of one kind, recorded in its queue's kinds hash
// (Keyspace.Kinds) by its first append. Later appends of another kind are
// refused before any entry is sent, and tools that read the stream take the
// kind from the record instead of a flag.

// kindScript returns the kind recorded for a stream. When none is recorded
// it takes the kind of the stream's first entry (a stream appended to
// before kinds were recorded), else ARGV[2]; it records what it found when
// ARGV[3] is "record". It returns false when it knows no kind.
//
// KEYS: kinds hash, stream. ARGV: stream name, kind of a new stream, "record" or "".
var kindScript = redis.NewScript(`
local k = redis.call('HGET', KEYS[1], ARGV[1])
if k then return k end
local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
if first[1] then
  local f = first[1][2]
  for i = 1, #f - 1, 2 do
    if f[i] == 'id' and string.match(f[i + 1], '^%u%u%u_') then k = string.sub(f[i + 1], 1, 3) end
  end
end
if not k and ARGV[2] ~= '' then k = ARGV[2] end
if not k then return false end
if ARGV[3] == 'record' then redis.call('HSET', KEYS[1], ARGV[1], k) end
return k
`)

// StreamKind returns the kind of ids stream name of ks holds: the kind
// recorded at its first append or, for a stream appended to before kinds
// were recorded, the kind of its first entry. ok is false when the stream
// has neither (it is new, or empty and never recorded).
func StreamKind(ctx context.Context, rdb Client, ks Keyspace, name string) (kind brand.Kind, ok bool, err error) {
	if err := ValidateName("stream", name); err != nil {
		return "", false, err
	}
	return runKindScript(ctx, rdb, ks, name, "", "")
}

func runKindScript(ctx context.Context, rdb Client, ks Keyspace, name string, fallback brand.Kind, record string) (brand.Kind, bool, error) {
	s, err := kindScript.Run(ctx, rdb, []string{ks.Kinds(), ks.Stream(name)}, name, string(fallback), record).Text()
	if isNil(err) {
		return "", false, nil
	}
	if err != nil && strings.Contains(err.Error(), "WRONGTYPE") {
		key := ks.Stream(name)
		typ, terr := rdb.Type(ctx, key).Result()
		if terr != nil {
			typ = "value of another type"
		}
		return "", false, fmt.Errorf("%s holds a %s, not a stream; nothing was changed: %w", key, typ, ErrNotStream)
	}
	if err != nil {
		return "", false, fmt.Errorf("kind of stream %s: %w", ks.Stream(name), err)
	}
	k, err := brand.ParseKind(s)
	if err != nil {
		return "", false, fmt.Errorf("%s records kind %q for stream %s: %w", ks.Kinds(), s, name, err)
	}
	return k, true, nil
}

// DeclareKind records kind as the kind of ids stream name of ks holds, for
// a stream that has none yet (one other producers wrote with plain XADD,
// whose entries then take their branded ids in that kind). A stream that
// holds another kind (recorded, or the kind of its first entry's id) is
// refused with ErrWrongKind, and nothing changes: a stream's kind never
// changes. It returns the kind now recorded.
func DeclareKind(ctx context.Context, rdb Client, ks Keyspace, name string, kind brand.Kind) (brand.Kind, error) {
	if err := ValidateName("stream", name); err != nil {
		return "", err
	}
	if _, err := brand.ParseKind(string(kind)); err != nil {
		return "", err
	}
	k, _, err := runKindScript(ctx, rdb, ks, name, kind, "record")
	if err != nil {
		return "", err
	}
	if k != kind {
		return k, fmt.Errorf("stream %s holds %s ids, not %s; a stream's kind never changes: %w", ks.Stream(name), k, kind, ErrWrongKind)
	}
	return k, nil
}

// ErrNotStream means a key silt was pointed at holds another type.
var ErrNotStream = errors.New("not a stream")

// bound is set once the log's kind is known to be the stream's.
type bound struct{ ok atomic.Bool }

// bindKind makes sure the stream holds ids of the log's kind before the
// log's first append, recording the kind when the stream has none yet. It
// costs one round trip per Log. A dead-letter log has its stream's kind.
func (l *Log) bindKind(ctx context.Context) error {
	if l.deadGroup != "" || l.kind.ok.Load() {
		return nil
	}
	k, _, err := runKindScript(ctx, l.rdb, l.ks, l.name, l.Kind(), "record")
	if err != nil {
		return err
	}
	if k != l.Kind() {
		return fmt.Errorf("append %s ids to %s: the stream holds %s ids (recorded at its first append): %w", l.Kind(), l.key, k, ErrWrongKind)
	}
	l.kind.ok.Store(true)
	return nil
}
