package stream

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/brand"
)

// A producer that did not get its receipt (a timeout, a failover, a WAIT
// short of its replicas) retries the append under the same branded id: the
// entry is written once, whatever the first try did.

// ErrIDTaken is returned by AppendIdempotent when the stream holds the id
// with other fields: another entry, not a retry of this one.
var ErrIDTaken = errors.New("the stream holds this id with other fields")

// ErrIDBelowTop is returned by AppendIdempotent when the id is at or below
// the stream's last generated id and no live entry has it: the entry was
// trimmed (archived, or removed), or never written while later entries
// were; Redis cannot take it again.
var ErrIDBelowTop = errors.New("the id is at or below the stream's top, and no live entry holds it")

// idempotentScript writes the entry under its id unless the stream holds
// that id: with the same fields it answers 0 (a retry that found its first
// try), with others -1; written, 1.
//
// KEYS: stream. ARGV: stream id, then the fields (name, value, ...) with the id field.
var idempotentScript = redis.NewScript(`
local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #e == 1 then
  local f = e[1][2]
  if #f ~= #ARGV - 1 then return -1 end
  local want = {}
  for i = 2, #ARGV, 2 do want[ARGV[i]] = ARGV[i + 1] end
  for i = 1, #f, 2 do
    if want[f[i]] ~= f[i + 1] then return -1 end
  end
  return 0
end
redis.call('XADD', KEYS[1], ARGV[1], unpack(ARGV, 2))
return 1
`)

// AppendIdempotent writes one entry under id, once: an entry the stream
// holds under id with the same fields is this append's first try (created
// false, no error); with other fields it returns ErrIDTaken. Under
// WaitReplicas, the replicas are waited for in both cases (a first try's
// entry may not have reached them).
func (l *Log) AppendIdempotent(ctx context.Context, id brand.ID, fields Fields) (created bool, err error) {
	if id.Kind != l.Kind() {
		return false, fmt.Errorf("append %s to %s: kind %s, stream holds %s: %w", id, l.key, id.Kind, l.Kind(), ErrWrongKind)
	}
	if err := l.checkFields(fields); err != nil {
		return false, err
	}
	if err := l.bindKind(ctx); err != nil {
		return false, err
	}
	args := []any{id.StreamID.String()}
	for _, v := range values(id, fields) {
		args = append(args, v)
	}
	var (
		run  *redis.Cmd
		wait *redis.Cmd
	)
	// The script and its WAIT on one connection (a pipeline): WAIT counts
	// the replicas holding this connection's writes.
	_, perr := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		run = idempotentScript.Eval(ctx, p, []string{l.key}, args...)
		if l.WaitReplicas > 0 {
			wait = p.Do(ctx, "WAIT", l.WaitReplicas, l.WaitTimeout.Milliseconds())
		}
		return nil
	})
	n, err := run.Int()
	switch {
	case err != nil && strings.Contains(err.Error(), "equal or smaller"):
		return false, fmt.Errorf("append %s to %s: %w", id, l.key, ErrIDBelowTop)
	case err != nil:
		return false, fmt.Errorf("append %s to %s: %w", id, l.key, oomNamed(err))
	case n < 0:
		return false, fmt.Errorf("append %s to %s: %w", id, l.key, ErrIDTaken)
	case perr != nil && wait == nil:
		return false, fmt.Errorf("append %s to %s: %w", id, l.key, perr)
	}
	if wait != nil {
		acked, werr := wait.Int64()
		if werr != nil {
			return n == 1, &NotReplicatedError{IDs: []brand.ID{id}, Want: l.WaitReplicas, Err: werr}
		}
		if acked < int64(l.WaitReplicas) {
			return n == 1, &NotReplicatedError{IDs: []brand.ID{id}, Want: l.WaitReplicas, Acked: int(acked), Timeout: l.WaitTimeout}
		}
	}
	return n == 1, nil
}
