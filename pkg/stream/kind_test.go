package stream_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// xadds returns how many XADD commands the server has run.
func xadds(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	for _, line := range strings.Split(rdb.Info(context.Background(), "commandstats").Val(), "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_xadd:calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			return n
		}
	}
	return 0
}

func TestLog_TheFirstAppendRecordsTheStreamsKind(t *testing.T) {
	l, rdb := newLog(t) // EVT on emq:{cm}:stream:events
	ctx := context.Background()
	ks := l.Keyspace()
	if _, ok, err := stream.StreamKind(ctx, rdb, ks, "events"); err != nil || ok {
		t.Fatalf("a new stream has a kind: ok %v, err %v", ok, err)
	}
	if _, err := l.Append(ctx, stream.Fields{"a": "1"}); err != nil {
		t.Fatal(err)
	}
	if k, ok, err := stream.StreamKind(ctx, rdb, ks, "events"); err != nil || !ok || k != brand.EVT {
		t.Fatalf("kind after the first append: %q %v %v", k, ok, err)
	}
	usr, err := stream.NewLog(rdb, ks, "events", brand.USR)
	if err != nil {
		t.Fatal(err)
	}
	before := xadds(t, rdb)
	_, err = usr.Append(ctx, stream.Fields{"a": "2"})
	if !errors.Is(err, stream.ErrWrongKind) || !strings.Contains(err.Error(), "holds EVT ids") {
		t.Fatalf("USR append into an EVT stream: %v", err)
	}
	if _, err := usr.AppendBatch(ctx, []stream.Fields{{"a": "3"}}); !errors.Is(err, stream.ErrWrongKind) {
		t.Fatalf("USR batch into an EVT stream: %v", err)
	}
	if after := xadds(t, rdb); after != before {
		t.Fatalf("%d XADD sent for refused appends", after-before)
	}
}

// A stream appended to before kinds were recorded takes the kind of its
// first entry.
func TestStreamKind_OlderStreamsByTheirFirstEntry(t *testing.T) {
	_, rdb := newLog(t)
	ctx := context.Background()
	ks, _ := stream.NewKeyspace("", "cm")
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: ks.Stream("jobs"), ID: "1700000000000-0", Values: []string{"id", "JOB_01HF7YAT000000000000000", "a", "1"}})
	k, ok, err := stream.StreamKind(ctx, rdb, ks, "jobs")
	if err != nil || !ok || k != brand.JOB {
		t.Fatalf("kind of an older JOB stream: %q %v %v", k, ok, err)
	}
	evt, _ := stream.NewLog(rdb, ks, "jobs", brand.EVT)
	if _, err := evt.Append(ctx, stream.Fields{"a": "2"}); !errors.Is(err, stream.ErrWrongKind) {
		t.Fatalf("EVT append into an older JOB stream: %v", err)
	}
}
