package stream

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/faultproxy"
	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
)

// fillFlat appends n entries of three fields to a new log on rdb.
func fillFlat(tb testing.TB, rdb *redis.Client, n int) *Log {
	tb.Helper()
	ks, _ := NewKeyspace("", "raw")
	l, err := NewLog(rdb, ks, "events", brand.EVT)
	if err != nil {
		tb.Fatal(err)
	}
	batch := make([]Fields, n)
	for i := range batch {
		batch[i] = Fields{"user": fmt.Sprintf("u%06d", i), "action": "login", "amount": fmt.Sprint(i % 1000)}
	}
	if _, err := l.AppendBatch(context.Background(), batch); err != nil {
		tb.Fatal(err)
	}
	return l
}

// TestReadFlat_ReplyBufferSizedFromTheLast: a read's reply is written into
// one buffer sized from the reply before it. A RawCmd's buffer, grown by
// append, costs about five times the reply in allocations (4.9 for these
// entries of three short fields); this read costs the buffer (an eighth to
// spare) and a small reader for each string go-redis copies into it (2.7
// here: the shorter the strings, the more the readers weigh).
func TestReadFlat_ReplyBufferSizedFromTheLast(t *testing.T) {
	rdb := testserver.Redis(t).Client(t)
	l := fillFlat(t, rdb, 1000)
	ctx := context.Background()
	if _, err := l.ReadFlat(ctx, First, Last, 1000); err != nil { // learns the size
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r, ok := sendRaw(ctx, rdb, l.replies.size(1000), "XRANGE", l.key, "-", "+", "COUNT", 1000).reply()
	runtime.ReadMemStats(&after)
	if !ok {
		t.Fatal("raw read failed")
	}
	reply, allocated := len(r.s), after.TotalAlloc-before.TotalAlloc
	t.Logf("reply %d bytes, %d allocated (%.2f times)", reply, allocated, float64(allocated)/float64(reply))
	if allocated > uint64(reply)*7/2 {
		t.Fatalf("a reply of %d bytes allocated %d (%.2f times), want under 3.5 times",
			reply, allocated, float64(allocated)/float64(reply))
	}
}

// proxied is a client of one connection to a fresh redis-server through a
// fault proxy.
func proxied(t *testing.T) (*faultproxy.Proxy, *redis.Client) {
	t.Helper()
	p, err := faultproxy.Start(testserver.Redis(t).Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, PoolSize: 1})
	t.Cleanup(func() { rdb.Close() })
	return p, rdb
}

// TestReadFlat_TornReplyIsReadAgain: a reply the connection loses part
// way (go-redis never retries a read written into a writer) is read again
// whole through Do: the same entries, none torn, none twice, whether the
// cut comes in the first bytes or deep in the reply.
func TestReadFlat_TornReplyIsReadAgain(t *testing.T) {
	p, rdb := proxied(t)
	l := fillFlat(t, rdb, 1000)
	ctx := context.Background()
	want, err := l.ReadFlat(ctx, First, Last, 1000)
	if err != nil || len(want) != 1000 {
		t.Fatalf("read %d entries, %v", len(want), err)
	}
	for i, at := range []int64{1, 4000, 60000} {
		p.CutReplyAfter(at)
		got, err := l.ReadFlat(ctx, First, Last, 1000)
		if cuts := p.Stats().Cut.Load(); cuts != int64(i+1) {
			t.Fatalf("cut after %d bytes: the proxy cut %d replies, want %d", at, cuts, i+1)
		}
		if err != nil || len(got) != len(want) {
			t.Fatalf("cut after %d bytes: read %d entries, %v", at, len(got), err)
		}
		for j := range want {
			if got[j].StreamID != want[j].StreamID || !slices.Equal(got[j].Pairs, want[j].Pairs) {
				t.Fatalf("cut after %d bytes: entry %d reads %v %q, want %v %q", at, j, got[j].StreamID, got[j].Pairs, want[j].StreamID, want[j].Pairs)
			}
		}
	}
}

// TestReplyHint_Bounded: a hint grows with the entries asked for, up to
// maxReplyHint, whatever the count (a count no stream holds included).
func TestReplyHint_Bounded(t *testing.T) {
	var h replyHint
	if n := h.size(1000); n != 0 {
		t.Fatalf("a hint with no reply before is %d, want 0", n)
	}
	h.learn(140_000, 1000)
	for count, want := range map[int64]int{1000: 141 * 1000 * 9 / 8, 0: 0, -5: 0, 1 << 40: maxReplyHint, math.MaxInt64: maxReplyHint} {
		if n := h.size(count); n != want {
			t.Errorf("size(%d) = %d, want %d", count, n, want)
		}
	}
	h.learn(1<<29, 1) // an entry of 512 MB, the most a Redis string holds
	if n := h.size(math.MaxInt64); n != maxReplyHint {
		t.Errorf("size after a huge entry = %d, want %d", n, maxReplyHint)
	}
}

// TestReplyHint_LikeLast: a read sized like the last reply asks for room
// for twice the entries that reply held, at most the count asked for, and
// a reply that held none (a blocking read that timed out) changes nothing.
func TestReplyHint_LikeLast(t *testing.T) {
	var h replyHint
	if n := h.sizeLikeLast(100); n != 0 {
		t.Fatalf("a hint with no reply before is %d, want 0", n)
	}
	h.learn(140_000, 1000)
	if n, want := h.sizeLikeLast(1000), h.size(1000); n != want {
		t.Fatalf("after a full batch of 1,000: %d, want %d (room for the batch)", n, want)
	}
	h.learn(150, 1) // caught up: an entry a read
	if n, want := h.sizeLikeLast(100), 151*2*9/8; n != want {
		t.Fatalf("after a reply of one entry: %d, want %d (two entries' room, not a batch's)", n, want)
	}
	h.learn(0, 0)
	if n, want := h.sizeLikeLast(100), 151*2*9/8; n != want {
		t.Fatalf("after an empty reply: %d, want %d (as before it)", n, want)
	}
	h.learn(1500, 10)
	if n, want := h.sizeLikeLast(5), 151*5*9/8; n != want {
		t.Fatalf("asking for fewer than twice the last reply's: %d, want %d (the count asked for)", n, want)
	}
}

// TestReadNew_TornReplyIsSentAgain: a read that carries the acks of the
// batch before (one pipeline, which go-redis never retries once it holds
// a raw read) and loses its reply part way is sent again, acks and read
// (the first cut is on the read's connection of its own, the others on
// go-redis's), and nothing is lost: the acks land, and every entry is either read or
// pending for the consumer (a read whose reply was lost delivered its
// entries all the same), none read twice.
func TestReadNew_TornReplyIsSentAgain(t *testing.T) {
	p, rdb := proxied(t)
	const total = 3000
	l := fillFlat(t, rdb, total)
	ctx := context.Background()
	if err := rdb.XGroupCreate(ctx, l.key, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	g := newRedisGroup(l, nil, "g", "c")
	read := map[string]bool{}
	var acked []string
	var acks ackSet
	cuts := []int64{1, 2000, 30000} // in the acks' reply, early in the read's, deep in it
	for round := 0; ; round++ {
		if round >= 1 && round <= len(cuts) {
			p.CutReplyAfter(cuts[round-1])
		}
		msgs, ackErr, err := g.readNew(ctx, -1, 500, acks)
		if err != nil || ackErr != nil {
			t.Fatalf("round %d: read %v, acks %v", round, err, ackErr)
		}
		if round >= 1 && round <= len(cuts) && p.Stats().Cut.Load() != int64(round) {
			t.Fatalf("round %d: the proxy cut %d replies, want %d", round, p.Stats().Cut.Load(), round)
		}
		// The first cut is on the read's connection of its own, the others
		// on go-redis's, once that connection is given up.
		if own := g.own.slot.conn != nil; own != (round == 0) {
			t.Fatalf("round %d: reading on a connection of its own: %v", round, own)
		}
		acked = append(acked, acks.ids...)
		acks = ackSet{}
		for _, m := range msgs {
			if read[m.ID] {
				t.Fatalf("round %d: %s read twice", round, m.ID)
			}
			read[m.ID] = true
			acks.ids = append(acks.ids, m.ID)
		}
		if len(msgs) == 0 {
			break
		}
	}
	pending, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: l.key, Group: "g", Start: "-", End: "+", Count: total}).Result()
	if err != nil {
		t.Fatal(err)
	}
	isPending := map[string]bool{}
	for _, e := range pending {
		isPending[e.ID] = true
	}
	for _, id := range acked {
		if isPending[id] {
			t.Fatalf("%s was acked and is still pending", id)
		}
	}
	lost := 0
	for _, id := range rdb.XRange(ctx, l.key, "-", "+").Val() {
		switch {
		case read[id.ID] && isPending[id.ID] && !slices.Contains(acks.ids, id.ID):
			t.Fatalf("%s was read and acked, and is pending", id.ID)
		case !read[id.ID] && !isPending[id.ID]:
			t.Fatalf("%s was neither read nor left pending", id.ID)
		case !read[id.ID]:
			lost++ // delivered by a read whose reply was cut: pending, reclaimed later
		}
	}
	t.Logf("%d read, %d delivered by reads whose reply was cut (pending), %d cuts", len(read), lost, p.Stats().Cut.Load())
	if lost == 0 {
		t.Fatal("no read lost its reply: the cuts missed the reads")
	}
}
