package stream_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// TestConsumer_StartCountedWhenKilledAsTheHandlerStarts: once a start
// record of the run was answered, a batch's first starts are recorded
// without waiting for the reply, and the handler starts as soon as the
// record is written. A worker process SIGKILLed by its handler the instant
// it starts (the reply not read) has its start counted all the same: the
// next run hands the entry over with Attempts 2.
func TestConsumer_StartCountedWhenKilledAsTheHandlerStarts(t *testing.T) {
	if addr := os.Getenv("SILT_KILLED_WORKER_REDIS"); addr != "" {
		killedWorker(t, addr)
		return
	}
	rdb, l, worker := startKilledWorker(t)
	ctx := context.Background()
	first, err := l.Append(ctx, stream.Fields{"kill": "no"})
	if err != nil {
		t.Fatal(err)
	}
	// The first entry is handled and acked (its start record answered),
	// then the second goes out in a batch of its own.
	deadline := time.Now().Add(30 * time.Second)
	for {
		g, err := rdb.XInfoGroups(ctx, l.Key()).Result()
		if err == nil && len(g) == 1 && g[0].LastDeliveredID == first.StreamID.String() && g[0].Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			worker.cmd.Process.Kill()
			t.Fatalf("the worker did not ack the first entry: %v %v", g, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	second, err := l.Append(ctx, stream.Fields{"kill": "yes"})
	if err != nil {
		t.Fatal(err)
	}
	worker.waitKilled(t)
	c, _ := stream.NewConsumer(l, "g", "w1")
	c.Block, c.MaxEntries = time.Millisecond, 1
	var got stream.Delivery
	if _, err := c.Run(ctx, func(_ context.Context, d stream.Delivery) error { got = d; return nil }); err != nil {
		t.Fatal(err)
	}
	if got.ID != second || got.Attempts != 2 {
		t.Fatalf("start not counted: the entry killed at its handler's start comes back as %s with Attempts %d, want %s with 2", got.ID, got.Attempts, second)
	}
}

func killLog(tb testing.TB, rdb *redis.Client) *stream.Log {
	ks, _ := stream.NewKeyspace("", "kill")
	l, err := stream.NewLog(rdb, ks, "events", brand.EVT)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// workerProcess is the test binary run again as killedWorker, by the test
// that starts it.
type workerProcess struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

// startKilledWorker starts a Redis server with killLog's stream and its
// group "g", and the calling test again as the worker process on it
// (killedWorker).
func startKilledWorker(t *testing.T) (*redis.Client, *stream.Log, *workerProcess) {
	t.Helper()
	srv := testserver.Redis(t)
	rdb := srv.Client(t)
	l := killLog(t, rdb)
	if err := rdb.XGroupCreateMkStream(context.Background(), l.Key(), "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	w := &workerProcess{cmd: exec.Command(os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.count", "1")}
	w.cmd.Env = append(os.Environ(), "SILT_KILLED_WORKER_REDIS="+srv.Addr)
	w.cmd.Stdout, w.cmd.Stderr = &w.out, &w.out
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return rdb, l, w
}

// waitKilled waits for the worker process to be SIGKILLed by its handler.
func (w *workerProcess) waitKilled(t *testing.T) {
	t.Helper()
	var exit *exec.ExitError
	if err := w.cmd.Wait(); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the worker was not killed by its handler: %v\n%s", err, w.out.String())
	}
}

// killedWorker is the worker process: it handles entries until one says
// kill, whose handler SIGKILLs the process as its first act.
func killedWorker(t *testing.T, addr string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	c, _ := stream.NewConsumer(killLog(t, rdb), "g", "w1")
	c.Block = time.Minute
	_, err := c.Run(context.Background(), func(_ context.Context, d stream.Delivery) error {
		if d.Fields["kill"] == "yes" {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		return nil
	})
	t.Fatalf("the worker was not killed: %v", err)
}

// Handlers slower than WriteTimeout: the reply of a start record sent
// without waiting is read after the record's own deadline has passed, and
// the run goes on (a reply that came in time is not a timeout).
func TestConsumer_HandlersSlowerThanTheWriteTimeout(t *testing.T) {
	srv := testserver.Redis(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	l := killLog(t, rdb)
	var ids []brand.ID
	for i := range 4 {
		id, err := l.Append(ctx, stream.Fields{"n": fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	c, _ := stream.NewConsumer(l, "g", "w1")
	c.Count, c.Block, c.WriteTimeout = 1, time.Millisecond, 40*time.Millisecond
	var got []stream.Delivery
	sum, err := c.Run(ctx, func(_ context.Context, d stream.Delivery) error {
		time.Sleep(120 * time.Millisecond)
		got = append(got, d)
		return nil
	})
	if err != nil {
		t.Fatalf("run failed with handlers slower than the write timeout: %v", err)
	}
	if sum.Acked != int64(len(ids)) || len(got) != len(ids) {
		t.Fatalf("acked %d, handled %d, want %d each", sum.Acked, len(got), len(ids))
	}
	for i, d := range got {
		if d.ID != ids[i] || d.Attempts != 1 {
			t.Fatalf("delivery %d: %s attempt %d, want %s attempt 1", i, d.ID, d.Attempts, ids[i])
		}
	}
}

// A worker whose read connection (a connection of the run's own) is killed
// by the server part way through a run goes on reading through go-redis:
// the run ends without error, every entry is handled, and an entry whose
// read lost its reply waits in the consumer's pending list, handled by the
// next run. Nothing is lost; nothing acked is handled again.
func TestConsumer_ReadConnectionKilledMidRun(t *testing.T) {
	rdb := testserver.Redis(t).Client(t)
	ctx := context.Background()
	l := killLog(t, rdb)
	batch := make([]stream.Fields, 3000)
	for i := range batch {
		batch[i] = stream.Fields{"n": fmt.Sprint(i)}
	}
	if _, err := l.AppendBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	handled := map[brand.ID]int{}
	killed := int64(0)
	handler := func(_ context.Context, d stream.Delivery) error {
		handled[d.ID]++
		if len(handled) == 1000 && killed == 0 {
			// The reads' connection is the one whose last command is XREADGROUP.
			list, err := rdb.ClientList(ctx).Result()
			if err != nil {
				return err
			}
			for _, line := range strings.Split(list, "\n") {
				if !strings.Contains(line, "cmd=xreadgroup") {
					continue
				}
				for _, f := range strings.Fields(line) {
					if addr, ok := strings.CutPrefix(f, "addr="); ok {
						killed += rdb.ClientKillByFilter(ctx, "ADDR", addr).Val()
					}
				}
			}
		}
		return nil
	}
	c, _ := stream.NewConsumer(l, "g", "w1")
	c.Count, c.Block = 100, time.Millisecond
	sum, err := c.Run(ctx, handler)
	if err != nil {
		t.Fatalf("run with its read connection killed: %v", err)
	}
	if killed == 0 {
		t.Fatal("no read connection was killed")
	}
	c2, _ := stream.NewConsumer(l, "g", "w1") // drains what a lost reply left pending
	c2.Block = time.Millisecond
	sum2, err := c2.Run(ctx, handler)
	if err != nil {
		t.Fatal(err)
	}
	if len(handled) != len(batch) || sum.Acked+sum2.Acked != int64(len(batch)) {
		t.Fatalf("handled %d distinct entries, acked %d + %d, want %d", len(handled), sum.Acked, sum2.Acked, len(batch))
	}
	for id, n := range handled {
		if n != 1 {
			t.Fatalf("%s handled %d times", id, n)
		}
	}
	if n := rdb.XPending(ctx, l.Key(), "g").Val().Count; n != 0 {
		t.Fatalf("%d entries still pending", n)
	}
	t.Logf("killed %d connections; first run acked %d, second %d", killed, sum.Acked, sum2.Acked)
}
