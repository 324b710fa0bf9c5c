package stream_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// A retried append under the same branded id writes the entry once; other
// fields under that id are refused, and so is an id below the top that no
// live entry holds.
func TestLog_AppendIdempotent(t *testing.T) {
	l, rdb := newLog(t)
	ctx := context.Background()
	id := l.Minter().Mint()
	fields := stream.Fields{"order": "o1", "total": "30"}
	for try, want := range []bool{true, false, false} {
		created, err := l.AppendIdempotent(ctx, id, fields)
		if err != nil || created != want {
			t.Fatalf("try %d: created %v, %v; want created %v", try, created, err, want)
		}
	}
	if n := rdb.XLen(ctx, l.Key()).Val(); n != 1 {
		t.Fatalf("XLEN %d after three tries of one append, want 1", n)
	}
	if _, err := l.AppendIdempotent(ctx, id, stream.Fields{"order": "o1", "total": "31"}); !errors.Is(err, stream.ErrIDTaken) {
		t.Fatalf("other fields under a taken id: %v, want ErrIDTaken", err)
	}
	if _, err := l.AppendIdempotent(ctx, id, stream.Fields{"order": "o1"}); !errors.Is(err, stream.ErrIDTaken) {
		t.Fatalf("fewer fields under a taken id: %v, want ErrIDTaken", err)
	}
	below, _ := brand.New(brand.EVT, brand.StreamID{MS: id.StreamID.MS - 1})
	if _, err := l.AppendIdempotent(ctx, below, fields); !errors.Is(err, stream.ErrIDBelowTop) {
		t.Fatalf("an id below the top that no entry holds: %v, want ErrIDBelowTop", err)
	}
	job, _ := brand.New(brand.JOB, brand.StreamID{MS: id.StreamID.MS + 1})
	if _, err := l.AppendIdempotent(ctx, job, fields); !errors.Is(err, stream.ErrWrongKind) {
		t.Fatalf("an id of another kind: %v, want ErrWrongKind", err)
	}
}

// Under WaitReplicas an append returns once a replica holds it, and a
// *NotReplicatedError naming it when none answers in time.
func TestLog_WaitReplicas(t *testing.T) {
	m := testserver.Redis(t, "--repl-diskless-sync-delay", "0")
	_, port, _ := net.SplitHostPort(m.Addr)
	r := testserver.Redis(t, "--replicaof", "127.0.0.1", port)
	ctx := context.Background()
	ks, _ := stream.NewKeyspace("", "cm")
	l, err := stream.NewLog(m.Client(t), ks, "events", brand.EVT)
	if err != nil {
		t.Fatal(err)
	}
	l.WaitReplicas, l.WaitTimeout = 1, 10*time.Second
	if _, err := l.Append(ctx, stream.Fields{"n": "1"}); err != nil {
		t.Fatalf("append with a replica: %v", err)
	}
	if _, err := l.AppendIdempotent(ctx, l.Minter().Mint(), stream.Fields{"n": "2"}); err != nil {
		t.Fatalf("idempotent append with a replica: %v", err)
	}
	r.Stop()
	l.WaitTimeout = 200 * time.Millisecond
	var nr *stream.NotReplicatedError
	if _, err := l.AppendBatch(ctx, []stream.Fields{{"n": "3"}, {"n": "4"}}); !errors.As(err, &nr) || len(nr.IDs) != 2 || nr.Acked != 0 {
		t.Fatalf("batch without its replica: %v, want a NotReplicatedError naming 2 entries", err)
	}
	id := l.Minter().Mint()
	if created, err := l.AppendIdempotent(ctx, id, stream.Fields{"n": "5"}); !errors.As(err, &nr) || !created || nr.IDs[0] != id {
		t.Fatalf("idempotent append without its replica: created %v, %v", created, err)
	}
	if created, err := l.AppendIdempotent(ctx, id, stream.Fields{"n": "5"}); !errors.As(err, &nr) || created {
		t.Fatalf("its retry: created %v, %v; want the entry found, still not replicated", created, err)
	}
}
