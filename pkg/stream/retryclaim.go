package stream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A retry of a dead letter claims its record before the handler runs
// (Keyspace.DeadRetrying: a string with a TTL of Consumer.LeaseTTL,
// renewed while the handler runs) and, once the handler succeeds, records
// it as retried, removes it from the dead-letter stream and drops the
// claim in one script. A second retry of the same record, from this
// process or another, finds the claim, or the record of the retry done,
// and hands it to no handler. A retry that dies with its handler leaves a
// claim that lapses after LeaseTTL; the record is still there to retry.

// ErrRetryHeld is wrapped by the error of RetryDead (for a record asked for
// by match) and RetryDeadLetter when another retry holds the dead letter
// now: its handler is not run here.
var ErrRetryHeld = errors.New("dead letter being retried by another retry")

// claimRetryScript claims dead letter ARGV[1] for ARGV[2], or renews the
// claim ARGV[2] holds, unless it was retried with success already or
// another retry holds it.
//
// KEYS: dead-retried hash, claim. ARGV: record id, claimant, ttl in ms.
// Returns {"retried", time}, {"held", holder} or {"claimed"}.
var claimRetryScript = redis.NewScript(`
local at = redis.call('HGET', KEYS[1], ARGV[1])
if at then return {'retried', at} end
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[2] then return {'held', holder} end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return {'claimed'}
`)

// retriedScript ends a retry whose handler succeeded: the record is noted
// as retried (at the first success's time, should two have run), removed
// from the dead-letter stream, and the claim dropped if ARGV[2] holds it.
//
// KEYS: dead-retried hash, claim, dead-letter stream. ARGV: record id,
// claimant, time, record's stream id.
var retriedScript = redis.NewScript(`
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[3], ARGV[4])
if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
return 1
`)

// dropUnclaimedScript removes dead letter ARGV[1] unless a retry claims
// it, and returns the claim's holder ("" when it removed the record).
//
// KEYS: claim, dead-letter stream. ARGV: the record's stream id.
var dropUnclaimedScript = redis.NewScript(`
local holder = redis.call('GET', KEYS[1])
if holder then return holder end
redis.call('XDEL', KEYS[2], ARGV[1])
return ''
`)

// holderValue is what a claim or hold stores for who: who, then a nonce
// that tells two claims of the same name apart.
func holderValue(who string) string {
	var nonce [6]byte
	rand.Read(nonce[:])
	return who + " " + hex.EncodeToString(nonce[:])
}

// holderName is who in a value holderValue made.
func holderName(value string) string {
	if i := strings.LastIndexByte(value, ' '); i >= 0 {
		return value[:i]
	}
	return value
}

// retryClaim is a retry's hold on one dead letter.
type retryClaim struct {
	c    *Consumer
	dl   DeadLetter
	done string // the group's dead-retried hash
	key  string // the claim
	me   string // the claimant: the consumer's name and a nonce of this retry
	stop func() // ends the renewal
}

// claimRetry claims dl for a retry by this consumer. The error wraps
// ErrRetriedBefore (naming when) or ErrRetryHeld (naming the holder) when
// dl must not be handed to a handler here.
func (c *Consumer) claimRetry(ctx context.Context, dl DeadLetter) (*retryClaim, error) {
	rc := &retryClaim{c: c, dl: dl,
		done: c.log.ks.DeadRetried(c.log.name, c.group),
		key:  c.log.ks.DeadRetrying(c.log.name, c.group, dl.ID.String()),
		me:   holderValue(c.name),
	}
	if err := rc.take(ctx); err != nil {
		return nil, err
	}
	every := max(c.LeaseTTL/4, 10*time.Millisecond)
	rc.stop = repeat(ctx, every, every, func(ctx context.Context) {
		if err := rc.take(ctx); err != nil && ctx.Err() == nil {
			c.Logger.Warn("could not renew the claim on a dead letter being retried; another retry may hand it to a handler too",
				"dead_letter", dl.ID.String(), "entry", dl.EntryID, "error", err.Error())
		}
	})
	return rc, nil
}

// take claims the record, or renews the claim.
func (rc *retryClaim) take(ctx context.Context) error {
	res, err := claimRetryScript.Run(ctx, rc.c.log.rdb, []string{rc.done, rc.key},
		rc.dl.ID.String(), rc.me, rc.c.LeaseTTL.Milliseconds()).StringSlice()
	if err != nil {
		return fmt.Errorf("claim dead letter %s for a retry (%s): %w", rc.dl.ID, rc.key, err)
	}
	switch {
	case len(res) == 2 && res[0] == "retried":
		return fmt.Errorf("dead letter %s of %s: %w at %s", rc.dl.ID, rc.dl.EntryStreamID, ErrRetriedBefore, res[1])
	case len(res) == 2 && res[0] == "held":
		return fmt.Errorf("dead letter %s of %s: %w (consumer %q holds it; a claim its holder stops renewing lapses after %s)",
			rc.dl.ID, rc.dl.EntryStreamID, ErrRetryHeld, holderName(res[1]), rc.c.LeaseTTL)
	case len(res) == 1 && res[0] == "claimed":
		return nil
	}
	return fmt.Errorf("claim dead letter %s for a retry: unexpected reply %q", rc.dl.ID, res)
}

// retried ends the claim of a retry whose handler succeeded.
func (rc *retryClaim) retried(ctx context.Context) error {
	rc.stop()
	err := retriedScript.Run(ctx, rc.c.log.rdb, []string{rc.done, rc.key, rc.c.dead.key},
		rc.dl.ID.String(), rc.me, time.Now().UTC().Format(time.RFC3339Nano), rc.dl.ID.StreamID.String()).Err()
	if err != nil {
		return fmt.Errorf("record the retry of dead letter %s in %s and remove it from %s: %w", rc.dl.ID, rc.done, rc.c.dead.key, err)
	}
	return nil
}

// release ends the claim of a retry whose handler failed: the record can
// be retried again at once.
func (rc *retryClaim) release(ctx context.Context) {
	rc.stop()
	if err := releaseScript.Run(ctx, rc.c.log.rdb, []string{rc.key}, rc.me).Err(); err != nil {
		rc.c.Logger.Warn("could not release the claim on a dead letter; it lapses by itself",
			"dead_letter", rc.dl.ID.String(), "after", rc.c.LeaseTTL.String(), "error", err.Error())
	}
}
