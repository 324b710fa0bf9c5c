package archive_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/stream"
)

type env struct {
	rdb   *redis.Client
	log   *stream.Log
	store fence.Store
}

func newEnv(t *testing.T) *env {
	t.Helper()
	st, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return newEnvOn(t, st)
}

// newEnvOn is an env with its own redis-server and the given remote.
func newEnvOn(t *testing.T, st fence.Store) *env {
	t.Helper()
	rdb := testserver.Redis(t).Client(t)
	ks, _ := stream.NewKeyspace("", "cm")
	l, err := stream.NewLog(rdb, ks, "events", brand.EVT)
	if err != nil {
		t.Fatal(err)
	}
	return &env{rdb: rdb, log: l, store: st}
}

func (e *env) open(t *testing.T) *archive.Archive {
	t.Helper()
	a, err := archive.Open(context.Background(), e.log, t.TempDir(), e.store)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func (e *env) appendN(t *testing.T, n int) []brand.ID {
	t.Helper()
	batch := make([]stream.Fields, n)
	for i := range batch {
		batch[i] = stream.Fields{"n": fmt.Sprint(i), "pad": "xxxxxxxxxxxxxxxx"}
	}
	ids, err := e.log.AppendBatch(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// history reads the merged history and checks it is exactly want, in order.
func history(t *testing.T, a *archive.Archive, from, to brand.StreamID) (ids []brand.ID, fromArchive int) {
	t.Helper()
	for it, err := range a.Read(context.Background(), from, to) {
		if err != nil && !errors.Is(err, stream.ErrMalformed) {
			t.Fatalf("read: %v", err)
		}
		ids = append(ids, it.ID)
		if it.Source == archive.SourceArchive {
			fromArchive++
		}
	}
	return ids, fromArchive
}

// A run folds its first slice while it refreshes the remote, from the
// state its volume held before. When the refresh finds commits the volume
// had not seen (a peer's), that fold is dropped and the slice is folded
// again after them: the history holds every entry once, in order, and the
// newest KeepLast stay live.
func TestRun_FirstFoldRedoneAfterAPeersCommits(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	ids := e.appendN(t, 200)
	stale, peer := e.open(t), e.open(t) // both opened before any commit
	peer.SliceEntries = 50              // Exact false: its trim leaves archived entries live
	stale.SliceEntries, stale.Exact = 50, true
	if res, err := peer.Run(ctx, archive.Policy{KeepLast: 120}, nil); err != nil || res.Archived != 80 {
		t.Fatalf("the peer's run: %+v, %v", res, err)
	}
	ids = append(ids, e.appendN(t, 30)...)
	res, err := stale.Run(ctx, archive.Policy{KeepLast: 20}, nil)
	if err != nil || res.Archived != 130 || res.LostRaces != 0 {
		t.Fatalf("the run of a volume opened before the peer's commits: %+v, %v; want 130 archived after the peer's 80, no race lost", res, err)
	}
	got, fromArchive := history(t, e.open(t), stream.First, stream.Last)
	if !slices.Equal(got, ids) || fromArchive != 210 {
		t.Fatalf("history: %d entries (%d from the archive), want the %d appended once each, in order, 210 of them archived", len(got), fromArchive, len(ids))
	}
	if n := xlen(t, e); n != 20 {
		t.Fatalf("%d live, want the newest 20", n)
	}
	st, err := e.open(t).Status(ctx, "")
	if err != nil || st.Archived != 210 || st.LostOutside != 0 {
		t.Fatalf("status: %+v, %v; want 210 archived, none lost", st, err)
	}
}

// A slice is folded while the one before uploads, before that one's trim,
// so the count of live entries below the watermark is carried from slice to
// slice: with approximate trims (which leave some archived entries live) and
// entries deleted by someone else during the run, the newest KeepLast are
// still never archived, and with neither exactly the rest are.
func TestRun_KeepLastAcrossFoldsAhead(t *testing.T) {
	for _, deleting := range []bool{false, true} {
		e := newEnv(t)
		ids := e.appendN(t, 5000)
		a := e.open(t)
		a.SliceEntries = 300 // Exact false: XTRIM ~ keeps whole nodes of archived entries
		ctx := context.Background()
		deleted := 0
		res, err := a.Run(ctx, archive.Policy{KeepLast: 1000}, func(r archive.Result) {
			if deleting && deleted < 50 { // an operator deletes unarchived entries mid-run
				w, _ := brand.ParseStreamID(r.W)
				for _, id := range ids[:4000] {
					if id.StreamID.Compare(w) > 0 {
						deleted += int(e.rdb.XDel(ctx, e.log.Key(), id.StreamID.String()).Val())
						break
					}
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		w, _ := brand.ParseStreamID(res.W)
		if w.Compare(ids[3999].StreamID) > 0 {
			t.Fatalf("deleting=%v: watermark %s is above the 4000th entry: the newest 1000 were not all kept live", deleting, w)
		}
		if !deleting && (res.Archived != 4000 || w != ids[3999].StreamID) {
			t.Fatalf("result %+v, want 4000 archived up to %s", res, ids[3999].StreamID)
		}
		// (An entry deleted after the slice folded ahead read it is archived.)
		if deleting && (deleted == 0 || res.Archived > 4000) {
			t.Fatalf("deleted %d, result %+v", deleted, res)
		}
		live, _ := e.log.ReadRaw(ctx, ids[4000].StreamID, stream.Last, 2000)
		if len(live) != 1000 {
			t.Fatalf("deleting=%v: %d of the newest 1000 entries live", deleting, len(live))
		}
	}
}

// The count of live entries at or below the watermark that folds carry is
// taken again once someone else removes an entry: here an archived entry
// not yet trimmed, which leaves the carried count one high. The run still
// archives up to the KeepLast boundary, not one short of it.
func TestRun_KeepLastCountedAgainAfterAnotherRemoves(t *testing.T) {
	e := newEnv(t)
	ids := e.appendN(t, 5000)
	a := e.open(t)
	a.SliceEntries, a.Exact = 300, true
	ctx := context.Background()
	removed := int64(0)
	res, err := a.Run(ctx, archive.Policy{KeepLast: 1000}, func(r archive.Result) {
		if removed > 0 || r.Commits < 3 {
			return
		}
		first, err := e.rdb.XRangeN(ctx, e.log.Key(), "-", "+", 1).Result()
		if err != nil || len(first) != 1 {
			t.Fatalf("first live entry: %v %v", first, err)
		}
		if id, _ := brand.ParseStreamID(first[0].ID); id.Compare(ids[3999].StreamID) >= 0 {
			t.Fatalf("first live entry %s is past the boundary", id)
		}
		removed = e.rdb.XDel(ctx, e.log.Key(), first[0].ID).Val()
	})
	if err != nil {
		t.Fatal(err)
	}
	if removed != 1 {
		t.Fatalf("removed %d entries mid-run, want 1", removed)
	}
	if res.W != ids[3999].StreamID.String() {
		t.Fatalf("result %+v: watermark %s, want the KeepLast boundary %s", res, res.W, ids[3999].StreamID)
	}
	if n := e.rdb.XLen(ctx, e.log.Key()).Val(); n != 1000 {
		t.Fatalf("XLEN %d after the run, want 1000", n)
	}
}

// A run reads each entry it archives once: the count of live entries at or
// below the watermark is carried from fold to fold while no one else
// removes an entry, not read again on the server (stream.CountLive scans
// every live entry at or below W, two slices of them in flight, in a script
// that blocks Redis for producers and workers meanwhile). Redis's own
// command counts say how many XRANGEs the run sent, its scripts' included.
func TestRun_ReadsEachEntryOnce(t *testing.T) {
	e := newEnv(t)
	e.appendN(t, 20001)
	a := e.open(t)
	a.SliceEntries, a.Exact = 2000, true
	ctx := context.Background()
	before := xrangeCalls(t, e.rdb)
	res, err := a.Run(ctx, archive.Policy{KeepLast: 1}, nil)
	if err != nil || res.Archived != 20000 || res.Commits != 10 {
		t.Fatalf("run %+v %v", res, err)
	}
	// 2 XRANGEs of 1,000 a slice: 20. A count taken again would add 2-4
	// for each fold that took it.
	if n := xrangeCalls(t, e.rdb) - before; n != 20 {
		t.Fatalf("the run sent %d XRANGEs for 10 slices of 2,000, want 20", n)
	}
}

// xrangeCalls is how many XRANGEs the server has run, from scripts too.
func xrangeCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_xrange:calls="); ok {
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

func TestRun_KeepLastFoldsBeforeTrim(t *testing.T) {
	e := newEnv(t)
	ids := e.appendN(t, 5000)
	a := e.open(t)
	a.SliceEntries, a.Exact = 700, true
	ctx := context.Background()
	res, err := a.Run(ctx, archive.Policy{KeepLast: 1000}, func(r archive.Result) {
		// After every commit: nothing above the watermark has left the stream.
		w, _ := brand.ParseStreamID(r.W)
		next, _ := w.Next()
		live, _ := e.log.ReadRaw(ctx, next, stream.Last, 10000)
		for _, id := range ids {
			if id.StreamID.Compare(w) > 0 {
				if len(live) == 0 || live[0].StreamID != id.StreamID {
					t.Fatalf("entry %s above the watermark %s is not live", id.StreamID, w)
				}
				break
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Archived != 4000 || res.Commits != 6 || res.Trimmed != 4000 || res.W != ids[3999].StreamID.String() {
		t.Fatalf("result %+v", res)
	}
	if n := e.rdb.XLen(ctx, e.log.Key()).Val(); n != 1000 {
		t.Fatalf("XLEN %d, want 1000", n)
	}
	got, fromArchive := history(t, a, stream.First, stream.Last)
	if len(got) != 5000 || fromArchive != 4000 {
		t.Fatalf("merged read: %d entries, %d from the archive", len(got), fromArchive)
	}
	for i := range got {
		if got[i] != ids[i] {
			t.Fatalf("entry %d = %s, want %s", i, got[i], ids[i])
		}
	}
	st, err := a.Status(ctx, t.TempDir())
	if err != nil || !st.Complete || st.Archived != 4000 || st.LiveUnarchived != 1000 || st.EntriesAdded != 5000 {
		t.Fatalf("status %+v %v", st, err)
	}
	// A second run has nothing to do.
	if res, err := a.Run(ctx, archive.Policy{KeepLast: 1000}, nil); err != nil || res.Archived != 0 {
		t.Fatalf("second run %+v %v", res, err)
	}
}

func TestRun_KeepForAndWindows(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	old := time.Now().Add(-2 * time.Hour)
	m := e.log.Minter()
	m.Now = func() time.Time { return old }
	oldIDs := e.appendN(t, 300)
	m.Now = time.Now
	newIDs := e.appendN(t, 50)
	a := e.open(t)
	res, err := a.Run(ctx, archive.Policy{KeepFor: time.Hour}, nil)
	if err != nil || res.Archived != 300 {
		t.Fatalf("keep-for: %+v %v", res, err)
	}
	got, fromArchive := history(t, a, brand.WindowStart(old), brand.WindowEnd(time.Now()))
	if len(got) != 350 || fromArchive != 300 || got[300] != newIDs[0] || got[0] != oldIDs[0] {
		t.Fatalf("window read: %d, %d from archive", len(got), fromArchive)
	}
	// A range inside the archive, both edges inclusive.
	got, _ = history(t, a, oldIDs[10].StreamID, oldIDs[20].StreamID)
	if len(got) != 11 || got[0] != oldIDs[10] || got[10] != oldIDs[20] {
		t.Fatalf("archive sub-range: %v", got)
	}
	// Get from both sides.
	for _, id := range []brand.ID{oldIDs[123], newIDs[7]} {
		it, err := a.Get(ctx, id.StreamID)
		if err != nil || it.ID != id {
			t.Fatalf("Get(%s) = %v %v", id, it.ID, err)
		}
	}
}

func TestRun_MalformedArchivedAsIs(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ids := e.appendN(t, 3)
	bad := brand.StreamID{MS: ids[2].MS + 1}
	e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.log.Key(), ID: bad.String(), Values: []string{"id", "garbage", "k", "v"}})
	e.appendN(t, 2)
	a := e.open(t)
	res, err := a.Run(ctx, archive.Policy{KeepLast: 1}, nil)
	if err != nil || res.Archived != 5 || res.Malformed != 1 {
		t.Fatalf("run %+v %v", res, err)
	}
	var malformed []stream.Entry
	for it, err := range a.Read(ctx, stream.First, stream.Last) {
		var me *stream.MalformedError
		if errors.As(err, &me) {
			if me.RawID != "garbage" || it.Source != archive.SourceArchive {
				t.Fatalf("malformed %+v from %s", me, it.Source)
			}
			malformed = append(malformed, it.Entry)
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if len(malformed) != 1 || malformed[0].StreamID != bad || malformed[0].Fields["k"] != "v" {
		t.Fatalf("malformed entries %+v", malformed)
	}
}

func TestRun_NoPolicy(t *testing.T) {
	e := newEnv(t)
	if _, err := e.open(t).Run(context.Background(), archive.Policy{}, nil); !errors.Is(err, archive.ErrNoPolicy) {
		t.Fatalf("Run without a policy: %v", err)
	}
}

func TestRun_ConcurrentArchiversKeepOneHistory(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ids := e.appendN(t, 3000)
	var lost atomic.Int64
	for round := range 3 {
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a := e.open(t)
				a.SliceEntries = 50
				res, err := a.Run(ctx, archive.Policy{KeepLast: int64(2000 - 900*round)}, nil)
				if err != nil {
					t.Error(err)
				}
				lost.Add(res.LostRaces)
			}()
		}
		wg.Wait()
	}
	if lost.Load() == 0 {
		t.Fatal("no lost race observed: the archivers did not really race")
	}
	a := e.open(t)
	got, fromArchive := history(t, a, stream.First, stream.Last)
	if len(got) != 3000 || fromArchive != 3000-200 {
		t.Fatalf("%d entries, %d from the archive", len(got), fromArchive)
	}
	for i := range got {
		if got[i] != ids[i] {
			t.Fatalf("entry %d = %s, want %s", i, got[i], ids[i])
		}
	}
	if _, err := a.Volume().VerifyRemote(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d lost races", lost.Load())
}

// TestStatus_WhileArchiving: Status read while an archiver commits and
// trims in a loop and a producer appends always accounts for every entry:
// nothing reads as lost outside silt, the stream never reads as recreated.
func TestStatus_WhileArchiving(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel, before the server stops
	defer cancel()
	e.appendN(t, 2000)
	wg.Add(2)
	go func() { // producer
		defer wg.Done()
		for ctx.Err() == nil {
			e.log.AppendBatch(ctx, []stream.Fields{{"k": "v"}, {"k": "w"}})
			time.Sleep(time.Millisecond)
		}
	}()
	archiver := e.open(t)
	archiver.SliceEntries = 37
	var runs atomic.Int64
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if _, err := archiver.Run(ctx, archive.Policy{KeepLast: 100}, nil); err == nil {
				runs.Add(1)
			}
		}
	}()
	reader := e.open(t)
	dir := t.TempDir()
	reads := 300
	if testing.Short() {
		reads = 60
	}
	moved, unsettled := 0, 0 // reads that saw the archive move on; that read no one view
	last := int64(-1)
	for r := range reads {
		st, err := reader.Status(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Settled {
			unsettled++
		}
		if (st.Settled && !st.Complete) || st.LostOutside != 0 || st.Recreated {
			t.Fatalf("status read %d while archiving: %d lost outside, recreated %v, complete %v (%+v)", r, st.LostOutside, st.Recreated, st.Complete, st)
		}
		if st.Archived != last {
			moved++
		}
		last = st.Archived
	}
	cancel()
	if moved < 3 {
		t.Fatalf("the archive moved %d times across %d status reads (%d runs): nothing raced", moved, reads, runs.Load())
	}
	if unsettled > reads/2 {
		t.Fatalf("%d of %d status reads read no one view", unsettled, reads)
	}
	t.Logf("%d status reads, the archive moved in %d, %d runs, %d reads unsettled", reads, moved, runs.Load(), unsettled)
}

// TestRead_WhileArchiving: random-range merged reads while an archiver
// commits and trims in a loop and a producer appends: no gap, no duplicate,
// order kept.
func TestRead_WhileArchiving(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel, before the server stops
	defer cancel()
	var mu sync.Mutex
	ids := e.appendN(t, 2000)
	batch := []stream.Fields{{"k": "v"}, {"k": "w"}}
	wg.Add(2)
	go func() { // producer
		defer wg.Done()
		for ctx.Err() == nil {
			more, _ := e.log.AppendBatch(ctx, batch)
			mu.Lock()
			ids = append(ids, more...)
			mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}()
	archiver := e.open(t)
	archiver.SliceEntries = 37
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			archiver.Run(ctx, archive.Policy{KeepLast: 100}, nil)
		}
	}()
	reader := e.open(t)
	rng := rand.New(rand.NewPCG(7, 7))
	reads := 10000
	switch {
	case testing.Short():
		reads = 300
	case raceEnabled: // 10,000 took 20 to 30 minutes under -race on two cores
		reads = 1500
	}
	fromArchive := 0
	for r := range reads {
		mu.Lock()
		known := ids[:len(ids):len(ids)]
		mu.Unlock()
		i := rng.IntN(len(known))
		j := i + rng.IntN(min(len(known)-i, 150))
		got, fa := history(t, reader, known[i].StreamID, known[j].StreamID)
		fromArchive += fa
		want := known[i : j+1]
		if len(got) < len(want) {
			t.Fatalf("read %d [%d, %d]: %d entries, want %d (a gap)", r, i, j, len(got), len(want))
		}
		for k := range want {
			if got[k] != want[k] {
				t.Fatalf("read %d: entry %d = %s, want %s", r, k, got[k], want[k])
			}
		}
	}
	if fromArchive == 0 {
		t.Fatal("no read touched the archive")
	}
	t.Logf("%d reads, %d entries from the archive", reads, fromArchive)
}

func TestPayload_RecoversTrimmedPendingEntries(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ids := e.appendN(t, 10)
	c, _ := stream.NewConsumer(e.log, "g", "w1")
	c.Block = 50 * time.Millisecond
	c.EnsureGroup(ctx)
	// All ten are delivered (so the group does not lag behind the trim), then
	// the first five are trimmed while pending.
	e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "w1", Streams: []string{e.log.Key(), ">"}, Count: 10})
	a := e.open(t)
	a.Exact = true
	if _, err := a.Run(ctx, archive.Policy{KeepLast: 5}, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Payload(ctx, ids[9].StreamID); !errors.Is(err, stream.ErrPayloadNotFound) {
		t.Fatalf("Payload of a live entry: %v", err)
	}
	c.Payloads = a
	var recovered []brand.ID
	sum, err := c.Run(ctx, func(_ context.Context, d stream.Delivery) error {
		if d.Recovered {
			recovered = append(recovered, d.ID)
		}
		return nil
	})
	if err != nil || sum.PayloadRecovered != 5 || sum.PayloadLost != 0 || sum.Acked != 10 || sum.Drained != 10 {
		t.Fatalf("summary %+v %v", sum, err)
	}
	if len(recovered) != 5 || recovered[0] != ids[0] {
		t.Fatalf("recovered %v", recovered)
	}
}

func TestVolumeName(t *testing.T) {
	a, _ := stream.NewKeyspace("emq", "a.b")
	b, _ := stream.NewKeyspace("emq", "a")
	if archive.VolumeName(a, "c") == archive.VolumeName(b, "b.c") {
		t.Fatal("two streams share a volume name")
	}
	if got := archive.VolumeName(b, "events"); got != "emq.a.events" {
		t.Fatalf("VolumeName = %q", got)
	}
	if err := fence.CheckKey(archive.VolumeName(a, "x_y")); err != nil {
		t.Fatal(err)
	}
}

// TestCatchUp_GroupBehindRetention: a group that never read entries the
// archiver trimmed gets them from the archive, also after a crash mid
// catch-up (simulated by a handler that fails once), with no loss.
func TestCatchUp_GroupBehindRetention(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c, _ := stream.NewConsumer(e.log, "slow", "w1")
	c.EnsureGroup(ctx)
	ids := e.appendN(t, 500)
	a := e.open(t)
	a.Exact = true
	if _, err := a.Run(ctx, archive.Policy{KeepLast: 50}, nil); err != nil {
		t.Fatal(err)
	}
	more := e.appendN(t, 20)
	ids = append(ids, more...)
	seen := map[brand.ID]int{}
	failOnce := ids[200]
	handler := func(_ context.Context, d stream.Delivery) error {
		if d.ID == failOnce {
			failOnce = brand.ID{}
			return errors.New("transient")
		}
		seen[d.ID]++
		return nil
	}
	for run := range 3 {
		c, _ := stream.NewConsumer(e.log, "slow", "w1")
		c.Block = 50 * time.Millisecond
		c.Count = 64
		c.Payloads = a
		sum, err := c.Run(ctx, handler)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("run %d: %+v", run, sum)
	}
	for i, id := range ids {
		if seen[id] == 0 {
			t.Fatalf("entry %d (%s) never handled", i, id)
		}
	}
	if n := e.rdb.LLen(ctx, "emq:{cm}:catchup:events:slow").Val(); n != 0 {
		t.Fatalf("%d gaps left", n)
	}
}

// A group whose unread entries were all archived and trimmed, leaving the
// stream empty, is caught up on its next run, without waiting for a new
// append; a run without the archive counts the gap (trimmed_unread), and
// a later run with it catches the group up, each entry once.
func TestCatchUp_EmptyStream(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c, _ := stream.NewConsumer(e.log, "late", "w1")
	c.EnsureGroup(ctx)
	ids := e.appendN(t, 70)
	a := e.open(t)
	a.Exact = true
	time.Sleep(2 * time.Millisecond)
	if _, err := a.Run(ctx, archive.Policy{KeepFor: time.Millisecond}, nil); err != nil {
		t.Fatal(err)
	}
	if n := xlen(t, e); n != 0 {
		t.Fatalf("stream holds %d after archiving everything", n)
	}
	seen := map[brand.ID]int{}
	handler := func(_ context.Context, d stream.Delivery) error { seen[d.ID]++; return nil }
	newConsumer := func(history bool) *stream.Consumer {
		c, _ := stream.NewConsumer(e.log, "late", "w1")
		c.Block = 50 * time.Millisecond
		if history {
			c.Payloads = a
		}
		return c
	}
	sum, err := newConsumer(false).Run(ctx, handler)
	if err != nil || sum.TrimmedUnread != 70 || len(seen) != 0 {
		t.Fatalf("run without the archive: %+v, %v, handled %d; want the 70 counted as trimmed unread", sum, err, len(seen))
	}
	for range 2 {
		if _, err := newConsumer(true).Run(ctx, handler); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range ids {
		if seen[id] != 1 {
			t.Fatalf("entry %d (%s) handled %d times, want once", i, id, seen[id])
		}
	}
}

// A slice is read in chunks of 1,000 entries: slices larger than a chunk, and
// a byte bound that falls inside a chunk, still commit exactly what they say.
func TestRun_SlicesSpanReadChunks(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name           string
		entries, bytes int64
		want           []uint64 // pages per commit
	}{
		{"entries", 2500, 4 << 20, []uint64{2500, 2500, 999}},
		{"bytes", 10000, 0, []uint64{1700, 1700, 1700, 899}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			batch := make([]stream.Fields, 6000)
			for i := range batch { // all of one size
				batch[i] = stream.Fields{"n": fmt.Sprintf("%04d", i)}
			}
			ids, err := e.log.AppendBatch(ctx, batch)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := e.log.ReadRaw(ctx, ids[0].StreamID, ids[0].StreamID, 1)
			if err != nil || len(raw) != 1 {
				t.Fatalf("read back: %v", err)
			}
			a := e.open(t)
			a.SliceEntries, a.SliceBytes, a.Exact = tc.entries, tc.bytes, true
			if a.SliceBytes == 0 {
				a.SliceBytes = 1700 * int64(stream.EntryBytes(raw[0].Fields))
			}
			res, err := a.Run(ctx, archive.Policy{KeepLast: 1}, nil)
			if err != nil || res.Archived != 5999 || res.W != ids[5998].StreamID.String() {
				t.Fatalf("run %+v %v", res, err)
			}
			var pages []uint64
			for c, err := range a.Volume().Entries(ctx, nil) {
				if err != nil {
					t.Fatal(err)
				}
				pages = append(pages, c.Pages)
			}
			if !slices.Equal(pages, tc.want) {
				t.Fatalf("pages per commit %v, want %v", pages, tc.want)
			}
			got, fromArchive := history(t, a, stream.First, stream.Last)
			if !slices.Equal(got, ids) || fromArchive != 5999 {
				t.Fatalf("merged read: %d entries (%d from the archive), want the 6000 appended", len(got), fromArchive)
			}
		})
	}
}

func TestOverdue(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	old := time.Now().Add(-2 * time.Hour)
	for i := range 1500 { // 1,500 entries two hours old
		id, _ := brand.New(brand.EVT, brand.StreamID{MS: uint64(old.UnixMilli()) + uint64(i)})
		if err := e.log.AppendID(ctx, id, stream.Fields{"n": fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	e.appendN(t, 300) // and 300 of now
	a := e.open(t)
	for _, tc := range []struct {
		p    archive.Policy
		want int64
	}{
		{archive.Policy{KeepLast: 1000}, 800},
		{archive.Policy{KeepFor: time.Hour}, 1500},
		{archive.Policy{KeepLast: 1000, KeepFor: time.Hour}, 800},
		{archive.Policy{KeepLast: 100, KeepFor: time.Hour}, 1500},
		{archive.Policy{KeepFor: 3 * time.Hour}, 0},
	} {
		if got, err := a.Overdue(ctx, tc.p); err != nil || got != tc.want {
			t.Errorf("Overdue(%+v) = %d, %v; want %d", tc.p, got, err, tc.want)
		}
	}
	if _, err := a.Run(ctx, archive.Policy{KeepFor: time.Hour}, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Overdue(ctx, archive.Policy{KeepFor: time.Hour}); err != nil || got > 100 {
		t.Errorf("after a run, Overdue = %d, %v; want about 0", got, err)
	}
}

// movingRemote is a remote another archiver commits to right after each
// read that found no newer commit: every view read from it is one run
// behind by the time the stream is counted, as under an archiver that
// commits and trims faster than the remote answers.
type movingRemote struct {
	fence.Store
	armed atomic.Bool
	moved atomic.Int64
	run   func()
}

func (m *movingRemote) Get(ctx context.Context, key string, r fence.Range) ([]byte, error) {
	b, err := m.Store.Get(ctx, key, r)
	if errors.Is(err, fence.ErrNotFound) && m.armed.Load() {
		m.run()
		m.moved.Add(1)
	}
	return b, err
}

// TestStatus_RemoteMovesDuringEveryRead: when an archiver commits and trims
// between the remote's read and the stream's count in every one of
// Status's reads, Status says the view did not settle and judges no loss
// (the entries trimmed meanwhile are archived, not lost); once the
// archiver pauses, the same handle reads a complete archive.
func TestStatus_RemoteMovesDuringEveryRead(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.appendN(t, 1000)
	archiver := e.open(t)
	if _, err := archiver.Run(ctx, archive.Policy{KeepLast: 50}, nil); err != nil {
		t.Fatal(err)
	}
	remote := &movingRemote{Store: e.store}
	remote.run = func() {
		e.appendN(t, 300)
		if _, err := archiver.Run(ctx, archive.Policy{KeepLast: 50}, nil); err != nil {
			t.Error(err)
		}
	}
	reader, err := archive.Open(ctx, e.log, t.TempDir(), remote)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	remote.armed.Store(true)
	st, err := reader.Status(ctx, dir)
	remote.armed.Store(false)
	if err != nil {
		t.Fatal(err)
	}
	if remote.moved.Load() < 2 {
		t.Fatalf("the remote moved %d times during the status read: nothing raced", remote.moved.Load())
	}
	if st.Settled || st.LostOutside != 0 || st.Recreated || st.Complete {
		t.Fatalf("status read while the remote moved %d times: settled %v, %d lost outside, recreated %v, complete %v (%+v)",
			remote.moved.Load(), st.Settled, st.LostOutside, st.Recreated, st.Complete, st)
	}
	st, err = reader.Status(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Settled || !st.Complete || st.LostOutside != 0 {
		t.Fatalf("status read with the archiver paused: %+v", st)
	}
}

// slowSets delays every SET and script by d (a replay's checkpoint is set
// by a script, under its hold): a checkpoint still being written when the
// replay's next step comes.
type slowSets struct{ d time.Duration }

func (slowSets) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s slowSets) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "set" || n == "evalsha" || n == "eval" {
			time.Sleep(s.d)
		}
		return next(ctx, cmd)
	}
}
func (slowSets) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A replay writes each checkpoint while the next entry is handled, and
// waits for it before the one after and before it returns: a handler
// failure leaves the checkpoint at the entry before it, and a finished
// replay at its last entry, however slow Redis is to take them.
func TestReplay_CheckpointsWrittenBesideTheNextEntry(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	ids := e.appendN(t, 30)
	e.rdb.AddHook(slowSets{20 * time.Millisecond})
	var handled []brand.ID
	failAt := ids[10]
	h := func(_ context.Context, d stream.Delivery) error {
		if d.ID == failAt {
			return errors.New("not now")
		}
		handled = append(handled, d.ID)
		return nil
	}
	res, err := archive.Replay(ctx, e.log, archive.LiveOnly(e.log), "fix", stream.First, stream.Last, h)
	if err == nil || res.Replayed != 10 {
		t.Fatalf("replay: %+v, %v; want it stopped at entry 10", res, err)
	}
	if sid, _, err := e.log.ReplayCheckpoint(ctx, "fix"); err != nil || sid != ids[9].StreamID {
		t.Fatalf("checkpoint after a handler failure: %s, %v; want entry 9's %s", sid, err, ids[9].StreamID)
	}
	failAt = brand.ID{}
	res, err = archive.Replay(ctx, e.log, archive.LiveOnly(e.log), "fix", stream.First, stream.Last, h)
	if err != nil || !res.Done || res.Replayed != 20 {
		t.Fatalf("rerun: %+v, %v; want the other 20", res, err)
	}
	if sid, _, err := e.log.ReplayCheckpoint(ctx, "fix"); err != nil || sid != ids[29].StreamID {
		t.Fatalf("checkpoint after the rerun: %s, %v; want the last entry's %s", sid, err, ids[29].StreamID)
	}
	if !slices.Equal(handled, ids) {
		t.Fatalf("handled %d entries, want the 30 once each, in order", len(handled))
	}
}

// gets counts a store's GETs.
type gets struct {
	fence.Store
	n atomic.Int64
}

func (g *gets) Get(ctx context.Context, key string, r fence.Range) ([]byte, error) {
	g.n.Add(1)
	return g.Store.Get(ctx, key, r)
}

// A run started right after its open takes the open's look at the remote
// for its own: it reads the remote only to read back its commits. A second
// run of the same archive refreshes first.
func TestRun_RightAfterTheOpenReadsBackOnly(t *testing.T) {
	defer archive.SetFreshOpen(time.Minute)() // a loaded machine's pause between the open and the run
	ctx := context.Background()
	local, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := &gets{Store: local}
	e := newEnvOn(t, st)
	dir := t.TempDir()
	run := func(a *archive.Archive) archive.Result {
		t.Helper()
		before := st.n.Load()
		res, err := a.Run(ctx, archive.Policy{KeepLast: 10}, nil)
		if err != nil || res.Commits == 0 {
			t.Fatalf("run: %+v, %v", res, err)
		}
		if got := st.n.Load() - before; got != res.Commits {
			t.Errorf("the run made %d GETs for %d commits: want one read-back each and no refresh", got, res.Commits)
		}
		return res
	}
	for range 2 { // a cold data directory, then a warm one
		e.appendN(t, 100)
		a, err := archive.Open(ctx, e.log, dir, st)
		if err != nil {
			t.Fatal(err)
		}
		a.SliceEntries = 40
		run(a)
		e.appendN(t, 50)
		before := st.n.Load()
		res, err := a.Run(ctx, archive.Policy{KeepLast: 10}, nil)
		if err != nil || res.Commits == 0 || st.n.Load()-before != res.Commits+1 {
			t.Fatalf("a second run of the archive: %+v, %v, %d GETs; want its read-backs and one refresh", res, err, st.n.Load()-before)
		}
	}
}

// A peer's commit made after a run looked at the remote (the open's look
// or its own refresh: either is stale once made), and not yet recorded
// (the peer stalls right after it), is met by the fence: the run loses the
// race for that LSN, folds after the peer's commit and archives the rest,
// every entry once. The peer, let go afterwards, records and trims
// nothing of the run's.
func TestRun_APeersCommitAfterTheRunLookedIsALostRace(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	ids := e.appendN(t, 100)
	late, peer := e.open(t), e.open(t)
	peer.SliceEntries, late.SliceEntries, late.Exact = 30, 30, true
	committed, release := make(chan struct{}), make(chan struct{})
	peer.Failpoint = func(step failpoint.Name) {
		if step == failpoint.AfterCommit {
			close(committed)
			<-release // stalled, its first commit unrecorded
		}
	}
	peerDone := make(chan error, 1)
	var once sync.Once
	late.Failpoint = func(step failpoint.Name) {
		if step == failpoint.AfterFold { // late has looked and folded; its create comes next
			once.Do(func() {
				go func() { _, err := peer.Run(ctx, archive.Policy{KeepLast: 10}, nil); peerDone <- err }()
				<-committed
			})
		}
	}
	res, err := late.Run(ctx, archive.Policy{KeepLast: 10}, nil)
	close(release)
	perr := <-peerDone
	if err != nil || res.LostRaces != 1 || res.Archived != 60 {
		t.Fatalf("run: %+v, %v; want one race lost, the 60 after the peer's 30 archived", res, err)
	}
	got, fromArchive := history(t, e.open(t), stream.First, stream.Last)
	if !slices.Equal(got, ids) || fromArchive != 90 {
		t.Fatalf("history: %d entries (%d from the archive), want the 100 once each, in order, 90 archived (the peer's run: %v)", len(got), fromArchive, perr)
	}
	if n := xlen(t, e); n != 10 {
		t.Fatalf("%d live, want the newest 10 (the peer's run: %v)", n, perr)
	}
}

// Two replays of one name at once (a scheduled one and an operator's
// rerun): the second is refused before it hands anything to a handler,
// naming the process that runs it, and each entry is replayed once. The
// name is free again once the first ends.
func TestReplay_OneProcessAtATimeForAName(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	ids := e.appendN(t, 5)
	inFirst, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	handled := map[brand.ID]int{}
	h := func(_ context.Context, d stream.Delivery) error {
		mu.Lock()
		handled[d.ID]++
		mu.Unlock()
		if d.ID == ids[0] {
			close(inFirst)
			<-release
		}
		return nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := archive.Replay(ctx, e.log, archive.LiveOnly(e.log), "fix", stream.First, stream.Last, h)
		done <- err
	}()
	<-inFirst
	host, _ := os.Hostname()
	res, err := archive.Replay(ctx, e.log, archive.LiveOnly(e.log), "fix", stream.First, stream.Last, h)
	if !errors.Is(err, stream.ErrReplayRunning) || !strings.Contains(err.Error(), host) || res.Replayed != 0 {
		t.Fatalf("a second replay of the name: %+v, %v; want ErrReplayRunning naming %s", res, err, host)
	}
	// Another name is another replay.
	if res, err := archive.Replay(ctx, e.log, archive.LiveOnly(e.log), "other", ids[1].StreamID, ids[1].StreamID, func(context.Context, stream.Delivery) error { return nil }); err != nil || res.Replayed != 1 {
		t.Fatalf("a replay of another name: %+v, %v", res, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if handled[id] != 1 {
			t.Fatalf("handled %v, want each entry once", handled)
		}
	}
	if res, err := archive.Replay(ctx, e.log, archive.LiveOnly(e.log), "fix", stream.First, stream.Last, h); err != nil || !res.Done || res.Replayed != 0 {
		t.Fatalf("a replay of the name after the first ended: %+v, %v; want it free, with nothing left", res, err)
	}
}
