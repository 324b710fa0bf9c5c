package stream

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// sendOne writes one record on s and waits for its reply.
func sendOne(t *testing.T, s *startSender, key, value string, timeout time.Duration) (ok bool, err error, cancelled bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	reply, ok := s.hset(ctx, cancel, key, "w1", value, func(err error) error { return fmt.Errorf("record %s: %w", value, err) })
	if !ok {
		cancel()
		return false, nil, false
	}
	done := make(chan struct{})
	go func() { err = reply(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout + 5*time.Second):
		t.Fatalf("no outcome for %s %s after %v", key, value, timeout+5*time.Second)
	}
	if again := reply(); again != err {
		t.Fatalf("the reply read twice: %v, then %v", err, again)
	}
	return true, err, ctx.Err() != nil
}

// TestStartSender_RepliesAndFaults: the start sender writes records itself
// on a connection of its own; each outcome reaches the run, and a
// connection that fails is given up (the run then records the usual way)
// rather than waited on.
func TestStartSender_RepliesAndFaults(t *testing.T) {
	srv := testserver.Redis(t)
	rdb := srv.Client(t)
	ctx := context.Background()

	t.Run("records land in order, each answered", func(t *testing.T) {
		s := newStartSender(ctx, rdb)
		if s == nil {
			t.Fatal("no sender on a *redis.Client")
		}
		defer s.close()
		for i := range 50 {
			v := fmt.Sprintf("%d-0 %d-0", i, i+1)
			if ok, err, cancelled := sendOne(t, s, "win", v, time.Second); !ok || err != nil || !cancelled {
				t.Fatalf("record %d: ok=%v err=%v ctx released=%v", i, ok, err, cancelled)
			}
			if got := rdb.HGet(ctx, "win", "w1").Val(); got != v {
				t.Fatalf("after record %d the window holds %q, want %q", i, got, v)
			}
		}
	})

	t.Run("a reply asked for after the write timeout is read", func(t *testing.T) {
		// The handlers of a batch may run longer than the write timeout
		// before the run asks for the reply of its first step.
		s := newStartSender(ctx, rdb)
		defer s.close()
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		reply, ok := s.hset(wctx, cancel, "win-late", "w1", "1-0 2-0", func(err error) error { return err })
		if !ok {
			t.Fatal("not sent")
		}
		time.Sleep(150 * time.Millisecond)
		if err := reply(); err != nil {
			t.Fatalf("a reply in time, read late: %v", err)
		}
		if ok, err, _ := sendOne(t, s, "win-late", "3-0 4-0", time.Second); !ok || err != nil {
			t.Fatalf("the record after: ok=%v err=%v", ok, err)
		}
	})

	t.Run("an error reply is the record's outcome, a Redis error", func(t *testing.T) {
		s := newStartSender(ctx, rdb)
		defer s.close()
		rdb.Set(ctx, "not-a-hash", "x", 0)
		ok, err, _ := sendOne(t, s, "not-a-hash", "1-0 2-0", time.Second)
		if !ok || err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || !strings.Contains(err.Error(), "record 1-0 2-0") || !isReply(err) {
			t.Fatalf("ok=%v err=%v (a Redis error: %v), want the WRONGTYPE reply, wrapped", ok, err, isReply(err))
		}
		// The connection still serves.
		if ok, err, _ := sendOne(t, s, "win2", "3-0 4-0", time.Second); !ok || err != nil {
			t.Fatalf("after an error reply: ok=%v err=%v", ok, err)
		}
	})

	t.Run("a full Redis says OOM", func(t *testing.T) {
		s := newStartSender(ctx, rdb)
		defer s.close()
		used := rdb.Info(ctx, "memory").Val()
		var bytes int64
		for _, l := range strings.Split(used, "\r\n") {
			if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
				fmt.Sscan(v, &bytes)
			}
		}
		rdb.ConfigSet(ctx, "maxmemory", fmt.Sprint(bytes/2))
		defer rdb.ConfigSet(ctx, "maxmemory", "0")
		ok, err, _ := sendOne(t, s, "win3", "5-0 6-0", time.Second)
		if !ok || !isOOM(err) {
			t.Fatalf("ok=%v err=%v, want an OOM reply", ok, err)
		}
	})

	t.Run("a connection killed by the server is given up", func(t *testing.T) {
		s := newStartSender(ctx, rdb)
		defer s.close()
		if ok, err, _ := sendOne(t, s, "win4", "7-0 8-0", time.Second); !ok || err != nil {
			t.Fatalf("first record: ok=%v err=%v", ok, err)
		}
		if err := rdb.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
			t.Fatal(err)
		}
		// The reader sees the close; a write may or may not be the first
		// to learn of it. Either way no record is left without an outcome
		// and the sender stops taking records.
		deadline := time.Now().Add(5 * time.Second)
		for {
			ok, err, _ := sendOne(t, s, "win4", "9-0 10-0", time.Second)
			if !ok {
				break
			}
			if err == nil && time.Now().After(deadline) {
				t.Fatal("records still answered on a killed connection")
			}
		}
	})

	t.Run("a server that stops answering times the record out", func(t *testing.T) {
		s := newStartSender(ctx, rdb)
		defer s.close()
		admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
		defer admin.Close()
		if err := admin.Do(ctx, "CLIENT", "PAUSE", "3000", "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		defer admin.Do(ctx, "CLIENT", "UNPAUSE")
		start := time.Now()
		ok, err, cancelled := sendOne(t, s, "win5", "11-0 12-0", 300*time.Millisecond)
		if took := time.Since(start); !ok || err == nil || !cancelled || took > 2*time.Second {
			t.Fatalf("ok=%v err=%v ctx released=%v after %v, want a timeout near 300ms", ok, err, cancelled, took)
		}
		admin.Do(ctx, "CLIENT", "UNPAUSE")
		if ok, _, _ := sendOne(t, s, "win5", "13-0 14-0", time.Second); ok {
			t.Fatal("a sender whose record timed out took another record on the same connection")
		}
	})
}

// TestStartSender_OnlyOnAClient: a cluster client gets no sender; its
// records wait for their reply.
func TestStartSender_OnlyOnAClient(t *testing.T) {
	if s := newStartSender(context.Background(), redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})); s != nil {
		t.Fatal("a sender on a cluster client")
	}
}
