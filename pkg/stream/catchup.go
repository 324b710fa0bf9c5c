package stream

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/failpoint"
)

// History is a PayloadSource that can also list what it holds: an archive.
// With one configured, a group whose unread entries were trimmed from the
// live stream catches up from it.
type History interface {
	PayloadSource
	// Archived yields the entries it holds with from <= id <= to, in order;
	// a malformed one comes with a *MalformedError.
	Archived(ctx context.Context, from, to brand.StreamID) iter.Seq2[Entry, error]
}

// gapLua records a gap when the group's last-delivered id is below the
// first live entry (or, on an empty stream, below its last generated id):
// entries in between may have been trimmed before the group read them, so
// they must be read from the archive. On an empty stream it also moves the
// group's last-delivered id to the top, as a read would have. A gap is pushed as
// "last first 0 skipped" on a list, once; skipped estimates how many
// entries it holds (entries-added - the group's entries-read - length; -1
// when Redis cannot tell). It sets the local skipped (0: no new gap).
//
// KEYS: stream, gap list. ARGV: group.
const gapLua = `
local function less(a, b)
  local am, as = string.match(a, '^(%d+)%-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)%-(%d+)$')
  if #am ~= #bm then return #am < #bm end
  if am ~= bm then return am < bm end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end
local skipped = 0
local last, read
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, ld, er
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1]
    elseif g[i] == 'last-delivered-id' then ld = g[i + 1]
    elseif g[i] == 'entries-read' then er = g[i + 1] end
  end
  if name == ARGV[1] then last, read = ld, er end
end
-- A group that has read nothing has read nothing, whatever XINFO says.
if last == '0-0' and type(read) ~= 'number' then read = 0 end
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
local info, bound, empty
if first[1] then
  bound = first[1][1]
elseif last then
  -- An empty stream: every entry up to its last generated id is gone, and
  -- no read will move the group past them; the gap ends just above it.
  info = redis.call('XINFO', 'STREAM', KEYS[1])
  local lg
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then lg = info[i + 1] end
  end
  local ms, seq = string.match(lg or '', '^(%d+)%-(%d+)$')
  if ms and less(last, lg) then bound, empty = ms .. '-' .. string.format('%d', tonumber(seq) + 1), lg end
end
if last and bound and less(last, bound) then
  info = info or redis.call('XINFO', 'STREAM', KEYS[1])
  local added, len
  for i = 1, #info, 2 do
    if info[i] == 'entries-added' then added = info[i + 1]
    elseif info[i] == 'length' then len = info[i + 1] end
  end
  -- Every live entry is above last; the group's counter says how many above
  -- last were ever added. When Redis cannot tell, any removal may be a gap.
  local gone = -1
  if type(read) == 'number' then gone = added - read - len
  elseif added == len then gone = 0 end
  if gone < -1 then gone = -1 end
  local tail = redis.call('LRANGE', KEYS[2], -1, -1)
  if gone ~= 0 and (tail[1] == nil or string.match(tail[1], '^%S+ %S+') ~= last .. ' ' .. bound) then
    skipped = gone
    redis.call('RPUSH', KEYS[2], last .. ' ' .. bound .. ' 0 ' .. skipped)
    if empty then -- the group has now seen up to the top, through the gap
      redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], empty, 'ENTRIESREAD', added)
    end
  end
end
`

// gapReadScript reads new entries for a consumer after gapLua.
//
// KEYS: stream, gap list. ARGV: group, consumer, count.
var gapReadScript = redis.NewScript(gapLua + `
return redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[1], '>')
`)

// gapCheckScript runs gapLua alone and returns skipped: a run without an
// archive records the gap (a later run with one catches it up) and says
// what was skipped.
//
// KEYS: stream, gap list. ARGV: group.
var gapCheckScript = redis.NewScript(gapLua + `
return skipped
`)

// leaseScript takes or renews the group's catch-up lease for ARGV[1].
var leaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
`)

// releaseScript drops the lease if ARGV[1] holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// catchUpState is a run's catch-up from the archive. leaseHeld: gaps are
// left to catch up, but another consumer holds the lease. The run waits for
// it rather than exit idle with work left: a live holder finishes the gaps,
// a dead one's lease expires.
type catchUpState struct {
	leaseHeld bool
}

// gap is the head of a group's gap list: entries with last < id < first may
// be in the archive only; attempts counts failed deliveries of the next one;
// skipped is how many entries the gap held when it was found (-1: unknown;
// 0 in records written before it was kept).
type gap struct {
	last, first brand.StreamID
	attempts    int64
	skipped     int64
}

func parseGap(s string) (gap, error) {
	f := strings.Fields(s)
	if len(f) != 3 && len(f) != 4 {
		return gap{}, fmt.Errorf("catch-up checkpoint %q: want 'last first attempts [skipped]'", s)
	}
	var g gap
	var err error
	if g.last, err = brand.ParseStreamID(f[0]); err != nil {
		return g, err
	}
	if g.first, err = brand.ParseStreamID(f[1]); err != nil {
		return g, err
	}
	if g.attempts, err = strconv.ParseInt(f[2], 10, 64); err != nil || len(f) == 3 {
		return g, err
	}
	g.skipped, err = strconv.ParseInt(f[3], 10, 64)
	return g, err
}

func (g gap) String() string {
	return fmt.Sprintf("%s %s %d %d", g.last, g.first, g.attempts, g.skipped)
}

// checkGap records, without an archive to read it from, a gap of entries
// trimmed before the group read them, so that a later run with an archive
// (Consumer.Payloads a History) catches them up; the run counts them and
// says so. With a History the reads record gaps themselves.
func (r *run) checkGap(ctx context.Context) error {
	if r.history != nil {
		return nil
	}
	n, err := r.c.io.checkGap(ctx)
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	count := "an unknown number of"
	r.sum.TrimmedUnreadUnknown = n < 0
	if n > 0 {
		r.sum.TrimmedUnread += n
		count = strconv.FormatInt(n, 10)
	}
	r.c.Logger.Warn(fmt.Sprintf("%s entries were trimmed before group %s read them; recorded as a catch-up gap, a run with an archive catches them up", count, r.c.group))
	return nil
}

// scriptMessages converts an XREADGROUP reply returned by a script.
func scriptMessages(res any) ([]message, error) {
	streams, _ := res.([]any)
	if len(streams) == 0 {
		return nil, nil
	}
	s, ok := streams[0].([]any)
	if !ok || len(s) != 2 {
		return nil, errors.New("unexpected XREADGROUP reply from script")
	}
	return entryMessages(s[1])
}

// catchUp hands the entries of recorded gaps, read from the archive, to the
// handler, one consumer of the group at a time under a lease, moving the
// checkpoint (the head of the gap list) past each batch. A failing entry is
// retried by later runs and dead-lettered after MaxAttempts.
func (r *run) catchUp(ctx context.Context) error {
	h, ok := r.history, r.history != nil
	if !ok {
		return nil
	}
	defer r.c.io.releaseLease(context.WithoutCancel(ctx))
	r.gaps.leaseHeld = false
	for !r.stopped(ctx) {
		head, ok, err := r.c.io.gapHead(ctx)
		if err != nil || !ok {
			return err
		}
		got, err := r.c.io.takeLease(ctx, r.c.LeaseTTL)
		if err != nil {
			return err
		}
		if !got { // another consumer of the group is catching up, or died doing so
			if !r.gaps.leaseHeld && !r.sum.LeaseWait {
				r.c.Logger.Info("catch-up lease held by another consumer; waiting for it to finish or expire", "group", r.c.group)
			}
			r.gaps.leaseHeld, r.sum.LeaseWait = true, true
			return nil
		}
		g, err := parseGap(head)
		if err != nil {
			return fmt.Errorf("catch-up gap of %s: %w", r.c.group, err)
		}
		more, err := r.catchUpBatch(ctx, h, head, g)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// catchUpBatch handles the next batch of one gap and moves its checkpoint;
// it returns false when the run should stop catching up.
func (r *run) catchUpBatch(ctx context.Context, h History, head string, g gap) (bool, error) {
	from, _ := g.last.Next()
	to, ok := g.first.Prev()
	var jobs []*job
	if ok && from.Compare(to) <= 0 {
		for e, err := range h.Archived(ctx, from, to) {
			if err != nil && !errors.Is(err, ErrMalformed) {
				return false, fmt.Errorf("catch up from the archive: %w", err)
			}
			j := &job{d: Delivery{ID: e.ID, StreamID: e.StreamID, Fields: e.Fields, Deliveries: g.attempts + 1,
				Group: r.c.group, Consumer: r.c.name, Recovered: true}, sid: e.StreamID.String(), rawID: e.ID.String(), err: err}
			if jobs = append(jobs, j); int64(len(jobs)) >= r.count() {
				break
			}
		}
	}
	if len(jobs) == 0 { // nothing (more) in this gap: drop it
		return true, r.c.io.dropGap(ctx, head)
	}
	r.sum.CatchUp += int64(len(jobs))
	if err := r.priorStarts(ctx, jobs); err != nil {
		return false, err
	}
	stop := r.keepLease(ctx)
	err := r.process(ctx, jobs, time.Now())
	stop()
	if err != nil {
		return false, err
	}
	next := g
	for _, j := range jobs {
		if j.fate != fateAck && j.fate != fateDead {
			next.attempts++ // the first unfinished entry: retried by a later run
			break
		}
		next.last, next.attempts = j.d.StreamID, 0
	}
	wctx, cancel := r.writeCtx(ctx)
	defer cancel()
	if err := r.c.io.setGapHead(wctx, next.String()); err != nil {
		return false, err
	}
	r.c.failpoint(failpoint.AfterCheckpoint)
	return next.attempts == 0, nil
}

// keepLease renews this consumer's catch-up lease every LeaseTTL/4 while a
// batch runs: handlers slower than LeaseTTL in total must not let a peer
// take the lease and catch up the same entries. stop ends it.
func (r *run) keepLease(ctx context.Context) (stop func()) {
	every := max(r.c.LeaseTTL/4, 10*time.Millisecond)
	return repeat(ctx, every, every, func(ctx context.Context) {
		if _, err := r.c.io.takeLease(ctx, r.c.LeaseTTL); err != nil && ctx.Err() == nil {
			r.c.Logger.Warn("could not renew the catch-up lease", "group", r.c.group, "error", err.Error())
		}
	})
}
