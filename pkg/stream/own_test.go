package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
)

// readWhole frames a reply however the socket cuts it: one byte a read,
// half of what is asked, the last bytes with io.EOF. Every RESP2 and RESP3
// type is among the replies, nulls and empty aggregates too.
func TestReadWhole_FramesAReplyCutAnywhere(t *testing.T) {
	replies := []string{
		"+OK\r\n",
		"-ERR wrong\r\n",
		":42\r\n",
		"$-1\r\n",
		"*-1\r\n",
		"*0\r\n",
		"$0\r\n\r\n",
		"$5\r\nhe\r\no\r\n", // a CRLF inside a string
		"*2\r\n*2\r\n$3\r\n1-1\r\n*4\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n$0\r\n\r\n*2\r\n$3\r\n1-2\r\n*-1\r\n",
		"%1\r\n$1\r\nk\r\n*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n",
		"~2\r\n,1.5\r\n#t\r\n",
		">2\r\n_\r\n(12345678901234567890\r\n",
		"!3\r\nerr\r\n",
		"=7\r\ntxt:abc\r\n",
	}
	cuts := map[string]func(io.Reader) io.Reader{
		"whole":    func(r io.Reader) io.Reader { return r },
		"one byte": iotest.OneByteReader,
		"halves":   iotest.HalfReader,
		"with EOF": iotest.DataErrReader,
	}
	for _, reply := range replies {
		for name, cut := range cuts {
			for _, start := range []int{0, 1, 64 << 10} {
				got, surplus, err := readWhole(cut(strings.NewReader(reply)), make([]byte, 0, start))
				if err != nil || string(got) != reply || len(surplus) != 0 {
					t.Errorf("%s, buffer of %d: %q read as %q and %q, %v", name, start, reply, got, surplus, err)
				}
			}
		}
	}
}

// What is not a well-formed reply is refused, never returned as one: a
// malformed header, a string not ended by CRLF, a reply cut short by the
// connection.
func TestReadWhole_RepliesInARowAndMalformedOnes(t *testing.T) {
	// Replies one after another (a pipeline's): each read whole, the next
	// one's start handed on.
	two := ":1\r\n*2\r\n$1\r\na\r\n$2\r\nbc\r\n"
	first, rest, err := readWhole(strings.NewReader(two), nil)
	if err != nil || string(first) != ":1\r\n" || string(rest) != two[4:] {
		t.Fatalf("first of two: %q, then %q, %v", first, rest, err)
	}
	second, rest, err := readWhole(strings.NewReader(""), rest)
	if err != nil || string(second) != two[4:] || len(rest) != 0 {
		t.Fatalf("second of two: %q, then %q, %v", second, rest, err)
	}
	for _, bad := range []string{
		"$3\r\nabcd\r\n",
		"*x\r\n",
		"$-2\r\n",
		"?\r\n",
		"+OK\n",
		"*2\r\n$1\r\na\r\n",
		"$10\r\nabc",
	} {
		if got, _, err := readWhole(iotest.OneByteReader(strings.NewReader(bad)), nil); err == nil {
			t.Errorf("%q read as %q, want an error", bad, got)
		}
	}
}

// notPlain is a client that is not a *redis.Client (as a cluster client is
// not): no connection of silt's own can be made from it.
type notPlain struct{ *redis.Client }

// A FlatReader reads what ReadFlat reads: the same entries, fields in
// order, a name added twice twice, over ranges and counts, on a
// connection of its own when the client is a *redis.Client, and through
// ReadFlat when it is not.
func TestFlatReader_ReadsWhatReadFlatReads(t *testing.T) {
	ctx := context.Background()
	rdb := testserver.Redis(t).Client(t)
	for _, c := range []struct {
		name   string
		client Client
		own    bool
	}{{"a *redis.Client", rdb, true}, {"another client", notPlain{rdb}, false}} {
		t.Run(c.name, func(t *testing.T) {
			l := &Log{rdb: c.client, key: "flat-" + strings.ReplaceAll(c.name, " ", "-")}
			var ids []brand.StreamID
			for i := range 2500 {
				values := []any{"id", fmt.Sprintf("EVT_%d", i), "n", fmt.Sprint(i), "big", strings.Repeat("x", i%7*3000)}
				if i%100 == 0 {
					values = append(values, "n", "again")
				}
				id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.key, Values: values}).Result()
				if err != nil {
					t.Fatal(err)
				}
				sid, _ := brand.ParseStreamID(id)
				ids = append(ids, sid)
			}
			r := l.FlatReader()
			defer r.Close()
			last := ids[len(ids)-1]
			for i, q := range []struct {
				from, to brand.StreamID
				count    int64
			}{{ids[0], last, 1000}, {ids[1000], last, 2000}, {ids[7], ids[9], 10}, {last, last, 5}, {ids[3], ids[2], 10}} {
				got, err := r.Read(ctx, q.from, q.to, q.count)
				if err != nil {
					t.Fatal(err)
				}
				want, err := l.ReadFlat(ctx, q.from, q.to, q.count)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != len(want) || !slices.EqualFunc(got, want, func(a, b FlatEntry) bool {
					return a.StreamID == b.StreamID && slices.Equal(a.Pairs, b.Pairs)
				}) {
					t.Fatalf("%s..%s count %d: %d entries, ReadFlat %d, or they differ", q.from, q.to, q.count, len(got), len(want))
				}
				if i == 0 && r.own.conn != nil {
					t.Fatal("a first read dialled a connection: a read of one page needs none")
				}
			}
			if (r.own.conn != nil) != c.own {
				t.Fatalf("own connection in use: %v, want %v", r.own.conn != nil, c.own)
			}
		})
	}
}

// A reader whose connection is killed part way, or answered with an error,
// still reads: the connection is given up and the read goes through
// go-redis (ReadFlat), which says what the server said.
func TestFlatReader_ConnectionLostOrErrorReply(t *testing.T) {
	ctx := context.Background()
	rdb := testserver.Redis(t).Client(t)
	l := &Log{rdb: rdb, key: "lost"}
	var ids []brand.StreamID
	for i := range 300 {
		id := rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.key, Values: []any{"n", fmt.Sprint(i)}}).Val()
		sid, _ := brand.ParseStreamID(id)
		ids = append(ids, sid)
	}
	r := l.FlatReader()
	defer r.Close()
	for i := range 2 { // the second dials
		if got, err := r.Read(ctx, ids[0], ids[299], 100); err != nil || len(got) != 100 || (r.own.conn == nil) != (i == 0) {
			t.Fatalf("read %d: %d, %v, own %v", i, len(got), err, r.own.conn != nil)
		}
	}
	// The server closes the reader's connection.
	if n, err := rdb.ClientKillByFilter(ctx, "ADDR", r.own.conn.nc.LocalAddr().String()).Result(); n != 1 || err != nil {
		t.Fatalf("client kill: %d, %v", n, err)
	}
	got, err := r.Read(ctx, ids[100], ids[299], 100)
	if err != nil || len(got) != 100 || got[0].StreamID != ids[100] || r.own.conn != nil {
		t.Fatalf("read after the connection was lost: %d entries, %v, own %v", len(got), err, r.own.conn != nil)
	}
	// A moment later the reader dials again; until then it reads through
	// ReadFlat.
	if _, err := r.Read(ctx, ids[0], ids[9], 10); err != nil || r.own.conn != nil {
		t.Fatalf("read right after the loss: %v, own %v (dialled again at once)", err, r.own.conn != nil)
	}
	r.own.retryAt = time.Now() // as if ownRedial had passed
	got, err = r.Read(ctx, ids[200], ids[299], 100)
	if err != nil || len(got) != 100 || got[0].StreamID != ids[200] || r.own.conn == nil {
		t.Fatalf("read once the pause is over: %d entries, %v, own %v (not dialled again)", len(got), err, r.own.conn != nil)
	}
	// An error reply is read again through go-redis, whose error names it.
	r2 := l.FlatReader()
	defer r2.Close()
	rdb.Set(ctx, "not-a-stream", "x", 0)
	l2 := &Log{rdb: rdb, key: "not-a-stream"}
	r2.l = l2
	for i := range 2 { // through ReadFlat, then on the reader's connection
		if _, err := r2.Read(ctx, ids[0], ids[1], 10); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Fatalf("read %d of a string key: %v, want WRONGTYPE", i, err)
		}
	}
	if r2.own.conn == nil {
		t.Fatal("an error reply gave the connection up")
	}
	if got, err := r2.Read(ctx, ids[0], ids[299], 1000); err == nil && len(got) != 0 {
		t.Fatalf("%d entries from a string key", len(got))
	}
}

// A cancelled context ends a read the server has not answered at once
// (here all clients are paused), not at the read timeout.
func TestFlatReader_CancelEndsARead(t *testing.T) {
	rdb := testserver.Redis(t).Client(t)
	l := &Log{rdb: rdb, key: "paused"}
	ctx := context.Background()
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.key, Values: []any{"n", "1"}})
	r := l.FlatReader()
	defer r.Close()
	for range 2 { // the second dials
		if _, err := r.Read(ctx, brand.StreamID{}, brand.StreamID{MS: 1 << 50}, 10); err != nil {
			t.Fatal(err)
		}
	}
	if r.own.conn == nil {
		t.Fatal("no connection of its own after two reads")
	}
	if err := rdb.Do(ctx, "CLIENT", "PAUSE", "2000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	defer rdb.Do(ctx, "CLIENT", "UNPAUSE")
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := r.Read(cctx, brand.StreamID{}, brand.StreamID{MS: 1 << 50}, 10)
	if took := time.Since(start); !errors.Is(err, context.Canceled) || took > time.Second {
		t.Fatalf("read under a pause, cancelled after 100ms: %v after %s", err, took)
	}
	if r.own.conn != nil {
		t.Fatal("a connection with a reply due is kept")
	}
}

// An ownSlot dials at first use; after a failure it holds no connection
// until ownRedial has passed, then dials a new one; a dial that fails (a
// cluster client: none to be had) waits as long before the next.
func TestOwnSlot_DialsAgainAfterAPause(t *testing.T) {
	ctx := context.Background()
	rdb := testserver.Redis(t).Client(t)
	var s ownSlot
	defer s.drop()
	first := s.get(ctx, rdb)
	if first == nil || s.get(ctx, rdb) != first {
		t.Fatalf("first use: %v, then %v", first, s.get(ctx, rdb))
	}
	s.fail()
	if c := s.get(ctx, rdb); c != nil {
		t.Fatal("dialled again at once after a failure")
	}
	s.retryAt = time.Now().Add(-time.Millisecond) // as if ownRedial had passed
	again := s.get(ctx, rdb)
	if again == nil || again == first {
		t.Fatalf("after the pause: %v (the first was %v)", again, first)
	}
	if err := again.conn.Ping(ctx).Err(); err != nil {
		t.Fatalf("the new connection: %v", err)
	}
	s.drop()
	if s.get(ctx, rdb) == nil {
		t.Fatal("not dialled after drop")
	}
	var none ownSlot
	if c := none.get(ctx, redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})); c != nil || !none.retryAt.After(time.Now()) {
		t.Fatalf("a cluster client: %v, next dial at %v", c, none.retryAt)
	}
}
