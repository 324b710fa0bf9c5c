package stream_test

import (
	"context"
	"errors"
	"iter"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// memHistory is an archive held in memory: the entries given to it.
type memHistory struct{ entries []stream.Entry }

func (h *memHistory) Payload(_ context.Context, sid brand.StreamID) (brand.ID, stream.Fields, error) {
	for _, e := range h.entries {
		if e.StreamID == sid {
			return e.ID, e.Fields, nil
		}
	}
	return brand.ID{}, nil, stream.ErrPayloadNotFound
}

func (h *memHistory) Archived(_ context.Context, from, to brand.StreamID) iter.Seq2[stream.Entry, error] {
	return func(yield func(stream.Entry, error) bool) {
		for _, e := range h.entries {
			if e.StreamID.Compare(from) >= 0 && e.StreamID.Compare(to) <= 0 && !yield(e, nil) {
				return
			}
		}
	}
}

// A group that fell behind retention without an archive counts what it
// skipped, says so in the status, and a later run with an archive catches
// the skipped entries up.
func TestConsumer_BehindRetentionWithoutArchiveIsCountedThenCaughtUp(t *testing.T) {
	f := newFixture(t, 100)
	ctx := context.Background()
	c := f.consumer(t, "w1")
	c.MaxEntries = 10
	run(t, c, newRecorder(nil).handle) // the group read 10
	h := &memHistory{}
	for e, err := range f.log.Read(ctx, stream.First, stream.Last) {
		if err != nil {
			t.Fatal(err)
		}
		h.entries = append(h.entries, e)
	}
	if _, err := f.log.TrimMaxLen(ctx, 50, true); err != nil { // 40 unread entries go
		t.Fatal(err)
	}
	rec := newRecorder(nil)
	sum := run(t, f.consumer(t, "w1"), rec.handle)
	if sum.TrimmedUnread != 40 || sum.Acked != 50 {
		t.Fatalf("summary %+v, want 40 trimmed unread and the 50 live handled", sum)
	}
	st, err := stream.Inspect(ctx, f.log, "billing")
	if err != nil {
		t.Fatal(err)
	}
	if g := st.Groups[0]; g.CatchUpGaps != 1 || g.TrimmedUnread != 40 {
		t.Fatalf("status %+v, want one gap of 40", g)
	}
	// A second run without an archive records nothing new.
	if sum := run(t, f.consumer(t, "w1"), rec.handle); sum.TrimmedUnread != 0 {
		t.Fatalf("second run %+v", sum)
	}
	c = f.consumer(t, "w1")
	c.Payloads = h
	sum = run(t, c, rec.handle)
	if sum.CatchUp != 40 || sum.Acked != 40 {
		t.Fatalf("run with an archive %+v, want the 40 caught up", sum)
	}
	for _, id := range f.ids[10:] {
		if rec.calls[id] != 1 {
			t.Fatalf("%s handled %d times", id, rec.calls[id])
		}
	}
}

// A dead letter whose payload was trimmed keeps its stream id and starts,
// is refused by a retry (nothing to hand a handler), and goes only when
// dropped.
func TestConsumer_DeadLetterWithoutPayload(t *testing.T) {
	f := newFixture(t, 3)
	ctx := context.Background()
	c := f.consumer(t, "w1")
	c.Count = 3
	fail := newRecorder(func(stream.Delivery) error { return errors.New("later") })
	run(t, c, fail.handle) // all three pending, one start each
	f.log.TrimMaxLen(ctx, 0, true)
	run(t, f.consumer(t, "w1"), newRecorder(nil).handle) // no archive: dead-lettered as trimmed
	var dls []stream.DeadLetter
	for dl, err := range c.DeadLetters(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		dls = append(dls, dl)
	}
	if len(dls) != 3 || !dls[0].NoPayload || dls[0].EntryStreamID != f.ids[0].StreamID || dls[0].Attempts != 1 {
		t.Fatalf("dead letters %+v", dls)
	}
	called := newRecorder(nil)
	res, err := c.RetryDead(ctx, called.handle, "")
	if err != nil || res.Refused != 3 || res.Retried != 0 || len(called.calls) != 0 {
		t.Fatalf("retry all: %+v %v, %d handler calls", res, err, len(called.calls))
	}
	if _, err := c.RetryDead(ctx, called.handle, f.ids[1].StreamID.String()); !errors.Is(err, stream.ErrNoPayload) {
		t.Fatalf("retry of one: %v", err)
	}
	if _, err := c.DropDead(ctx, f.ids[1].StreamID.String()); err != nil {
		t.Fatal(err)
	}
	if n := len(f.deadLetters(t)); n != 2 {
		t.Fatalf("%d dead letters after one drop", n)
	}
}

// A catch-up batch slower than LeaseTTL keeps its lease: a peer running
// meanwhile catches up nothing the first consumer is still handling.
func TestConsumer_SlowCatchUpKeepsItsLease(t *testing.T) {
	f := newFixture(t, 10)
	ctx := context.Background()
	h := &memHistory{}
	for e, err := range f.log.Read(ctx, stream.First, stream.Last) {
		if err != nil {
			t.Fatal(err)
		}
		h.entries = append(h.entries, e)
	}
	if _, err := f.log.TrimMaxLen(ctx, 4, true); err != nil { // 6 only in the archive
		t.Fatal(err)
	}
	rec := newRecorder(nil)
	slow := func(ctx context.Context, d stream.Delivery) error {
		time.Sleep(100 * time.Millisecond) // 6 × 100 ms: three times the lease TTL
		return rec.handle(ctx, d)
	}
	consumer := func(name string) *stream.Consumer {
		c := f.consumer(t, name)
		c.Payloads, c.LeaseTTL, c.Count = h, 200*time.Millisecond, 10
		return c
	}
	done := make(chan stream.Summary)
	go func() { done <- run(t, consumer("a"), slow) }()
	var peer stream.Summary
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		select {
		case sum := <-done:
			if sum.CatchUp+peer.CatchUp != 6 {
				t.Fatalf("caught up %d by the first, %d by the peer", sum.CatchUp, peer.CatchUp)
			}
			for _, id := range f.ids {
				if rec.calls[id] != 1 {
					t.Fatalf("%s handled %d times", id, rec.calls[id])
				}
			}
			return
		default:
		}
		p := consumer("b")
		p.Block = 20 * time.Millisecond
		sum, _ := p.Run(ctx, slow)
		peer.CatchUp += sum.CatchUp
	}
	t.Fatal("the first consumer never finished")
}
