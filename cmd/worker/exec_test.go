package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/stream"
)

// An exec handler's process is created before its start is recorded, and
// given its entry after: with Redis refusing writes for a second as the
// batch begins (CLIENT PAUSE WRITE), the process starts at once and its
// entry waits for the record. A worker killed while the process was being
// created counts no start; one killed after its record counts a start for
// a handler that was running.
func TestExecHandler_ProcessIsCreatedBeforeItsStartIsRecorded(t *testing.T) {
	srv := testserver.Redis(t)
	seedModes(t, srv, "a")
	ks, _ := stream.NewKeyspace("", "cm")
	l, err := stream.NewLog(srv.Client(t), ks, "events", brand.EVT)
	if err != nil {
		t.Fatal(err)
	}
	c, err := stream.NewConsumer(l, "g", "w1")
	if err != nil {
		t.Fatal(err)
	}
	c.Block, c.HandlerBegins = 100*time.Millisecond, true
	ctx := context.Background()
	rdb := srv.Client(t)
	const pause = time.Second
	var pausedAt time.Time
	c.Failpoint = func(at failpoint.Name) {
		// The batch of the entry read (not the empty read of the
		// consumer's own pending entries before it).
		if at == failpoint.AfterRead && pausedAt.IsZero() && rdb.XPending(ctx, l.Key(), "g").Val().Count > 0 {
			pausedAt = time.Now()
			if err := rdb.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "WRITE").Err(); err != nil {
				t.Error(err)
			}
		}
	}
	dir := t.TempDir()
	spawned, handled := filepath.Join(dir, "spawned"), filepath.Join(dir, "handled")
	h := execHandler([]string{"sh", "-c", `date +%s%N > ` + spawned + `; cat > ` + handled}, 0, os.Environ(), nil,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	sum, err := c.Run(ctx, h)
	if err != nil || sum.Acked != 1 {
		t.Fatalf("run: %v, summary %+v", err, sum)
	}
	b, _ := os.ReadFile(spawned)
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("spawned %q: %v", b, err)
	}
	if after := time.Unix(0, ns).Sub(pausedAt); after > pause/2 {
		t.Fatalf("the handler's process was created %v after writes were paused for %v: it waited for its start record", after, pause)
	}
	var doc deliveryDoc
	b, _ = os.ReadFile(handled)
	if err := json.Unmarshal(b, &doc); err != nil || doc.Attempts != 1 {
		t.Fatalf("the entry given to the process: %s (%v)", b, err)
	}
}

// worker run --exec records each start when its process exists, on its
// own: no window of first starts is on record while a handler runs (a
// window counts starts ahead of the processes that do them).
func TestRun_ExecStartsAreRecordedOneByOne(t *testing.T) {
	srv := testserver.Redis(t)
	seedModes(t, srv, "a", "b", "c")
	seen := filepath.Join(t.TempDir(), "seen")
	script := `cat > /dev/null; redis-cli -u '` + srv.URL() + `' HLEN 'emq:{cm}:windows:events:g' >> ` + seen
	code, out, errOut := runWorker(t, "", "run", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--group", "g",
		"--block", "100ms", "--exec", script)
	if code != 0 || parseSummary(t, out).Acked != 3 {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	if b, _ := os.ReadFile(seen); strings.Fields(string(b)) == nil || strings.Trim(string(b), "0\n") != "" {
		t.Fatalf("windows of first starts seen by the handlers: %q, want none", b)
	}
}

// A co-process still starting takes one delivery: the others wait for its
// first answer before they are taken, so their starts are not counted
// while it could not have read them (a worker killed then counted one for
// each of --concurrency deliveries it had only queued). Here it takes
// 700 ms to start; while it does, the start records name one entry.
func TestRun_PipeTakesOneDeliveryUntilItsCoprocessAnswers(t *testing.T) {
	srv := testserver.Redis(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	ks, _ := stream.NewKeyspace("", "cm")
	l, _ := stream.NewLog(rdb, ks, "events", brand.EVT)
	batch := make([]stream.Fields, 8)
	for i := range batch {
		batch[i] = stream.Fields{"do": "ok"}
	}
	if _, err := l.AppendBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	windows, attempts := ks.StartWindows("events", "g"), ks.Attempts("events", "g")
	// counted is how many entries have a start on record.
	counted := func() int {
		n := int(rdb.HLen(ctx, attempts).Val())
		if lo, hi, ok := strings.Cut(rdb.HGet(ctx, windows, "w1").Val(), " "); ok && !strings.HasPrefix(lo, "next") {
			n += len(rdb.XRange(ctx, l.Key(), lo, hi).Val())
		}
		return n
	}
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errOut := runWorker(t, "", "run", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--group", "g",
			"--consumer", "w1", "--block", "100ms", "--concurrency", "8", "--pipe", "SILT_TEST_COPROCESS=slowstart '"+os.Args[0]+"'")
		done <- result{code, out, errOut}
	}()
	most := 0
	for start := time.Now(); time.Since(start) < 500*time.Millisecond; time.Sleep(5 * time.Millisecond) {
		most = max(most, counted())
	}
	r := <-done
	if r.code != 0 || parseSummary(t, r.out).Acked != 8 {
		t.Fatalf("exit %d: %s %s", r.code, r.out, r.err)
	}
	if most != 1 {
		t.Fatalf("while the co-process started, %d entries had a start on record, want 1", most)
	}
}
