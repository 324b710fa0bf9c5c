package archive_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/stream"
)

// TestRun_HistoryRetentionForgetsTheRetriedDeadLettersItDrops: the record
// of dead letters retried with success (a hash field each, which refuses a
// second retry of one the archive still holds) loses a field once the
// archive of the dead letters has dropped its record, and keeps the
// fields of those still kept, the oldest kept included, and a field that
// is not a branded id.
func TestRun_HistoryRetentionForgetsTheRetriedDeadLettersItDrops(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c, err := stream.NewConsumer(e.log, "g", "w1")
	if err != nil {
		t.Fatal(err)
	}
	c.Block = 50 * time.Millisecond
	poison := func(context.Context, stream.Delivery) error { return stream.Permanent(errors.New("poison")) }
	ok := func(context.Context, stream.Delivery) error { return nil }
	deadLetter := func(n int) []stream.DeadLetter {
		t.Helper()
		e.appendN(t, n)
		if sum, err := c.Run(ctx, poison); err != nil || sum.DeadLettered != int64(n) {
			t.Fatalf("dead-letter %d: %+v, %v", n, sum, err)
		}
		var all []stream.DeadLetter
		for dl, err := range c.DeadLetters(ctx) {
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, dl)
		}
		return all[len(all)-n:]
	}
	a, err := archive.Open(ctx, c.DeadLetterLog(), t.TempDir(), e.store)
	if err != nil {
		t.Fatal(err)
	}
	a.SliceEntries, a.Exact = 5, true
	retried := e.log.Keyspace().DeadRetried(e.log.Name(), "g")
	fields := func() []string {
		t.Helper()
		m, err := e.rdb.HGetAll(ctx, retried).Result()
		if err != nil {
			t.Fatal(err)
		}
		var f []string
		for k := range m {
			f = append(f, k)
		}
		slices.Sort(f)
		return f
	}

	old := deadLetter(10)
	if _, err := a.Run(ctx, archive.Policy{KeepLast: 1}, nil); err != nil { // the first nine leave the stream
		t.Fatal(err)
	}
	for _, dl := range old[:3] { // from the archive
		if err := c.RetryDeadLetter(ctx, ok, dl); err != nil {
			t.Fatalf("retry of archived %s: %v", dl.ID, err)
		}
	}
	if res, err := c.RetryDead(ctx, ok, old[9].ID.String()); err != nil || res.Succeeded != 1 { // live, never archived
		t.Fatalf("retry of live %s: %+v, %v", old[9].ID, res, err)
	}
	time.Sleep(1500 * time.Millisecond)
	recent := deadLetter(10)
	if _, err := a.Run(ctx, archive.Policy{KeepLast: 1}, nil); err != nil {
		t.Fatal(err)
	}
	for _, dl := range recent[:2] { // the oldest the archive will keep, and the next
		if err := c.RetryDeadLetter(ctx, ok, dl); err != nil {
			t.Fatalf("retry of archived %s: %v", dl.ID, err)
		}
	}
	if got := fields(); len(got) != 6 {
		t.Fatalf("retried dead letters on record: %v, want 6", got)
	}
	// A field silt did not write (no branded id) is not its to forget.
	const foreign = "not-a-branded-id"
	if err := e.rdb.HSet(ctx, retried, foreign, "1").Err(); err != nil {
		t.Fatal(err)
	}

	a.HistoryKeepFor = time.Second
	res, err := a.Run(ctx, archive.Policy{KeepLast: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Pruned == 0 || res.RetriedForgotten != 4 {
		t.Fatalf("run with history retention: pruned %d segments, forgot %d retried dead letters; want some, and 4",
			res.Pruned, res.RetriedForgotten)
	}
	want := []string{recent[0].ID.String(), recent[1].ID.String(), foreign}
	if got := fields(); !slices.Equal(got, want) {
		t.Fatalf("retried dead letters on record after the retention: %v, want %v (those the archive keeps, and the field silt did not write)", got, want)
	}
	if err := c.RetryDeadLetter(ctx, ok, recent[0]); !errors.Is(err, stream.ErrRetriedBefore) {
		t.Fatalf("a second retry of %s, still archived: %v, want ErrRetriedBefore", recent[0].ID, err)
	}
	for item, err := range a.Read(ctx, stream.First, stream.Last) {
		if err != nil {
			t.Fatal(err)
		}
		if item.StreamID != recent[0].ID.StreamID {
			t.Fatalf("the oldest dead letter kept is %s, want %s: the test's premise moved", item.StreamID, recent[0].ID.StreamID)
		}
		break
	}
}
