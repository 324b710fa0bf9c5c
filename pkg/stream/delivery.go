package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
)

// Delivery is one entry handed to a Handler.
type Delivery struct {
	ID       brand.ID       // the branded id; handlers dedupe by it
	StreamID brand.StreamID // the entry's id in the stream
	// Fields is the payload, without "id". Names and values may share the
	// bytes of the read that returned the entry (up to a batch of
	// entries): a handler that keeps one long after it returns and wants
	// that memory back keeps strings.Clone of it.
	Fields Fields
	// Attempts counts the handler starts for this entry by its group, this
	// one included (Consumer.MaxAttempts is judged on it). It survives
	// worker crashes, reclaims and recovery from the archive.
	Attempts int64
	// Deliveries counts the times Redis handed the entry out (XPENDING):
	// reads ahead and crashed runs count here, not in Attempts.
	Deliveries int64
	Group      string
	Consumer   string
	Recovered  bool   // the payload was trimmed from the stream and came from a PayloadSource
	Replay     string // the replay's name when this is a deliberate reprocessing (worker replay)

	begin func() error // records the start (Consumer.HandlerBegins)
}

// Begin records this start of the entry's handler, for a Consumer with
// HandlerBegins: the handler calls it once it is ready to work on the
// entry and before it does (an exec handler: its process created, the entry
// not yet written to it). An error means the start could not be recorded:
// the handler must not work on the entry, and returns; the entry is left
// pending, this start uncounted. Begin does nothing, and returns nil, where
// the Consumer records starts itself, and when called again.
func (d Delivery) Begin() error {
	if d.begin == nil {
		return nil
	}
	return d.begin()
}

// Handler handles one delivery. nil acks the entry; an error or a panic
// leaves it pending for a later attempt; an error wrapped with Permanent
// dead-letters it at once.
type Handler func(ctx context.Context, d Delivery) error

// permanentError marks an error that no retry can fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent: the entry goes to the dead-letter stream
// now instead of being retried.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	_, ok := errors.AsType[*permanentError](err)
	return ok
}

// ErrPayloadNotFound is returned by a PayloadSource that does not hold an entry.
var ErrPayloadNotFound = errors.New("payload not found")

// PayloadSource recovers the payload of an entry that was trimmed from the
// stream while it was pending (the archive implements it). Payload returns
// the entry's branded id and fields, or an error wrapping ErrPayloadNotFound
// when the source does not hold it; any other error is a failure of the source.
type PayloadSource interface {
	Payload(ctx context.Context, stream brand.StreamID) (brand.ID, Fields, error)
}

// PanicError is the error a Handler's panic turns into.
type PanicError struct {
	Value any
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panic: %v", e.Value) }

// Exit reasons of a consumer run.
const (
	ExitIdle       = "idle"        // PEL drained, nothing claimable, nothing new within the block time
	ExitMaxEntries = "max-entries" // the entry budget is spent
	ExitMaxTime    = "max-duration"
	ExitSignal     = "cancelled" // the context was cancelled (SIGTERM, SIGINT)
	ExitError      = "error"
)

// Summary counts what one run did. Every delivery ends in exactly one of
// Acked, Failed (left pending), DeadLettered or Abandoned.
type Summary struct {
	Drained      int64 `json:"drained"`       // deliveries from our own PEL
	Claimed      int64 `json:"claimed"`       // deliveries reclaimed from idle peers
	New          int64 `json:"new"`           // deliveries of never-delivered entries
	CatchUp      int64 `json:"catch_up"`      // deliveries read from the archive for a group behind retention
	Acked        int64 `json:"acked"`         // handled successfully (or duplicates) and acked
	Failed       int64 `json:"failed"`        // handler errors left pending
	Panics       int64 `json:"panics"`        // handler panics (also counted in Failed or DeadLettered)
	DeadLettered int64 `json:"dead_lettered"` // moved to the dead-letter stream
	Abandoned    int64 `json:"abandoned"`     // not finished at shutdown, left pending
	// LostLease counts successes not acked because a peer had reclaimed the
	// entry meanwhile (the batch outlived --min-idle): the peer handles and
	// acks them. Not counted in Acked.
	LostLease         int64 `json:"lost_lease"`
	Malformed         int64 `json:"malformed"`          // dead-lettered because the id was bad
	Oversized         int64 `json:"oversized"`          // dead-lettered unhandled: larger than MaxEntryBytes
	PayloadRecovered  int64 `json:"payload_recovered"`  // trimmed while pending, recovered from the source
	PayloadLost       int64 `json:"payload_lost"`       // trimmed while pending, not recoverable: dead-lettered
	DuplicatesSkipped int64 `json:"duplicates_skipped"` // already handled by this group (dedupe), acked
	TrimmedUnread     int64 `json:"trimmed_unread"`     // trimmed before the group read them, without an archive: recorded as a gap, not handled
	// TrimmedUnreadUnknown: entries were trimmed before the group read
	// them, and Redis cannot tell how many (TrimmedUnread counts none of them).
	TrimmedUnreadUnknown bool          `json:"trimmed_unread_unknown,omitempty"`
	StaleConsumers       int64         `json:"stale_consumers_removed"`
	LeaseWait            bool          `json:"waited_for_catch_up_lease,omitempty"` // gaps were left and another consumer held the lease
	ExitReason           string        `json:"exit_reason"`
	Elapsed              time.Duration `json:"-"`
	ElapsedSeconds       float64       `json:"elapsed_seconds"`
}

// Handled returns how many deliveries the run finished one way or another.
func (s *Summary) Handled() int64 { return s.Acked + s.Failed + s.DeadLettered }
