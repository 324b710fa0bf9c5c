package stream

import (
	"github.com/redis/go-redis/v9"
)

// claimScript is XAUTOCLAIM that also records, in the same atomic step, a
// gap for each entry the server reports deleted. Since Redis 7 XAUTOCLAIM
// drops such entries from the PEL as it reports them: a worker killed right
// after the claim would leave no trace of them anywhere. The gap "id-1 id+1"
// makes the catch-up read each one from the archive instead.
//
// KEYS: stream, gap list. ARGV: group, consumer, min-idle ms, start, count.
var claimScript = redis.NewScript(`
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
for _, id in ipairs(res[3] or {}) do
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  local before, after
  if seq == '0' then before = dec(ms) .. '-' .. MAXSEQ else before = ms .. '-' .. dec(seq) end
  if seq == MAXSEQ then after = inc(ms) .. '-0' else after = ms .. '-' .. inc(seq) end
  redis.call('RPUSH', KEYS[2], before .. ' ' .. after .. ' 0')
end
return res
`)
