package archive

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// Source reads a range of history: Archive.Read, or LiveOnly for a stream
// without an archive.
type Source func(ctx context.Context, from, to brand.StreamID) iter.Seq2[Item, error]

// LiveOnly reads the live stream alone as a Source.
func LiveOnly(l *stream.Log) Source {
	return func(ctx context.Context, from, to brand.StreamID) iter.Seq2[Item, error] {
		return func(yield func(Item, error) bool) {
			for e, err := range l.Read(ctx, from, to) {
				if !yield(Item{Entry: e, Source: SourceLive}, err) {
					return
				}
			}
		}
	}
}

// ReplayResult says what a replay did.
type ReplayResult struct {
	Name       string `json:"name"`
	Replayed   int64  `json:"replayed"`
	Skipped    int64  `json:"skipped_malformed"`
	Checkpoint string `json:"checkpoint,omitempty"` // last stream id handled under this name
	Done       bool   `json:"done"`                 // the range is finished
}

// Replay runs h over [from, to] of the history in order, as deliveries
// carrying the replay's name, storing the last handled stream id under the
// name after each success so that a rerun (after a crash or a handler
// failure) resumes just after it. A handler error stops the replay with the
// checkpoint at the entry before. Malformed entries are skipped and counted.
// One process runs a name at a time: while another holds it
// (Log.HoldReplay), Replay fails at once with an error wrapping
// stream.ErrReplayRunning, and hands no entry to h.
//
// Each checkpoint is written while the next entry is handled, and waited
// for before the one after it goes out (a round trip to Redis an entry
// was a third of a replay's time through a co-process): a replay killed
// meanwhile may hand its last entry to the handler again, as any
// at-least-once delivery may.
func Replay(ctx context.Context, l *stream.Log, read Source, name string, from, to brand.StreamID, h stream.Handler) (res ReplayResult, err error) {
	hold, err := l.HoldReplay(ctx, name, stream.DefaultLeaseTTL)
	if err != nil {
		return ReplayResult{Name: name}, err
	}
	defer func() {
		if rerr := hold.Release(context.WithoutCancel(ctx)); err == nil {
			err = rerr
		}
	}()
	return ReplayHeld(ctx, hold, read, from, to, h)
}

// ReplayHeld is Replay under a hold the caller took (to forget the
// checkpoint first, say) and releases. A checkpoint written after the
// hold was lost to another process fails the replay there.
func ReplayHeld(ctx context.Context, hold *stream.ReplayHold, read Source, from, to brand.StreamID, h stream.Handler) (res ReplayResult, err error) {
	name := hold.Name()
	res = ReplayResult{Name: name}
	var saving chan error // the checkpoint being written
	saved := func() error {
		if saving == nil {
			return nil
		}
		err := <-saving
		saving = nil
		return err
	}
	defer func() { // no checkpoint outlives its replay, and a failed one fails it
		if serr := saved(); err == nil {
			err = serr
		}
	}()
	last, ok, err := hold.Last(ctx)
	if err != nil {
		return res, err
	}
	if ok {
		res.Checkpoint = last.String()
		if next, ok := last.Next(); ok && next.Compare(from) > 0 {
			from = next
		}
	}
	for it, err := range read(ctx, from, to) {
		if errors.Is(err, stream.ErrMalformed) {
			res.Skipped++
			continue
		}
		if err != nil {
			return res, err
		}
		d := stream.Delivery{ID: it.ID, StreamID: it.StreamID, Fields: it.Fields, Attempts: 1,
			Recovered: it.Source == SourceArchive, Replay: name}
		if err := callSafely(ctx, h, d); err != nil {
			return res, fmt.Errorf("replay %s: entry %s: %w (rerun to resume here)", name, it.ID, err)
		}
		if err := saved(); err != nil {
			return res, err
		}
		saving = make(chan error, 1)
		go func(sid brand.StreamID) { saving <- hold.Checkpoint(ctx, sid) }(it.StreamID)
		res.Replayed++
		res.Checkpoint = it.StreamID.String()
	}
	res.Done = ctx.Err() == nil
	return res, ctx.Err()
}

// callSafely runs h, turning a panic into an error.
func callSafely(ctx context.Context, h stream.Handler, d stream.Delivery) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &stream.PanicError{Value: v}
		}
	}()
	return h(ctx, d)
}
