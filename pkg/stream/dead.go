package stream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
)

// DeadLetter is one record of a group's dead-letter stream.
type DeadLetter struct {
	ID            brand.ID       // the record's own id in the dead-letter stream
	EntryID       string         // the entry's branded id (raw text when it was malformed)
	EntryStreamID brand.StreamID // the entry's id in the source stream
	Group         string
	Consumer      string
	Attempts      int64 // handler starts (deliveries before silt counted starts)
	Deliveries    int64 // times Redis handed the entry out; 0 in records written before it was kept
	Reason        string
	Time          time.Time
	Payload       Fields
	// NoPayload: the record holds no payload (the entry was trimmed before
	// it could be read, or was over MaxEntryBytes), so there is nothing to
	// hand a handler again.
	NoPayload bool
}

// DeadLetters yields the group's dead letters, oldest first. A record that
// cannot be decoded is yielded with an error and iteration goes on.
func (c *Consumer) DeadLetters(ctx context.Context) iter.Seq2[DeadLetter, error] {
	return func(yield func(DeadLetter, error) bool) {
		for e, err := range c.dead.Read(ctx, First, Last) {
			if err != nil && !errors.Is(err, ErrMalformed) {
				yield(DeadLetter{}, err)
				return
			}
			dl, derr := decodeDeadLetter(e)
			if derr != nil {
				derr = fmt.Errorf("%s: record %s: %w", c.dead.key, e.StreamID, derr)
			}
			if !yield(dl, errors.Join(err, derr)) {
				return
			}
		}
	}
}

// DecodeDeadLetter decodes one record of a dead-letter stream (read live,
// or from the archive of the dead letters).
func DecodeDeadLetter(e Entry) (DeadLetter, error) { return decodeDeadLetter(e) }

func decodeDeadLetter(e Entry) (DeadLetter, error) {
	f := e.Fields
	dl := DeadLetter{ID: e.ID, EntryID: f["entry_id"], Group: f["group"], Consumer: f["consumer"], Reason: f["reason"]}
	// Records written before "no_payload" was kept say so in their reason.
	dl.NoPayload = f["no_payload"] == "1" || strings.HasPrefix(dl.Reason, "payload trimmed") || strings.HasPrefix(dl.Reason, "oversized entry")
	var errs []error
	var err error
	if dl.EntryStreamID, err = brand.ParseStreamID(f["entry_stream_id"]); err != nil {
		errs = append(errs, fmt.Errorf("entry_stream_id: %w", err))
	}
	if dl.Attempts, err = strconv.ParseInt(f["attempts"], 10, 64); err != nil {
		errs = append(errs, fmt.Errorf("attempts %q: not a number", f["attempts"]))
	}
	if d, ok := f["deliveries"]; ok {
		if dl.Deliveries, err = strconv.ParseInt(d, 10, 64); err != nil {
			errs = append(errs, fmt.Errorf("deliveries %q: not a number", d))
		}
	}
	if dl.Time, err = time.Parse(time.RFC3339Nano, f["time"]); err != nil {
		errs = append(errs, fmt.Errorf("time %q: not RFC 3339", f["time"]))
	}
	if err := json.Unmarshal([]byte(f["payload"]), &dl.Payload); err != nil {
		errs = append(errs, fmt.Errorf("payload: %v", err))
	}
	return dl, errors.Join(errs...)
}

// RetryResult counts what RetryDead did.
type RetryResult struct {
	Retried   int64 `json:"retried"`
	Succeeded int64 `json:"succeeded"` // handled and removed from the dead-letter stream
	Failed    int64 `json:"failed"`    // the handler failed again: the record stays
	Refused   int64 `json:"refused"`   // records without a payload: not handed to the handler, kept
	// Elsewhere counts records another retry held at the same time, or
	// had retried with success since they were listed: not handed to the
	// handler here.
	Elsewhere int64 `json:"elsewhere"`
}

// ErrNoPayload is wrapped by RetryDead's error when the dead letter asked
// for holds no payload to retry (DeadLetter.NoPayload).
var ErrNoPayload = errors.New("dead letter holds no payload")

// RetryDead hands dead letters to h again: all of them when match is empty,
// else the one whose entry id, entry stream id or record id is match. Each
// record is removed from the dead-letter stream only after h succeeds. A
// record without a payload is never handed to h: it stays, counted as
// refused (an error wrapping ErrNoPayload when it was asked for by match),
// until DropDead removes it deliberately.
func (c *Consumer) RetryDead(ctx context.Context, h Handler, match string) (RetryResult, error) {
	var res RetryResult
	found := false
	for dl, err := range c.DeadLetters(ctx) {
		if err != nil {
			return res, err
		}
		if !dl.matches(match) {
			continue
		}
		found = true
		if dl.NoPayload {
			res.Refused++
			c.Logger.Warn("dead letter has no payload to retry; it stays until dropped", "entry_stream_id", dl.EntryStreamID.String(), "reason", dl.Reason)
			if match != "" {
				return res, fmt.Errorf("dead letter of %s (%s): %w; nothing to hand a handler", dl.EntryStreamID, dl.Reason, ErrNoPayload)
			}
			continue
		}
		herr, err := c.retryOne(ctx, h, dl, false)
		if errors.Is(err, ErrRetryHeld) || errors.Is(err, ErrRetriedBefore) {
			res.Elsewhere++
			if match != "" {
				return res, err
			}
			c.Logger.Info("dead letter left to another retry", "dead_letter", dl.ID.String(), "entry", dl.EntryID, "why", err.Error())
			continue
		}
		res.Retried++
		if err != nil {
			return res, err
		}
		if herr != nil {
			res.Failed++
			c.Logger.Warn("retry failed", "entry", dl.EntryID, "error", herr.Error())
			continue
		}
		res.Succeeded++
	}
	if match != "" && !found {
		return res, fmt.Errorf("%q in %s: %w", match, c.dead.key, ErrNoDeadLetter)
	}
	return res, nil
}

// DropDead removes the dead letter whose entry id, entry stream id or
// record id is match, unhandled: the deliberate end of an entry that cannot
// be retried. It returns the record it removed. A record a retry hands to
// a handler now is not removed (an error wrapping ErrRetryHeld): the
// handler may yet succeed with it.
func (c *Consumer) DropDead(ctx context.Context, match string) (DeadLetter, error) {
	for dl, err := range c.DeadLetters(ctx) {
		if err != nil {
			return DeadLetter{}, err
		}
		if match == "" || !dl.matches(match) {
			continue
		}
		claim := c.log.ks.DeadRetrying(c.log.name, c.group, dl.ID.String())
		holder, err := dropUnclaimedScript.Run(ctx, c.log.rdb, []string{claim, c.dead.key}, dl.ID.StreamID.String()).Text()
		if err != nil {
			return DeadLetter{}, fmt.Errorf("remove dead letter %s from %s: %w", dl.ID, c.dead.key, err)
		}
		if holder != "" {
			return DeadLetter{}, fmt.Errorf("dead letter %s of %s: %w (consumer %q holds it); not removed",
				dl.ID, dl.EntryStreamID, ErrRetryHeld, holderName(holder))
		}
		return dl, nil
	}
	return DeadLetter{}, fmt.Errorf("%q in %s: %w", match, c.dead.key, ErrNoDeadLetter)
}

// Matches reports whether match names this record: its entry's branded id
// or stream id, or the record's own id (empty matches every record).
func (dl DeadLetter) Matches(match string) bool { return dl.matches(match) }

// ErrNoDeadLetter is wrapped by the error of RetryDead and DropDead when no
// record of the dead-letter stream matches.
var ErrNoDeadLetter = errors.New("no such dead letter")

// ErrRetriedBefore is wrapped by RetryDeadLetter's error for a dead letter
// that was retried with success before: its handler is not run again.
var ErrRetriedBefore = errors.New("dead letter retried before")

// RetryDeadLetter hands one dead letter to h again, whether it is still in
// the dead-letter stream or was read back from their archive after the
// archiver trimmed it (the handler's Delivery.Recovered says which). On
// success it is removed from the stream (when there) and recorded as
// retried (Keyspace.DeadRetried), so that a dead letter that lives on in
// the archive is not handed to a handler twice: asked for again, it is
// refused with ErrRetriedBefore, naming when.
func (c *Consumer) RetryDeadLetter(ctx context.Context, h Handler, dl DeadLetter) error {
	if dl.NoPayload {
		return fmt.Errorf("dead letter of %s (%s): %w; nothing to hand a handler", dl.EntryStreamID, dl.Reason, ErrNoPayload)
	}
	live, err := c.dead.ReadRaw(ctx, dl.ID.StreamID, dl.ID.StreamID, 1)
	if err != nil {
		return fmt.Errorf("retry of dead letter %s: look for it in %s: %w", dl.ID, c.dead.key, err)
	}
	herr, err := c.retryOne(ctx, h, dl, len(live) == 0)
	if herr != nil {
		return fmt.Errorf("retry of dead letter %s (entry %s): %w", dl.ID, dl.EntryID, herr)
	}
	return err
}

// retryOne hands dl to h (recovered: its payload came from the archive)
// under a claim on it (retryclaim.go) and, on success, records it as
// retried and removes it from the dead-letter stream. herr is the
// handler's error; err is Redis's, or wraps ErrRetriedBefore or
// ErrRetryHeld when the handler was not run: dl was retried with success
// already (a record still in the stream, which is removed now: the retry
// before stopped short of it), or another retry holds it.
func (c *Consumer) retryOne(ctx context.Context, h Handler, dl DeadLetter, recovered bool) (herr, err error) {
	claim, err := c.claimRetry(ctx, dl)
	if errors.Is(err, ErrRetriedBefore) && !recovered {
		if derr := c.log.rdb.XDel(ctx, c.dead.key, dl.ID.StreamID.String()).Err(); derr != nil {
			return nil, fmt.Errorf("remove dead letter %s, retried before, from %s: %w", dl.ID, c.dead.key, derr)
		}
	}
	if err != nil {
		return nil, err
	}
	d := Delivery{StreamID: dl.EntryStreamID, Fields: dl.Payload, Attempts: dl.Attempts + 1, Group: c.group, Consumer: c.name, Recovered: recovered}
	d.ID, _ = brand.Parse(dl.EntryID)
	if herr := call(ctx, h, d); herr != nil {
		claim.release(context.WithoutCancel(ctx))
		return herr, nil
	}
	return nil, claim.retried(context.WithoutCancel(ctx))
}

// matches reports whether match (empty: everything) names this record.
func (dl DeadLetter) matches(match string) bool {
	return match == "" || (dl.EntryID != "" && match == dl.EntryID) || match == dl.EntryStreamID.String() || match == dl.ID.String()
}

// ForgetRetried removes from the record of dead letters retried with
// success (Keyspace.DeadRetried) those whose record id is below the oldest
// dead letter still readable, which oldestKept returns (archive and live
// stream merged; Last when there is none): the record keeps a dead letter
// that lives on in the archive from being handed to a handler twice, and
// one the archive's history retention has dropped can be asked for no
// more. oldestKept is called only when there is a record. l must be a
// dead-letter log (Log.DeadLetters). It returns how many it removed.
func (l *Log) ForgetRetried(ctx context.Context, oldestKept func(context.Context) (brand.StreamID, error)) (int, error) {
	if l.deadGroup == "" {
		return 0, fmt.Errorf("%s is not a dead-letter stream: it has no record of retried dead letters", l.key)
	}
	key := l.ks.DeadRetried(l.name, l.deadGroup)
	removed := 0
	var first *brand.StreamID
	var cursor uint64
	for {
		// Field and value in turn (HSCAN's NOVALUES is Redis 7.4's).
		kv, next, err := l.rdb.HScan(ctx, key, cursor, "", 1000).Result()
		if err != nil {
			return removed, fmt.Errorf("dead letters retried (%s): %w", key, err)
		}
		if len(kv) > 0 && first == nil {
			sid, err := oldestKept(ctx)
			if err != nil {
				return removed, err
			}
			first = &sid
		}
		var gone []string
		for i := 0; i+1 < len(kv); i += 2 {
			// A field silt did not write is left as it is.
			if id, err := brand.Parse(kv[i]); err == nil && id.StreamID.Compare(*first) < 0 {
				gone = append(gone, kv[i])
			}
		}
		if len(gone) > 0 {
			n, err := l.rdb.HDel(ctx, key, gone...).Result()
			if err != nil {
				return removed, fmt.Errorf("forget %d dead letters retried (%s): %w", len(gone), key, err)
			}
			removed += int(n)
		}
		if cursor = next; cursor == 0 {
			return removed, nil
		}
	}
}
