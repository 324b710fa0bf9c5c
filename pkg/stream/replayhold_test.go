package stream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/stream"
)

// A hold is renewed while it is held, lapses once its process stops
// renewing it (here: the key's TTL left to run out), and a replay that
// lost it cannot move the checkpoint.
func TestHoldReplay_RenewedLapsedAndFenced(t *testing.T) {
	ctx := context.Background()
	l, rdb := newLog(t)
	ids, err := l.AppendBatch(ctx, []stream.Fields{{"n": "0"}, {"n": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := l.HoldReplay(ctx, "fix", 80*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // almost four TTLs
	if _, err := l.HoldReplay(ctx, "fix", 80*time.Millisecond); !errors.Is(err, stream.ErrReplayRunning) {
		t.Fatalf("a second hold while the first is renewed: %v", err)
	}
	if err := a.Checkpoint(ctx, ids[0].StreamID); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A process that took the name and died: its hold lapses after its TTL.
	key := l.Keyspace().ReplayHold(l.Name(), "fix")
	rdb.Set(ctx, key, "gone pid 1 000000000000", 100*time.Millisecond)
	if _, err := l.HoldReplay(ctx, "fix", time.Second); !errors.Is(err, stream.ErrReplayRunning) {
		t.Fatalf("a hold under a dead process's: %v", err)
	}
	time.Sleep(150 * time.Millisecond)
	b, err := l.HoldReplay(ctx, "fix", time.Second)
	if err != nil {
		t.Fatalf("a hold once the dead one lapsed: %v", err)
	}

	// a's hold is long gone: its checkpoint (a replay paused past its TTL)
	// is refused and the one b holds stays.
	if err := a.Checkpoint(ctx, ids[1].StreamID); !errors.Is(err, stream.ErrReplayRunning) {
		t.Fatalf("a checkpoint without the hold: %v", err)
	}
	if err := b.Forget(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Checkpoint(ctx, ids[1].StreamID); !errors.Is(err, stream.ErrReplayRunning) {
		t.Fatalf("a checkpoint without the hold, after the holder forgot it: %v", err)
	}
	if _, ok, err := l.ReplayCheckpoint(ctx, "fix"); err != nil || ok {
		t.Fatalf("checkpoint after b forgot it and a lost its hold: ok %v, %v; want none", ok, err)
	}
	// Once b let go, a's hold is still not a's.
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Checkpoint(ctx, ids[1].StreamID); !errors.Is(err, stream.ErrReplayHoldLost) {
		t.Fatalf("a checkpoint without the hold, when no one holds it: %v", err)
	}
}
