package stream

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// TestReadReply_BothProtocols: an XREADGROUP decoded once (readReply over
// Do) gives what go-redis's own XREADGROUP gives, on RESP2 and RESP3:
// new entries with their fields, a pending entry deleted from the stream
// with none, and an empty read as no entries.
func TestReadReply_BothProtocols(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := context.Background()
	for _, proto := range []int{2, 3} {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Protocol: proto})
		defer rdb.Close()
		key := "s" + string(rune('0'+proto))
		if err := rdb.XGroupCreateMkStream(ctx, key, "g", "0").Err(); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for i, f := range [][]any{{"id", "EVT_a", "n", "1"}, {"x", "", "y", "2"}, {"z", "3"}} {
			id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: f}).Result()
			if err != nil {
				t.Fatalf("xadd %d: %v", i, err)
			}
			ids = append(ids, id)
		}
		got, err := readReply(rdb.Do(ctx, xreadgroup("g", "c", key, ">", 10, -1)...))
		if err != nil || len(got) != 3 {
			t.Fatalf("RESP%d: read %v, %v", proto, got, err)
		}
		want := []Fields{{"id": "EVT_a", "n": "1"}, {"x": "", "y": "2"}, {"z": "3"}}
		for i, m := range got {
			if m.ID != ids[i] || !maps.Equal(m.Fields, want[i]) {
				t.Errorf("RESP%d: entry %d reads %s %v, want %s %v", proto, i, m.ID, m.Fields, ids[i], want[i])
			}
		}
		if none, err := readReply(rdb.Do(ctx, xreadgroup("g", "c", key, ">", 10, 5*time.Millisecond)...)); err != nil || len(none) != 0 {
			t.Fatalf("RESP%d: a read with nothing new (blocking 5ms): %v, %v", proto, none, err)
		}
		rdb.XDel(ctx, key, ids[1])
		pending, err := readReply(rdb.Do(ctx, xreadgroup("g", "c", key, "0", 10, -1)...))
		if err != nil || len(pending) != 3 || pending[1].ID != ids[1] || pending[1].Fields != nil || pending[2].Fields["z"] != "3" {
			t.Fatalf("RESP%d: pending read with one deleted: %+v, %v", proto, pending, err)
		}
		theirs, _ := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{key, "0"}, Count: 10, Block: -1}).Result()
		for i, m := range fromXMessages(theirs[0].Messages) {
			if m.ID != pending[i].ID || !maps.Equal(m.Fields, pending[i].Fields) || (m.Fields == nil) != (pending[i].Fields == nil) {
				t.Errorf("RESP%d: go-redis reads entry %d as %+v, Do as %+v", proto, i, m, pending[i])
			}
		}
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
