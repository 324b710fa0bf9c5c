package stream

import (
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// claimScript is XAUTOCLAIM that first settles the group's open windows of
// first starts (resolveWindows below: a claimed entry must not leave the
// consumer an open window names it by) and, with recordGaps "1", also
// records in the same atomic step a gap for each entry the server reports
// deleted. Since Redis 7 XAUTOCLAIM drops such entries from the PEL as it
// reports them: a worker killed right after the claim would leave no trace
// of them anywhere. The gap "id-1 id+1" makes the catch-up read each one
// from the archive instead.
//
// KEYS: stream, gap list, windows, attempts. ARGV: group, consumer,
// min-idle ms, start, count, recordGaps.
var claimScript = redis.NewScript(resolveWindowsLua + `
resolveWindows(KEYS[1], KEYS[3], KEYS[4], ARGV[1], ARGV[2], '')
local MAXSEQ = '18446744073709551615'
local function inc(s)
  local i, tail = #s, ''
  while i > 0 do
    local d = tonumber(string.sub(s, i, i))
    if d < 9 then return string.sub(s, 1, i - 1) .. (d + 1) .. tail end
    tail, i = '0' .. tail, i - 1
  end
  return '1' .. tail
end
local function dec(s)
  local i, tail = #s, ''
  while i > 0 do
    local d = tonumber(string.sub(s, i, i))
    if d > 0 then
      local out = string.sub(s, 1, i - 1) .. (d - 1) .. tail
      out = string.gsub(out, '^0+(%d)', '%1')
      return out
    end
    tail, i = '9' .. tail, i - 1
  end
  return '0'
end
local res = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
if ARGV[6] ~= '1' then return res end
for _, id in ipairs(res[3] or {}) do
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  local before, after
  if seq == '0' then before = dec(ms) .. '-' .. MAXSEQ else before = ms .. '-' .. dec(seq) end
  if seq == MAXSEQ then after = inc(ms) .. '-0' else after = ms .. '-' .. inc(seq) end
  redis.call('RPUSH', KEYS[2], before .. ' ' .. after .. ' 0')
end
return res
`)

// An open window ("next AFTER N", windowValue) is what a consumer records
// in the round trip of a read that has not been served yet: the first N
// entries after AFTER that the read delivers to it (the read asks for at
// most N) were started once. Only that consumer's pending list can say
// which entries those are, so an open window counts for nothing until it
// is resolved into the range of those entries ("lo hi"), which is done
// before anything else may judge them:
//
//   - a claim resolves every open window in its own atomic step
//     (claimScript), before the entries can leave the consumer's list;
//   - a consumer resolves its own open window before it judges its own
//     pending entries (resolveOwnScript, from counts), as a run after a
//     kill does.
//
// Entries with a record of their own are judged by it and left out. An
// open window with nothing delivered yet stays as it is (its read may be
// waiting), except the caller's own (its read is over): it is dropped.
const resolveWindowsLua = `
local function resolveWindows(stream, windows, attempts, group, self, only)
  local w = redis.call('HGETALL', windows)
  for i = 1, #w, 2 do
    local consumer = w[i]
    local after, n = string.match(w[i + 1], '^next (%S+) (%d+)$')
    if after and (only == '' or consumer == only) then
      local lo, hi
      for _, e in ipairs(redis.call('XPENDING', stream, group, '(' .. after, '+', n, consumer)) do
        if redis.call('HEXISTS', attempts, e[1]) == 0 then
          lo = lo or e[1]
          hi = e[1]
        end
      end
      if lo then
        redis.call('HSET', windows, consumer, lo .. ' ' .. hi)
      elseif consumer == self then
        redis.call('HDEL', windows, consumer)
      end
    end
  end
end
`

// resolveOwnScript resolves the caller's own open window (see above) and
// returns its window as it then is (nil: none).
//
// KEYS: stream, windows, attempts. ARGV: group, consumer.
var resolveOwnScript = redis.NewScript(resolveWindowsLua + `
resolveWindows(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[2])
return redis.call('HGET', KEYS[2], ARGV[2])
`)

// windowValue is an open window: the first n entries after stream id
// after that this consumer's next read delivers.
func windowValue(after string, n int) string {
	return "next " + after + " " + strconv.Itoa(n)
}

// isOpenWindow reports whether a window is open (windowValue).
func isOpenWindow(w string) bool { return strings.HasPrefix(w, "next ") }
