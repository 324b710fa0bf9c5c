package stream

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// TestReadReply_BothProtocols: an XREADGROUP read from the reply's bytes
// (resp.go) gives what the same read decoded by go-redis (readReply over
// Do, the path after an error reply) and go-redis's own XREADGROUP give,
// on RESP2 and RESP3: new entries with their fields (empty values, a
// name added twice, binary bytes and CRLF inside values, a value of 1 MiB), a pending entry
// deleted from the stream with none, and an empty read (blocking or not)
// as no entries. An XRANGE read from its bytes gives what flatEntries
// gives for Do's reply.
func TestReadReply_BothProtocols(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := context.Background()
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB: many times a read buffer
	for _, proto := range []int{2, 3} {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Protocol: proto})
		defer rdb.Close()
		key := "s" + string(rune('0'+proto))
		if err := rdb.XGroupCreateMkStream(ctx, key, "g", "0").Err(); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for i, f := range [][]any{{"id", "EVT_a", "n", "1"}, {"x", "", "y", "2"}, {"z", "3", "z", "4"}, {"bin", "\x00\r\n$3\r\n*1\xff"}, {"big", big}} {
			id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: f}).Result()
			if err != nil {
				t.Fatalf("xadd %d: %v", i, err)
			}
			ids = append(ids, id)
		}
		read := func(from string, block time.Duration) ([]message, []message) {
			t.Helper()
			args := xreadgroup("g", "c", key, from, 10, block)
			rr := sendRaw(ctx, rdb, 0, args...)
			r, ok := rr.reply()
			if !ok {
				t.Fatalf("RESP%d: read %s: no reply to read from its bytes: %v", proto, from, rr.cmd.Err())
			}
			raw, err := r.messages()
			if err != nil {
				t.Fatalf("RESP%d: read %s from its bytes: %v", proto, from, err)
			}
			decoded, err := readReply(rdb.Do(ctx, args...))
			if err != nil {
				t.Fatalf("RESP%d: read %s through Do: %v", proto, from, err)
			}
			return raw, decoded
		}
		got, _ := read(">", -1)
		want := []Fields{{"id": "EVT_a", "n": "1"}, {"x": "", "y": "2"}, {"z": "4"}, {"bin": "\x00\r\n$3\r\n*1\xff"}, {"big": big}}
		if len(got) != len(want) {
			t.Fatalf("RESP%d: read %d entries, want %d", proto, len(got), len(want))
		}
		for i, m := range got {
			if m.ID != ids[i] || !maps.Equal(m.Fields, want[i]) {
				t.Errorf("RESP%d: entry %d reads %s %.200q, want %s %.200q", proto, i, m.ID, fmt.Sprint(m.Fields), ids[i], fmt.Sprint(want[i]))
			}
		}
		if none, decoded := read(">", 5*time.Millisecond); len(none) != 0 || len(decoded) != 0 {
			t.Fatalf("RESP%d: a read with nothing new (blocking 5ms): %v, %v", proto, none, decoded)
		}
		if none, decoded := read(">", -1); len(none) != 0 || len(decoded) != 0 {
			t.Fatalf("RESP%d: a read with nothing new: %v, %v", proto, none, decoded)
		}
		rdb.XDel(ctx, key, ids[1])
		pending, decoded := read("0", -1)
		if len(pending) != len(want) || pending[1].ID != ids[1] || pending[1].Fields != nil || pending[2].Fields["z"] != "4" || pending[4].Fields["big"] != big {
			t.Fatalf("RESP%d: pending read with one deleted: %.300q", proto, fmt.Sprint(pending))
		}
		theirs, _ := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{key, "0"}, Count: 10, Block: -1}).Result()
		for i, m := range fromXMessages(theirs[0].Messages) {
			for path, other := range map[string]message{"its bytes": pending[i], "Do": decoded[i]} {
				if m.ID != other.ID || !maps.Equal(m.Fields, other.Fields) || (m.Fields == nil) != (other.Fields == nil) {
					t.Errorf("RESP%d: go-redis reads entry %d as %.200q, a read from %s as %.200q", proto, i, fmt.Sprint(m), path, fmt.Sprint(other))
				}
			}
		}
		l := &Log{rdb: rdb, key: key}
		rr := sendRaw(ctx, rdb, 0, "XRANGE", key, "-", "+", "COUNT", 10)
		r, ok := rr.reply()
		if !ok {
			t.Fatalf("RESP%d: XRANGE: no reply to read from its bytes: %v", proto, rr.cmd.Err())
		}
		flat, err := r.flat(key)
		if err != nil {
			t.Fatalf("RESP%d: ReadFlat: %v", proto, err)
		}
		reply, err := rdb.Do(ctx, "XRANGE", key, "-", "+", "COUNT", 10).Slice()
		if err != nil {
			t.Fatal(err)
		}
		fromDo, err := l.flatEntries(reply)
		if err != nil || !reflect.DeepEqual(flat, fromDo) || len(flat) != 4 || len(flat[1].Pairs) != 4 || flat[3].Pairs[1] != big {
			t.Fatalf("RESP%d: XRANGE from its bytes %.300q, through Do %.300q, %v", proto, fmt.Sprint(flat), fmt.Sprint(fromDo), err)
		}
	}
}

// TestReadRaw_ErrorReply: a read the server answers with an error (which
// go-redis does not read as one in a RawCmd) goes again through Do and
// returns go-redis's error: a missing group is NOGROUP, a key of another
// type WRONGTYPE.
func TestReadRaw_ErrorReply(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := context.Background()
	for _, proto := range []int{2, 3} {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Protocol: proto})
		defer rdb.Close()
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: "nogroup", Values: []any{"a", "1"}})
		g := &redisGroup{rdb: rdb, group: "missing", consumer: "c", key: "nogroup"}
		if _, err := g.readPending(ctx, "0", 10); err == nil || !strings.Contains(err.Error(), "NOGROUP") {
			t.Errorf("RESP%d: pending read of a missing group: %v, want NOGROUP", proto, err)
		}
		rdb.Set(ctx, "plain", "x", 0)
		l := &Log{rdb: rdb, key: "plain"}
		if _, err := l.ReadFlat(ctx, First, Last, 10); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Errorf("RESP%d: XRANGE of a string: %v, want WRONGTYPE", proto, err)
		}
		// Acks sent with a read: their error reply is the acks' error.
		g = &redisGroup{rdb: rdb, group: "g", consumer: "c", key: "plain", attempts: "plain-attempts"}
		if _, ackErr, err := g.readNew(ctx, -1, 10, ackSet{ids: []string{"1-1"}, records: []string{"1-1"}}); ackErr == nil || !strings.Contains(ackErr.Error(), "WRONGTYPE") || err != nil {
			t.Errorf("RESP%d: acks on a string key: %v, read %v; want the acks' WRONGTYPE", proto, ackErr, err)
		}
		if g.own.slot.conn == nil {
			t.Errorf("RESP%d: the reads did not go on a connection of their own", proto)
		}
		g.release()
	}
}

// TestReadTimeoutOf: a blocking read goes through Do only with room under
// the client's read timeout, as go-redis applies it.
func TestReadTimeoutOf(t *testing.T) {
	for _, c := range []struct {
		set, want time.Duration
	}{{0, 5 * time.Second}, {-1, 5 * time.Second}, {200 * time.Millisecond, 200 * time.Millisecond}} {
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: c.set})
		if got := readTimeoutOf(rdb); got != c.want {
			t.Errorf("ReadTimeout %v: %v, want %v", c.set, got, c.want)
		}
		rdb.Close()
	}
}
