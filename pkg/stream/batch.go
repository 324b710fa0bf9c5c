package stream

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/brand"
)

// appendScript adds a chunk of entries atomically. Only the first XADD can be
// refused (the ids rise within the chunk and nothing interleaves inside a
// script), and it is tried with pcall before anything is written, so a chunk is
// either wholly in the stream or not at all.
//
// ARGV: n, then per entry: stream id, field count m, m field/value strings.
var appendScript = redis.NewScript(`
local key = KEYS[1]
local i = 2
local n = tonumber(ARGV[1])
for e = 1, n do
  local sid = ARGV[i]
  local m = tonumber(ARGV[i + 1])
  local args = {}
  for j = 1, m do args[j] = ARGV[i + 1 + j] end
  i = i + 2 + m
  if e == 1 then
    local r = redis.pcall('XADD', key, sid, unpack(args))
    if type(r) == 'table' and r.err then return r end
  else
    redis.call('XADD', key, sid, unpack(args))
  end
end
return n
`)

// Limits of one script call: Lua unpacks at most about 8000 values, and a
// script blocks Redis while it runs, so chunks stay small.
const (
	maxScriptFields = 3000    // larger entries go alone through plain XADD
	maxChunkBytes   = 4 << 20 // payload bytes per script call
)

// AppendBatch appends entries in order and returns their ids. Entries go in
// chunks of at most BatchSize, each written atomically in one round trip. On
// error, the returned ids are those of the entries already in the stream (a
// prefix of batch); none of the rest was written.
func (l *Log) AppendBatch(ctx context.Context, batch []Fields) ([]brand.ID, error) {
	for _, f := range batch {
		if err := checkFields(f); err != nil {
			return nil, err
		}
	}
	ids := make([]brand.ID, 0, len(batch))
	for len(batch) > 0 {
		n := l.chunkLen(batch)
		var err error
		if n == 1 && len(batch[0]) > maxScriptFields {
			var id brand.ID
			id, err = l.Append(ctx, batch[0])
			ids = append(ids, id)
		} else {
			ids, err = l.appendChunk(ctx, batch[:n], ids)
		}
		if err != nil {
			return ids[:len(ids)-n], err
		}
		batch = batch[n:]
	}
	return ids, nil
}

// chunkLen returns how many leading entries of batch go in the next chunk.
func (l *Log) chunkLen(batch []Fields) int {
	if len(batch[0]) > maxScriptFields {
		return 1
	}
	size := 0
	for i, f := range batch {
		if i == l.BatchSize || len(f) > maxScriptFields {
			return i
		}
		for k, v := range f {
			size += len(k) + len(v)
		}
		if size > maxChunkBytes && i > 0 {
			return i
		}
	}
	return len(batch)
}

// appendChunk writes one chunk, re-minting past the stream top when another
// writer is ahead. It appends the chunk's ids to ids, also on error, so the
// caller can cut them off.
func (l *Log) appendChunk(ctx context.Context, chunk []Fields, ids []brand.ID) ([]brand.ID, error) {
	base := len(ids)
	for range l.MaxRetries + 1 {
		ids = ids[:base]
		args := make([]any, 0, 1+len(chunk)*8)
		args = append(args, len(chunk))
		for _, f := range chunk {
			id := l.minter.Mint()
			ids = append(ids, id)
			kv := values(id, f)
			args = append(args, id.StreamID.String(), strconv.Itoa(len(kv)))
			for _, s := range kv {
				args = append(args, s)
			}
		}
		err := appendScript.Run(ctx, l.rdb, []string{l.key}, args...).Err()
		if err == nil {
			return ids, nil
		}
		if !isBehind(err) {
			return ids, fmt.Errorf("append %d entries to %s: %w", len(chunk), l.key, err)
		}
		if err := l.catchUp(ctx); err != nil {
			return ids, err
		}
	}
	return ids, fmt.Errorf("append %d entries to %s: %w after %d retries", len(chunk), l.key, ErrBehind, l.MaxRetries)
}
