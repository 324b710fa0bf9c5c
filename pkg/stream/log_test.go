package stream_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

func newLog(tb testing.TB) (*stream.Log, *redis.Client) {
	tb.Helper()
	rdb := testserver.Redis(tb).Client(tb)
	ks, err := stream.NewKeyspace("", "cm")
	if err != nil {
		tb.Fatal(err)
	}
	l, err := stream.NewLog(rdb, ks, "events", brand.EVT)
	if err != nil {
		tb.Fatal(err)
	}
	return l, rdb
}

func collect(tb testing.TB, seq func(func(stream.Entry, error) bool)) []stream.Entry {
	tb.Helper()
	var out []stream.Entry
	for e, err := range seq {
		if err != nil {
			tb.Fatalf("read: %v", err)
		}
		out = append(out, e)
	}
	return out
}

func TestLog_AppendAndRead(t *testing.T) {
	l, rdb := newLog(t)
	ctx := context.Background()
	id, err := l.Append(ctx, stream.Fields{"amount": "3", "user": "u1"})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := rdb.XRange(ctx, "emq:{cm}:stream:events", "-", "+").Result()
	if err != nil || len(raw) != 1 {
		t.Fatalf("xrange: %v %v", raw, err)
	}
	if raw[0].ID != id.StreamID.String() || raw[0].Values["id"] != id.String() {
		t.Fatalf("stored %v under %s, want id field %s and stream id %s", raw[0].Values, raw[0].ID, id, id.StreamID)
	}
	got := collect(t, l.Read(ctx, stream.First, stream.Last))
	if len(got) != 1 || got[0].ID != id || got[0].Fields["amount"] != "3" || len(got[0].Fields) != 2 {
		t.Fatalf("read back %+v", got)
	}
}

func TestLog_AppendBatchPagedRead(t *testing.T) {
	l, _ := newLog(t)
	l.PageSize = 7
	l.BatchSize = 64
	ctx := context.Background()
	batch := make([]stream.Fields, 1000)
	for i := range batch {
		batch[i] = stream.Fields{"n": fmt.Sprint(i)}
	}
	ids, err := l.AppendBatch(ctx, batch)
	if err != nil || len(ids) != len(batch) {
		t.Fatalf("AppendBatch: %d ids, %v", len(ids), err)
	}
	got := collect(t, l.Read(ctx, stream.First, stream.Last))
	if len(got) != len(batch) {
		t.Fatalf("read %d entries, want %d", len(got), len(batch))
	}
	for i, e := range got {
		if e.ID != ids[i] || e.Fields["n"] != fmt.Sprint(i) {
			t.Fatalf("entry %d = %v %v, want %v n=%d", i, e.ID, e.Fields, ids[i], i)
		}
		if i > 0 && e.ID.String() <= got[i-1].ID.String() {
			t.Fatalf("entry %d out of mint order", i)
		}
	}
	// A sub-range, inclusive at both ends.
	sub := collect(t, l.Read(ctx, ids[10].StreamID, ids[20].StreamID))
	if len(sub) != 11 || sub[0].ID != ids[10] || sub[10].ID != ids[20] {
		t.Fatalf("sub-range: %d entries", len(sub))
	}
}

func TestLog_AnotherWriterAhead(t *testing.T) {
	l, rdb := newLog(t)
	ctx := context.Background()
	// Another writer puts an entry far in the future.
	future := brand.StreamID{MS: uint64(time.Now().Add(time.Hour).UnixMilli()), Seq: 5}
	fid, _ := brand.New(brand.EVT, future)
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.Key(), ID: future.String(), Values: []string{"id", fid.String()}}).Err(); err != nil {
		t.Fatal(err)
	}
	id, err := l.Append(ctx, stream.Fields{"a": "1"})
	if err != nil {
		t.Fatalf("Append with a writer ahead: %v", err)
	}
	if id.StreamID.Compare(future) <= 0 {
		t.Fatalf("id %s not past the top %s", id.StreamID, future)
	}
	// The same for a batch, after the other writer jumps ahead again.
	future2 := brand.StreamID{MS: future.MS + 1000}
	fid2, _ := brand.New(brand.EVT, future2)
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.Key(), ID: future2.String(), Values: []string{"id", fid2.String()}})
	ids, err := l.AppendBatch(ctx, []stream.Fields{{"a": "2"}, {"a": "3"}})
	if err != nil || len(ids) != 2 || ids[0].StreamID.Compare(future2) <= 0 {
		t.Fatalf("AppendBatch with a writer ahead: %v %v", ids, err)
	}
	if n := rdb.XLen(ctx, l.Key()).Val(); n != 5 {
		t.Fatalf("XLEN = %d, want 5 (nothing half-written, nothing doubled)", n)
	}
}

func TestLog_AppendIDWrongKindSendsNothing(t *testing.T) {
	l, rdb := newLog(t)
	ctx := context.Background()
	before := rdb.InfoMap(ctx, "stats").Item("Stats", "total_commands_processed")
	usr, _ := brand.New(brand.USR, brand.StreamID{MS: 1, Seq: 1})
	err := l.AppendID(ctx, usr, stream.Fields{"a": "1"})
	if !errors.Is(err, stream.ErrWrongKind) || !strings.Contains(err.Error(), usr.String()) {
		t.Fatalf("AppendID(USR) = %v, want ErrWrongKind naming the id", err)
	}
	after := rdb.InfoMap(ctx, "stats").Item("Stats", "total_commands_processed")
	// The second INFO itself is the only command between the two readings.
	if fmt.Sprint(after) != fmt.Sprint(atoi(t, before)+1) {
		t.Fatalf("commands processed went from %s to %s: something was sent", before, after)
	}
	if n := rdb.XLen(ctx, l.Key()).Val(); n != 0 {
		t.Fatalf("XLEN = %d after a refused append", n)
	}
}

func atoi(t *testing.T, s string) int {
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return n
}

func TestLog_ReservedField(t *testing.T) {
	l, _ := newLog(t)
	if _, err := l.Append(context.Background(), stream.Fields{"id": "x"}); !errors.Is(err, stream.ErrReservedField) {
		t.Fatalf("Append with an id field: %v", err)
	}
	if _, err := l.AppendBatch(context.Background(), []stream.Fields{{"a": "1"}, {"id": "x"}}); !errors.Is(err, stream.ErrReservedField) {
		t.Fatalf("AppendBatch with an id field: %v", err)
	}
}

func TestLog_ReadMalformed(t *testing.T) {
	l, rdb := newLog(t)
	ctx := context.Background()
	good, _ := l.Append(ctx, stream.Fields{"a": "1"})
	usr, _ := brand.New(brand.USR, brand.StreamID{MS: good.MS + 4, Seq: 0})
	other, _ := brand.New(brand.EVT, brand.StreamID{MS: 7, Seq: 7})
	for i, v := range [][]string{
		{"a", "no id"},
		{"id", "garbage"},
		{"id", usr.String()},
		{"id", other.String()},
	} {
		sid := brand.StreamID{MS: good.MS + uint64(i) + 1}
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.Key(), ID: sid.String(), Values: v}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	after, _ := l.Append(ctx, stream.Fields{"a": "2"})
	// Beyond a branded id's milliseconds: no id can be derived.
	far := brand.StreamID{MS: brand.MaxMS + 1}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.Key(), ID: far.String(), Values: []string{"a", "far"}}).Err(); err != nil {
		t.Fatal(err)
	}
	var reasons []string
	var ok []brand.ID
	for e, err := range l.Read(ctx, stream.First, stream.Last) {
		var me *stream.MalformedError
		switch {
		case errors.As(err, &me):
			if me.StreamID != e.StreamID || e.StreamID.IsZero() {
				t.Errorf("malformed error for %s carries %s", e.StreamID, me.StreamID)
			}
			reasons = append(reasons, me.Error())
		case err != nil:
			t.Fatal(err)
		default:
			ok = append(ok, e.ID)
		}
	}
	// An entry without an "id" field (another producer's) gets the id its
	// stream id maps to.
	foreign, _ := brand.New(brand.EVT, brand.StreamID{MS: good.MS + 1})
	if len(ok) != 3 || ok[0] != good || ok[1] != foreign || ok[2] != after {
		t.Errorf("good entries %v, want %v %v %v", ok, good, foreign, after)
	}
	want := []string{`"garbage"`, "kind USR", "names 7-7", "cannot be a branded id"}
	if len(reasons) != len(want) {
		t.Fatalf("malformed: %q", reasons)
	}
	for i, w := range want {
		if !strings.Contains(reasons[i], w) || !strings.Contains(reasons[i], l.Key()) {
			t.Errorf("reason %d = %q, want it to contain %q and the key", i, reasons[i], w)
		}
	}
}

func TestLog_ReadWindow(t *testing.T) {
	l, _ := newLog(t)
	ctx := context.Background()
	base := time.UnixMilli(1_800_000_000_000)
	var ids []brand.ID
	for i := range 10 {
		id, _ := brand.New(brand.EVT, brand.StreamID{MS: uint64(base.UnixMilli()) + uint64(i), Seq: 0})
		id2, _ := brand.New(brand.EVT, brand.StreamID{MS: id.MS, Seq: 99})
		for _, x := range []brand.ID{id, id2} {
			if err := l.AppendID(ctx, x, stream.Fields{"i": fmt.Sprint(i)}); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, x)
		}
	}
	got := collect(t, l.ReadWindow(ctx, base.Add(2*time.Millisecond), base.Add(4*time.Millisecond)))
	if len(got) != 6 || got[0].ID != ids[4] || got[5].ID != ids[9] {
		t.Fatalf("window [2ms, 4ms] returned %d entries from %v", len(got), got)
	}
	since := collect(t, l.ReadSince(ctx, base.Add(8*time.Millisecond)))
	if len(since) != 4 || since[0].ID != ids[16] {
		t.Fatalf("since 8ms returned %d entries", len(since))
	}
}

func TestLog_Trim(t *testing.T) {
	l, rdb := newLog(t)
	ctx := context.Background()
	batch := make([]stream.Fields, 300)
	for i := range batch {
		batch[i] = stream.Fields{"n": fmt.Sprint(i)}
	}
	ids, err := l.AppendBatch(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	removed, err := l.TrimMinID(ctx, ids[100].StreamID, true)
	if err != nil || removed != 100 {
		t.Fatalf("exact TrimMinID removed %d, %v; want 100", removed, err)
	}
	first := rdb.XRangeN(ctx, l.Key(), "-", "+", 1).Val()[0].ID
	if first != ids[100].StreamID.String() {
		t.Fatalf("first entry %s, want %s", first, ids[100].StreamID)
	}
	removed, err = l.TrimMaxLen(ctx, 50, false)
	if err != nil || removed < 0 || rdb.XLen(ctx, l.Key()).Val() < 50 {
		t.Fatalf("approx TrimMaxLen removed %d, %v, left %d: must keep at least 50", removed, err, rdb.XLen(ctx, l.Key()).Val())
	}
	removed, err = l.TrimMaxLen(ctx, 50, true)
	if err != nil || rdb.XLen(ctx, l.Key()).Val() != 50 {
		t.Fatalf("exact TrimMaxLen: %d, %v", removed, err)
	}
}

func TestLog_RedisDown(t *testing.T) {
	srv := testserver.Redis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: 1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	ks, _ := stream.NewKeyspace("", "cm")
	l, _ := stream.NewLog(rdb, ks, "events", brand.EVT)
	srv.Stop()
	if _, err := l.Append(context.Background(), stream.Fields{"a": "1"}); err == nil || !strings.Contains(err.Error(), l.Key()) {
		t.Fatalf("Append with redis down: %v, want an error naming the key", err)
	}
	yields := 0
	for _, err := range l.Read(context.Background(), stream.First, stream.Last) {
		yields++
		if err == nil || !strings.Contains(err.Error(), "xrange") {
			t.Fatalf("Read with redis down: %v", err)
		}
	}
	if yields != 1 {
		t.Fatalf("Read with redis down yielded %d times, want one error", yields)
	}
}

// TestLog_ConcurrentWritersKeepChunksWhole runs writers with their own minters
// (as separate processes would have) on one stream: every entry lands once,
// and each chunk's entries are contiguous and in input order.
func TestLog_ConcurrentWritersKeepChunksWhole(t *testing.T) {
	_, rdb := newLog(t)
	ks, _ := stream.NewKeyspace("", "cm")
	ctx := context.Background()
	const writers, chunks, size = 4, 25, 20
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			l, _ := stream.NewLog(rdb, ks, "events", brand.EVT)
			l.BatchSize = size
			l.MaxRetries = 1000
			for c := range chunks {
				batch := make([]stream.Fields, size)
				for i := range batch {
					batch[i] = stream.Fields{"w": fmt.Sprint(w), "c": fmt.Sprint(c), "i": fmt.Sprint(i)}
				}
				if _, err := l.AppendBatch(ctx, batch); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	l, _ := stream.NewLog(rdb, ks, "events", brand.EVT)
	got := collect(t, l.Read(ctx, stream.First, stream.Last))
	if len(got) != writers*chunks*size {
		t.Fatalf("%d entries, want %d", len(got), writers*chunks*size)
	}
	for i := 0; i < len(got); i += size {
		head := got[i].Fields
		for j := range size {
			f := got[i+j].Fields
			if f["w"] != head["w"] || f["c"] != head["c"] || f["i"] != fmt.Sprint(j) {
				t.Fatalf("entry %d = %v: chunk of %v interleaved or reordered", i+j, f, head)
			}
		}
	}
}

// A named replay's checkpoint: absent, set, read back, forgotten; a bad
// name is refused before Redis is asked.
func TestLog_ReplayCheckpoint(t *testing.T) {
	l, _ := newLog(t)
	ctx := context.Background()
	if _, ok, err := l.ReplayCheckpoint(ctx, "audit"); ok || err != nil {
		t.Fatalf("fresh checkpoint: %v %v", ok, err)
	}
	sid := brand.StreamID{MS: 1731000000000, Seq: 10}
	if err := l.SetReplayCheckpoint(ctx, "audit", sid); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := l.ReplayCheckpoint(ctx, "audit"); !ok || err != nil || got != sid {
		t.Fatalf("checkpoint = %v %v %v, want %v", got, ok, err, sid)
	}
	if _, ok, _ := l.ReplayCheckpoint(ctx, "other"); ok {
		t.Fatal("another replay's name sees the checkpoint")
	}
	if err := l.ForgetReplay(ctx, "audit"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := l.ReplayCheckpoint(ctx, "audit"); ok || err != nil {
		t.Fatalf("forgotten checkpoint: %v %v", ok, err)
	}
	if err := l.SetReplayCheckpoint(ctx, "a:b", sid); !errors.Is(err, stream.ErrBadName) {
		t.Fatalf("bad replay name: %v", err)
	}
}

// TestLog_CountLive: the length, entries-added and the live entries at or
// below a stream id, counted past the script's page of 1,000 and after
// deletes and trims; a missing stream counts zeros, a key of another type
// is an error.
func TestLog_CountLive(t *testing.T) {
	l, rdb := newLog(t)
	ctx := context.Background()
	if c, err := l.CountLive(ctx, brand.StreamID{}); err != nil || c != (stream.LiveCount{}) {
		t.Fatalf("missing stream: %+v, %v", c, err)
	}
	batch := make([]stream.Fields, 2500)
	for i := range batch {
		batch[i] = stream.Fields{"n": fmt.Sprint(i)}
	}
	ids, err := l.AppendBatch(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XDel(ctx, l.Key(), ids[5].StreamID.String(), ids[2200].StreamID.String()).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TrimMinID(ctx, ids[10].StreamID, true); err != nil {
		t.Fatal(err)
	}
	// Live: ids[10:] without ids[2200], 2,489 entries; 2,500 added.
	for _, tc := range []struct {
		w     brand.StreamID
		below int64
	}{
		{brand.StreamID{}, 0},      // none asked
		{ids[3].StreamID, 0},       // trimmed already
		{ids[10].StreamID, 1},      // the first live one
		{ids[1009].StreamID, 1000}, // one page exactly
		{ids[1010].StreamID, 1001},
		{ids[2200].StreamID, 2190}, // a deleted id as the bound
		{ids[2499].StreamID, 2489}, // the last
	} {
		c, err := l.CountLive(ctx, tc.w)
		if err != nil {
			t.Fatal(err)
		}
		if want := (stream.LiveCount{Length: 2489, EntriesAdded: 2500, Below: tc.below}); c != want {
			t.Errorf("CountLive(%s) = %+v, want %+v", tc.w, c, want)
		}
	}
	other, err := stream.NewLog(rdb, l.Keyspace(), "not-a-stream", brand.EVT)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, other.Key(), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := other.CountLive(ctx, ids[10].StreamID); err == nil || !strings.Contains(err.Error(), other.Key()) {
		t.Fatalf("a string key: %v, want an error naming %s", err, other.Key())
	}
}
