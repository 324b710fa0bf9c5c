package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/brand"
)

// groupIO is everything a consumer run says to Redis about its group: the
// loop (loop.go, handle.go, catchup.go, inflight.go) decides, groupIO reads
// and writes, and nothing else in the loop touches go-redis. Each method is
// one round trip; errors name the key. redisGroup is the implementation;
// the loop's decisions are also tested against a fake (groupio_fake_test.go).
type groupIO interface {
	groupReader
	groupWriter
	catchUpIO
}

// groupReader reads entries and what is known of them.
type groupReader interface {
	// readPending re-reads up to count of this consumer's pending entries
	// after the stream id after ("0": from the start).
	readPending(ctx context.Context, after string, count int64) ([]message, error)
	// readNew reads up to count never-delivered entries, blocking up to
	// block (negative: not at all), with acks sent first in the same round
	// trip; ackErr is theirs.
	readNew(ctx context.Context, block time.Duration, count int64, acks ackSet) (msgs []message, ackErr, err error)
	// readNewStarting is readNew with this consumer's window of first
	// starts set to window (windowValue) in the same round trip, after the
	// acks and before the read; windowErr is the window's: nil when it
	// was recorded before the read was served.
	readNewStarting(ctx context.Context, block time.Duration, count int64, acks ackSet, window string) (msgs []message, ackErr, windowErr, err error)
	// readNewRecordingGaps is readNew without blocking, after recording a
	// catch-up gap when entries above the group's last-delivered id were
	// trimmed unread (gapLua).
	readNewRecordingGaps(ctx context.Context, count int64) ([]message, error)
	// autoclaim moves entries idle longer than minIdle to this consumer
	// (XAUTOCLAIM from cursor). With recordGaps the entries the server
	// reports deleted are recorded as catch-up gaps in the same step
	// (claimScript) and only counted; without, their ids are returned.
	autoclaim(ctx context.Context, minIdle time.Duration, cursor string, count int64, recordGaps bool) (claimed, error)
	// counts returns, for the ids among msgs still pending for this
	// consumer, the server's delivery count, and for every id the handler
	// starts recorded (0 when none).
	counts(ctx context.Context, ids []string, pendingOnly bool) (deliveries, starts map[string]int64, err error)
	// marked reports which of the branded ids the group handled within
	// the dedupe TTL.
	marked(ctx context.Context, ids []string) ([]bool, error)
}

// groupWriter records what the loop decided.
type groupWriter interface {
	// recordWindow records that every entry from stream id lo to hi that is
	// still pending had its first start (one field per consumer, O(1)).
	recordWindow(ctx context.Context, lo, hi string) error
	// sendWindow is recordWindow without waiting for the reply: it returns
	// once the record is written to the connection (Redis gets it even if
	// the process dies next); reply reads the outcome, then cancels ctx.
	// ok is false when the client cannot say when a record is written
	// (use recordWindow).
	sendWindow(ctx context.Context, cancel func(), lo, hi string) (reply func() error, ok bool)
	// release frees what sendWindow holds, at the end of a run.
	release()
	// dropWindow removes this consumer's window.
	dropWindow(ctx context.Context) error
	// setStarts sets the start records of ids (0: removed).
	setStarts(ctx context.Context, starts map[string]int64) error
	// ack acks the ids of a and removes the start records of a.records, in
	// one round trip.
	ack(ctx context.Context, a ackSet) error
	// ackOwned is ack fenced by ownership, for a batch that may have lost
	// its lease: it acks only the ids still pending to this consumer (one
	// script: check the owner, then XACK) and returns the others, which a
	// peer reclaimed.
	ackOwned(ctx context.Context, a ackSet) (lost []string, err error)
	// deadLetter appends rec to the group's dead-letter stream and acks id
	// (its start record removed) in one MULTI.
	deadLetter(ctx context.Context, rec Fields, id string) error
	// mark writes the dedupe marker of a branded id for ttl.
	mark(ctx context.Context, id string, ttl time.Duration) error
	// renew resets the idle time of the ids still pending for this consumer
	// and still in the stream (renewScript); it returns how many.
	renew(ctx context.Context, ids []string) (int64, error)
	// ensureGroup creates the group at the stream's start if it is missing.
	ensureGroup(ctx context.Context) error
	// forgetIdle removes the group's other consumers idle longer than
	// olderThan with nothing pending, and their windows of first starts
	// (which count nothing without a pending entry), and returns their
	// names.
	forgetIdle(ctx context.Context, olderThan time.Duration) ([]string, error)
}

// catchUpIO keeps a group's catch-up gaps and lease.
type catchUpIO interface {
	// checkGap records a gap of entries trimmed before the group read them
	// and returns how many it holds (0: none new; -1: unknown).
	checkGap(ctx context.Context) (int64, error)
	// gapHead returns the first recorded gap; ok is false when none is left.
	gapHead(ctx context.Context) (head string, ok bool, err error)
	// setGapHead replaces the first gap (the catch-up checkpoint).
	setGapHead(ctx context.Context, head string) error
	// dropGap removes one gap.
	dropGap(ctx context.Context, gap string) error
	// takeLease takes or renews the catch-up lease for ttl; false when
	// another consumer holds it.
	takeLease(ctx context.Context, ttl time.Duration) (bool, error)
	// releaseLease drops the lease if this consumer holds it.
	releaseLease(ctx context.Context)
}

// ackSet is acks to send: the ids, and those of them whose start record of
// their own must go too (most entries have none: their first start was
// recorded in a window).
// gone are those of the ids no longer in the PEL when read (trimmed while
// pending, dropped by XAUTOCLAIM): a fenced ack does not ask who owns them.
type ackSet struct{ ids, records, gone []string }

func (a *ackSet) add(j *job) {
	a.ids = append(a.ids, j.sid)
	if j.prior > 0 || (j.recorded && !j.windowed) {
		a.records = append(a.records, j.sid)
	}
	if !j.inPEL {
		a.gone = append(a.gone, j.sid)
	}
}

// addAll adds b's ids; an empty set takes b's slices as they are.
func (a *ackSet) addAll(b ackSet) {
	if len(a.ids) == 0 && len(a.records) == 0 && len(a.gone) == 0 {
		*a = b
		return
	}
	a.ids, a.records, a.gone = append(a.ids, b.ids...), append(a.records, b.records...), append(a.gone, b.gone...)
}

// claimed is one XAUTOCLAIM step.
type claimed struct {
	msgs     []message
	next     string   // the cursor of the next step ("0-0": the sweep is done)
	deleted  []string // ids the server reported deleted (without recordGaps)
	recorded int      // deleted ids recorded as gaps (with recordGaps)
}

// redisGroup is groupIO on Redis: one consumer of one group of one stream.
type redisGroup struct {
	rdb               Client
	ks                Keyspace
	stream, key       string // the stream's name and key
	group, consumer   string
	attempts, windows string
	gaps, leaseKey    string
	dead              *Log
	readTimeout       time.Duration // the client's, as go-redis applies it (0: unknown)
	replies           replyHint     // sizes the reads' reply buffers

	senderMu sync.Mutex
	sender   *startSender // made by the first sendWindow of a run, closed by release
	noSender bool         // the client cannot make one
	own      ownReads     // reads on a connection of the run's own, closed by release
}

var _ groupIO = (*redisGroup)(nil)

func newRedisGroup(l *Log, dead *Log, group, consumer string) *redisGroup {
	return &redisGroup{rdb: l.rdb, ks: l.ks, stream: l.name, key: l.key, group: group, consumer: consumer,
		attempts: l.ks.Attempts(l.name, group), windows: l.ks.StartWindows(l.name, group), gaps: l.ks.CatchUp(l.name, group), leaseKey: l.ks.Lease(l.name, group), dead: dead,
		readTimeout: readTimeoutOf(l.rdb)}
}

// release closes the run's connections of its own: its reads' and its
// start sender's.
func (g *redisGroup) release() {
	g.own.close()
	g.senderMu.Lock()
	defer g.senderMu.Unlock()
	if g.sender != nil {
		g.sender.close()
		g.sender = nil
	}
}

func (g *redisGroup) readPending(ctx context.Context, after string, count int64) ([]message, error) {
	msgs, _, _, err, ok := g.readOwn(ctx, after, -1, count, ackSet{}, "")
	if !ok {
		args := xreadgroup(g.group, g.consumer, g.key, after, count, -1)
		msgs, err = g.readRaw(ctx, sendRaw(ctx, g.rdb, g.replies.sizeLikeLast(count), args...), args)
	}
	if err != nil {
		return nil, fmt.Errorf("drain pending of %s in %s %s: %w", g.consumer, g.key, g.group, err)
	}
	return msgs, nil
}

// readRaw reads the messages of an XREADGROUP sent as rr (args): from
// the reply's bytes (resp.go), or, after an error reply or a failure on
// the network, from the same read sent again through Do. An error reply
// delivered nothing; a read whose reply was lost may have, and those
// entries wait in this consumer's pending list, as after a read go-redis
// sent again itself.
func (g *redisGroup) readRaw(ctx context.Context, rr *rawRead, args []any) ([]message, error) {
	if r, ok := rr.reply(); ok {
		msgs, err := r.messages()
		g.replies.learn(len(r.s), len(msgs))
		return msgs, err
	}
	return readReply(g.rdb.Do(ctx, args...))
}

// isReply says err is an error reply from the server, not a failure to
// get one.
func isReply(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}

// readCmds is what readNew queues a read on: the client, or a pipeline.
type readCmds interface {
	processor
	XReadGroup(ctx context.Context, a *redis.XReadGroupArgs) *redis.XStreamSliceCmd
}

// readNew reads from the reply's bytes (resp.go), unless the read blocks
// for longer than the client's read timeout leaves room for: go-redis's
// own XREADGROUP gives a blocking read the time it waits.
func (g *redisGroup) readNew(ctx context.Context, block time.Duration, count int64, acks ackSet) (msgs []message, ackErr, err error) {
	msgs, ackErr, _, err = g.readNewStarting(ctx, block, count, acks, "")
	return msgs, ackErr, err
}

func (g *redisGroup) readNewStarting(ctx context.Context, block time.Duration, count int64, acks ackSet, window string) (msgs []message, ackErr, windowErr, err error) {
	if msgs, ackErr, windowErr, err, ok := g.readOwn(ctx, ">", block, count, acks, window); ok {
		if err != nil && !isNil(err) {
			return nil, nil, windowErr, fmt.Errorf("read new from %s %s: %w", g.key, g.group, err)
		}
		return msgs, ackErr, windowErr, nil
	}
	var read func() ([]message, error)
	queue := func(c readCmds, raw bool) {
		if raw && (block < 0 || block+time.Second <= g.readTimeout) {
			args := xreadgroup(g.group, g.consumer, g.key, ">", count, block)
			rr := sendRaw(ctx, c, g.replies.sizeLikeLast(count), args...)
			read = func() ([]message, error) { return g.readRaw(ctx, rr, args) }
			return
		}
		cmd := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g.group, Consumer: g.consumer, Streams: []string{g.key, ">"}, Count: count, Block: block})
		read = func() ([]message, error) {
			res, err := cmd.Result()
			if err != nil || len(res) == 0 {
				return nil, err
			}
			return fromXMessages(res[0].Messages), nil
		}
	}
	if window != "" && block >= 0 && block+time.Second > g.readTimeout {
		// A pipeline gives a blocking read no more than the read timeout.
		window, windowErr = "", errWindowNotSent
	}
	if len(acks.ids) > 0 || window != "" {
		var ack, win *redis.IntCmd
		pipe := func(raw bool) {
			g.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				if len(acks.ids) > 0 {
					ack = g.queueAcks(ctx, p, acks)
				}
				if window != "" {
					win = p.HSet(ctx, g.windows, g.consumer, window)
				}
				queue(p, raw)
				return nil
			})
		}
		pipe(true)
		if first := cmp.Or(ack, win); first.Err() != nil && !isReply(first.Err()) {
			// Failed on the network: go-redis retries no pipeline holding
			// a raw read, so the acks and the read go again as go-redis
			// would have sent them, the read decoded.
			pipe(false)
		}
		if win != nil {
			if windowErr = win.Err(); windowErr != nil {
				windowErr = g.windowError(window, windowErr)
			}
		}
		if ack != nil {
			if ackErr = ack.Err(); ackErr != nil {
				return nil, fmt.Errorf("ack %d entries in %s %s: %w", len(acks.ids), g.key, g.group, ackErr), windowErr, nil
			}
		}
	} else {
		queue(g.rdb, true)
	}
	msgs, err = read()
	if err != nil && !isNil(err) {
		return nil, nil, windowErr, fmt.Errorf("read new from %s %s: %w", g.key, g.group, err)
	}
	return msgs, nil, windowErr, nil
}

// errWindowNotSent: the window could not go with the read.
var errWindowNotSent = errors.New("a window of first starts cannot go with a read that blocks this long through go-redis")

// windowError names the window a refused record of it was.
func (g *redisGroup) windowError(window string, err error) error {
	return fmt.Errorf("record first handler starts (%s) in %s: %w", window, g.windows, err)
}

func (g *redisGroup) readNewRecordingGaps(ctx context.Context, count int64) ([]message, error) {
	res, err := gapReadScript.Run(ctx, g.rdb, []string{g.key, g.gaps}, g.group, g.consumer, count).Result()
	if err != nil && !isNil(err) {
		return nil, fmt.Errorf("read new from %s %s: %w", g.key, g.group, err)
	}
	return scriptMessages(res)
}

func (g *redisGroup) autoclaim(ctx context.Context, minIdle time.Duration, cursor string, count int64, recordGaps bool) (claimed, error) {
	c, err := g.claim(ctx, minIdle, cursor, count, recordGaps)
	if err != nil {
		return c, fmt.Errorf("xautoclaim %s %s: %w", g.key, g.group, err)
	}
	return c, nil
}

// claim runs claimScript.
func (g *redisGroup) claim(ctx context.Context, minIdle time.Duration, cursor string, count int64, recordGaps bool) (claimed, error) {
	var c claimed
	flag := "0"
	if recordGaps {
		flag = "1"
	}
	res, err := claimScript.Run(ctx, g.rdb, []string{g.key, g.gaps, g.windows, g.attempts},
		g.group, g.consumer, minIdle.Milliseconds(), cursor, count, flag).Slice()
	if err != nil {
		return c, err
	}
	if len(res) < 2 {
		return c, errors.New("unexpected XAUTOCLAIM reply from script")
	}
	c.next, _ = res[0].(string)
	if c.msgs, err = entryMessages(res[1]); err != nil {
		return c, err
	}
	if len(res) > 2 {
		d, _ := res[2].([]any)
		if recordGaps {
			c.recorded = len(d)
		} else {
			for _, id := range d {
				s, _ := id.(string)
				c.deleted = append(c.deleted, s)
			}
		}
	}
	return c, nil
}

func (g *redisGroup) counts(ctx context.Context, ids []string, pendingOnly bool) (deliveries, starts map[string]int64, err error) {
	deliveries, starts = make(map[string]int64, len(ids)), make(map[string]int64, len(ids))
	if len(ids) == 0 {
		return deliveries, starts, nil
	}
	var pending *redis.XPendingExtCmd
	var recorded *redis.SliceCmd
	var windows *redis.MapStringStringCmd
	g.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if pendingOnly {
			pending = p.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: g.key, Group: g.group, Consumer: g.consumer,
				Start: ids[0], End: ids[len(ids)-1], Count: int64(len(ids)) * 4})
		}
		recorded = p.HMGet(ctx, g.attempts, ids...)
		windows = p.HGetAll(ctx, g.windows)
		return nil
	})
	if pendingOnly {
		if err := g.pendingOf(ctx, ids, pending, deliveries); err != nil {
			return nil, nil, err
		}
	}
	vals, err := recorded.Result()
	if err != nil {
		return nil, nil, fmt.Errorf("read handler starts from %s: %w", g.attempts, err)
	}
	wins, err := windows.Result()
	if err != nil {
		return nil, nil, fmt.Errorf("read start windows from %s: %w", g.windows, err)
	}
	if isOpenWindow(wins[g.consumer]) {
		// Left by a read of ours that was served, or not, before the run
		// that sent it ended: resolved before its entries are judged.
		own, err := resolveOwnScript.Run(ctx, g.rdb, []string{g.key, g.windows, g.attempts}, g.group, g.consumer).Text()
		if err != nil && !isNil(err) {
			return nil, nil, fmt.Errorf("resolve the start window of %s in %s: %w", g.consumer, g.windows, err)
		}
		wins[g.consumer] = own
	}
	for i, v := range vals {
		s, _ := v.(string)
		if s == "" {
			if inWindow(wins, ids[i]) {
				starts[ids[i]] = 1
			}
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return nil, nil, fmt.Errorf("%s: field %s holds %q, not a count of starts", g.attempts, ids[i], s)
		}
		starts[ids[i]] = n
	}
	return deliveries, starts, nil
}

// pendingOf fills out with the delivery counts of the ids pending for this
// consumer: from the range's page, then one by one for those the page missed
// (it can, when many others are pending in between).
func (g *redisGroup) pendingOf(ctx context.Context, ids []string, page *redis.XPendingExtCmd, out map[string]int64) error {
	pending, err := page.Result()
	if err != nil {
		return fmt.Errorf("xpending %s %s: %w", g.key, g.group, err)
	}
	for _, p := range pending {
		out[p.ID] = p.RetryCount
	}
	for _, id := range ids {
		if _, ok := out[id]; ok {
			continue
		}
		one, err := g.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: g.key, Group: g.group, Consumer: g.consumer, Start: id, End: id, Count: 1,
		}).Result()
		if err != nil {
			return fmt.Errorf("xpending %s %s %s: %w", g.key, g.group, id, err)
		}
		if len(one) == 1 {
			out[id] = one[0].RetryCount
		}
	}
	return nil
}

func (g *redisGroup) marked(ctx context.Context, ids []string) ([]bool, error) {
	cmds := make([]*redis.IntCmd, len(ids))
	_, err := g.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.Exists(ctx, g.ks.Done(g.stream, g.group, id))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dedupe check in %s: %w", g.key, err)
	}
	out := make([]bool, len(ids))
	for i, c := range cmds {
		out[i] = c.Val() > 0
	}
	return out, nil
}

func (g *redisGroup) recordWindow(ctx context.Context, lo, hi string) error {
	if err := g.rdb.HSet(ctx, g.windows, g.consumer, lo+" "+hi).Err(); err != nil {
		return fmt.Errorf("record first handler starts %s..%s in %s: %w", lo, hi, g.windows, err)
	}
	return nil
}

func (g *redisGroup) dropWindow(ctx context.Context) error {
	if err := g.rdb.HDel(ctx, g.windows, g.consumer).Err(); err != nil {
		return fmt.Errorf("drop start window of %s in %s: %w", g.consumer, g.windows, err)
	}
	return nil
}

func (g *redisGroup) setStarts(ctx context.Context, starts map[string]int64) error {
	_, err := g.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for id, n := range starts {
			if n == 0 {
				p.HDel(ctx, g.attempts, id)
			} else {
				p.HSet(ctx, g.attempts, id, n)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record %d handler starts in %s: %w", len(starts), g.attempts, err)
	}
	return nil
}

// inWindow reports whether stream id lies in one of the windows ("lo hi").
func inWindow(windows map[string]string, id string) bool {
	sid, err := brand.ParseStreamID(id)
	if err != nil {
		return false
	}
	for _, w := range windows {
		lo, hi, _ := strings.Cut(w, " ")
		l, lerr := brand.ParseStreamID(lo)
		h, herr := brand.ParseStreamID(hi)
		if lerr == nil && herr == nil && sid.Compare(l) >= 0 && sid.Compare(h) <= 0 {
			return true
		}
	}
	return false
}

func (g *redisGroup) ack(ctx context.Context, a ackSet) error {
	var ack *redis.IntCmd
	g.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		ack = g.queueAcks(ctx, p, a)
		return nil
	})
	if err := ack.Err(); err != nil {
		return fmt.Errorf("ack %d entries in %s %s: %w", len(a.ids), g.key, g.group, err)
	}
	return nil
}

// ackOwnedScript acks the ids still pending to the consumer and returns
// the others (pending to a peer, or acked by one since); the start records
// listed after the ids go, but those of the ids lost.
//
// KEYS: stream, start records. ARGV: group, consumer, n ids, ids..., records...
var ackOwnedScript = redis.NewScript(`
local n = tonumber(ARGV[3])
local lost, isLost = {}, {}
for i = 4, 3 + n do
  local id = ARGV[i]
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XACK', KEYS[1], ARGV[1], id)
  else
    lost[#lost + 1], isLost[id] = id, true
  end
end
for i = 4 + n, #ARGV do
  if not isLost[ARGV[i]] then redis.call('HDEL', KEYS[2], ARGV[i]) end
end
return lost
`)

func (g *redisGroup) ackOwned(ctx context.Context, a ackSet) ([]string, error) {
	args := make([]any, 3, 3+len(a.ids)+len(a.records))
	n := 0
	for _, id := range a.ids {
		if !slices.Contains(a.gone, id) { // not pending since the read: nothing to ask
			args, n = append(args, id), n+1
		}
	}
	args[0], args[1], args[2] = g.group, g.consumer, n
	for _, id := range a.records {
		args = append(args, id)
	}
	lost, err := ackOwnedScript.Run(ctx, g.rdb, []string{g.key, g.attempts}, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("ack %d entries (fenced by ownership) in %s %s: %w", len(a.ids), g.key, g.group, err)
	}
	return lost, nil
}

// queueAcks queues the acks of a and the removal of its start records.
func (g *redisGroup) queueAcks(ctx context.Context, p redis.Pipeliner, a ackSet) *redis.IntCmd {
	// go-redis's XAck grows its arguments by append from three.
	args := make([]any, 0, 3+len(a.ids))
	args = append(args, "XACK", g.key, g.group)
	for _, id := range a.ids {
		args = append(args, id)
	}
	ack := redis.NewIntCmd(ctx, args...)
	_ = p.Process(ctx, ack) // its error is ack's
	if len(a.records) > 0 {
		p.HDel(ctx, g.attempts, a.records...)
	}
	return ack
}

func (g *redisGroup) deadLetter(ctx context.Context, rec Fields, id string) error {
	ack := func(p redis.Pipeliner) { g.queueAcks(ctx, p, ackSet{ids: []string{id}, records: []string{id}}) }
	if _, err := g.dead.appendChunk(ctx, []Fields{rec}, ack); err != nil {
		return fmt.Errorf("dead-letter %s to %s: %w", id, g.dead.key, err)
	}
	return nil
}

func (g *redisGroup) mark(ctx context.Context, id string, ttl time.Duration) error {
	key := g.ks.Done(g.stream, g.group, id)
	if err := g.rdb.Set(ctx, key, "1", ttl).Err(); err != nil {
		return fmt.Errorf("dedupe marker %s: %w", key, err)
	}
	return nil
}

func (g *redisGroup) renew(ctx context.Context, ids []string) (int64, error) {
	args := make([]any, 0, 2+len(ids))
	args = append(args, g.group, g.consumer)
	for _, id := range ids {
		args = append(args, id)
	}
	n, err := renewScript.Run(ctx, g.rdb, []string{g.key}, args...).Int64()
	if err != nil {
		return 0, fmt.Errorf("renew %d in-flight entries of %s %s: %w", len(ids), g.key, g.group, err)
	}
	return n, nil
}

func (g *redisGroup) checkGap(ctx context.Context) (int64, error) {
	n, err := gapCheckScript.Run(ctx, g.rdb, []string{g.key, g.gaps}, g.group).Int64()
	if err != nil {
		return 0, fmt.Errorf("check %s %s for entries trimmed unread: %w", g.key, g.group, err)
	}
	return n, nil
}

func (g *redisGroup) gapHead(ctx context.Context) (string, bool, error) {
	head, err := g.rdb.LIndex(ctx, g.gaps, 0).Result()
	if isNil(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("catch-up checkpoint %s: %w", g.gaps, err)
	}
	return head, true, nil
}

func (g *redisGroup) setGapHead(ctx context.Context, head string) error {
	if err := g.rdb.LSet(ctx, g.gaps, 0, head).Err(); err != nil {
		return fmt.Errorf("catch-up checkpoint %s: %w", g.gaps, err)
	}
	return nil
}

func (g *redisGroup) dropGap(ctx context.Context, gap string) error {
	if err := g.rdb.LRem(ctx, g.gaps, 1, gap).Err(); err != nil {
		return fmt.Errorf("catch-up checkpoint %s: %w", g.gaps, err)
	}
	return nil
}

func (g *redisGroup) takeLease(ctx context.Context, ttl time.Duration) (bool, error) {
	got, err := leaseScript.Run(ctx, g.rdb, []string{g.leaseKey}, g.consumer, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("catch-up lease %s: %w", g.leaseKey, err)
	}
	return got == 1, nil
}

func (g *redisGroup) releaseLease(ctx context.Context) {
	releaseScript.Run(ctx, g.rdb, []string{g.leaseKey}, g.consumer)
}

// ensureGroup creates the group at the start of the stream (and the stream
// if missing), only when it is missing: XGROUP CREATE is a write, which a
// full Redis (noeviction) refuses even for a group that exists, and a full
// Redis must still drain.
func (g *redisGroup) ensureGroup(ctx context.Context) error {
	groups, err := g.rdb.XInfoGroups(ctx, g.key).Result()
	if err != nil && !strings.Contains(err.Error(), "no such key") {
		return fmt.Errorf("xinfo groups %s: %w", g.key, err)
	}
	for _, x := range groups {
		if x.Name == g.group {
			return nil
		}
	}
	err = g.rdb.XGroupCreateMkStream(ctx, g.key, g.group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("xgroup create %s %s: %w", g.key, g.group, oomNamed(err))
	}
	return nil
}

// forgetScript removes a consumer only if it has nothing pending, checked in
// the same atomic step: XGROUP DELCONSUMER would make pending entries unclaimable.
var forgetScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #p > 0 then return -1 end
redis.call('HDEL', KEYS[2], ARGV[2])
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
`)

func (g *redisGroup) forgetIdle(ctx context.Context, olderThan time.Duration) ([]string, error) {
	consumers, err := g.rdb.XInfoConsumers(ctx, g.key, g.group).Result()
	if err != nil {
		return nil, fmt.Errorf("xinfo consumers %s %s: %w", g.key, g.group, err)
	}
	var removed []string
	for _, k := range consumers {
		if k.Name == g.consumer || k.Pending > 0 || k.Idle < olderThan {
			continue
		}
		n, err := forgetScript.Run(ctx, g.rdb, []string{g.key, g.windows}, g.group, k.Name).Int64()
		if err != nil {
			return removed, fmt.Errorf("forget consumer %s of %s %s: %w", k.Name, g.key, g.group, err)
		}
		if n >= 0 {
			removed = append(removed, k.Name)
		}
	}
	return removed, nil
}

// oomNamed says plainly that Redis is full when err is its OOM answer.
func oomNamed(err error) error {
	if err != nil && strings.HasPrefix(err.Error(), "OOM") {
		return fmt.Errorf("redis is full (maxmemory reached, noeviction): %w", err)
	}
	return err
}
