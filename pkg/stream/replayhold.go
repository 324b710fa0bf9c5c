package stream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/silt-dev/silt/pkg/brand"
)

// A named replay runs in one process at a time: two at once (a scheduled
// replay and an operator's rerun) would hand every entry to a handler
// twice, and the slower one's checkpoint would move the name back. A
// replay holds its name (Keyspace.ReplayHold: a string with a TTL,
// renewed while it runs), and writes its checkpoint only while it holds
// it: one that lost its hold (paused past the TTL while another took the
// name) stops at its next checkpoint instead of moving it.

// ErrReplayRunning is wrapped by HoldReplay's error when another process
// runs a replay of that name, and by a checkpoint's when this one lost its
// hold to it.
var ErrReplayRunning = errors.New("a replay of this name is running")

// ErrReplayHoldLost is wrapped by a checkpoint's error when this replay's
// hold lapsed and no replay holds the name now.
var ErrReplayHoldLost = errors.New("this replay's hold lapsed")

// replayHoldScript takes or renews the hold of a replay for ARGV[1], for
// ARGV[2] ms. Returns "" when ARGV[1] holds it now, else its holder.
//
// KEYS: hold.
var replayHoldScript = redis.NewScript(`
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return holder end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ''
`)

// replayCheckpointScript sets the checkpoint of a replay to ARGV[2] (an
// empty ARGV[2] removes it) only while ARGV[1] holds the replay.
//
// KEYS: hold, checkpoint. ARGV: holder, stream id. Returns 1, or the
// holder that is not ARGV[1] ("" for none).
var replayCheckpointScript = redis.NewScript(`
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then return holder or '' end
if ARGV[2] == '' then redis.call('DEL', KEYS[2]) else redis.call('SET', KEYS[2], ARGV[2]) end
return 1
`)

// ReplayHold is a process's hold on a named replay of a stream.
type ReplayHold struct {
	l                *Log
	name, key, check string
	me               string // who holds it: host, pid and a nonce
	ttl              time.Duration
	stop             func() // ends the renewal
}

// HoldReplay takes the named replay for this process for ttl, renewed
// every ttl/4 until Release: a process that dies with it lets go after
// ttl. It fails, wrapping ErrReplayRunning and naming the holder, when
// another process holds the name.
func (l *Log) HoldReplay(ctx context.Context, name string, ttl time.Duration) (*ReplayHold, error) {
	if err := ValidateName("replay", name); err != nil {
		return nil, err
	}
	if ttl < time.Millisecond {
		return nil, fmt.Errorf("replay %s: a hold of %s is too short; 1ms at least", name, ttl)
	}
	host, _ := os.Hostname()
	h := &ReplayHold{l: l, name: name, ttl: ttl,
		key:   l.ks.ReplayHold(l.name, name),
		check: l.ks.Replay(l.name, name),
		me:    holderValue(fmt.Sprintf("%s pid %d", host, os.Getpid())),
	}
	if err := h.take(ctx); err != nil {
		return nil, err
	}
	every := max(ttl/4, time.Millisecond)
	h.stop = repeat(ctx, every, every, func(ctx context.Context) { _ = h.take(ctx) }) // a lost hold shows at the next checkpoint
	return h, nil
}

// take takes the hold or renews it.
func (h *ReplayHold) take(ctx context.Context) error {
	holder, err := replayHoldScript.Run(ctx, h.l.rdb, []string{h.key}, h.me, h.ttl.Milliseconds()).Text()
	if err != nil {
		return fmt.Errorf("replay %s: take its hold (%s): %w", h.name, h.key, err)
	}
	if holder != "" {
		return h.running(holder)
	}
	return nil
}

// running is the error for a hold another process has ("": none has).
func (h *ReplayHold) running(holder string) error {
	if holder == "" {
		return fmt.Errorf("replay %s of %s: %w: not renewed within %s, so another replay of the name may have run since; rerun to resume from its checkpoint", h.name, h.l.key, ErrReplayHoldLost, h.ttl)
	}
	return fmt.Errorf("replay %s of %s: %w on %s (a replay that stops renewing its hold lets go after %s)", h.name, h.l.key, ErrReplayRunning, holderName(holder), h.ttl)
}

// Checkpoint records sid as the last stream id the replay handled, while
// the hold is this process's; else it fails, wrapping ErrReplayRunning.
func (h *ReplayHold) Checkpoint(ctx context.Context, sid brand.StreamID) error {
	return h.setCheckpoint(ctx, sid.String())
}

// setCheckpoint sets the checkpoint to v ("" removes it) while the hold is
// this process's.
func (h *ReplayHold) setCheckpoint(ctx context.Context, v string) error {
	res, err := replayCheckpointScript.Run(ctx, h.l.rdb, []string{h.key, h.check}, h.me, v).Result()
	if err != nil {
		return fmt.Errorf("replay checkpoint %s: %w", h.check, err)
	}
	if holder, ok := res.(string); ok {
		return h.running(holder)
	}
	return nil
}

// Name is the replay's name.
func (h *ReplayHold) Name() string { return h.name }

// Last returns the replay's checkpoint (Log.ReplayCheckpoint).
func (h *ReplayHold) Last(ctx context.Context) (sid brand.StreamID, ok bool, err error) {
	return h.l.ReplayCheckpoint(ctx, h.name)
}

// Forget removes the replay's checkpoint (a replay from the start of its
// range), while the hold is this process's.
func (h *ReplayHold) Forget(ctx context.Context) error { return h.setCheckpoint(ctx, "") }

// Release lets the name go: the next replay of it may start at once.
func (h *ReplayHold) Release(ctx context.Context) error {
	h.stop()
	if err := releaseScript.Run(ctx, h.l.rdb, []string{h.key}, h.me).Err(); err != nil {
		return fmt.Errorf("replay %s: release its hold (it lapses after %s): %w", h.name, h.ttl, err)
	}
	return nil
}
