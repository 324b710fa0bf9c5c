package archive_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// A watermark forged on the remote and in Redis's record alike (the
// commit's W raised over 26 live entries, the record rewritten to match)
// passes the proof, but trims nothing the archive lacks: the run compares
// the live entries below W it did not fold with the archive, keeps the 26,
// says so, and a merged read returns every entry once.
func TestHolds_ForgedRecordAndWatermarkTrimNothingUnarchived(t *testing.T) {
	ctx := context.Background()
	e, dir := remoteDir(t)
	ids := e.appendN(t, 100)
	if _, err := e.run(t, 50); err != nil {
		t.Fatal(err)
	}
	rec := record(t, e)
	live, _, _ := xrangeIDs(t, e)
	forgeW(t, dir, rec, rec.LSN, live[25])
	forged := e.open(t).Volume().Latest() // read cold from the forged remote
	e.rdb.HSet(ctx, "emq:{cm}:archive:events", "w", live[25], "hash", forged.Hash())

	res, err := e.run(t, 10)
	if !errors.Is(err, archive.ErrKeptUnarchived) || res.KeptUnarchived != 26 || res.FirstKept != live[0] {
		t.Fatalf("run over a forged record and watermark: %+v, %v; want 26 kept from %s", res, err, live[0])
	}
	if n := xlen(t, e); n != 50 {
		t.Fatalf("stream holds %d after the run, want the 50 live before it", n)
	}
	a := e.open(t)
	if err := a.CheckRemote(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for it, err := range a.Read(ctx, stream.First, stream.Last) {
		if err != nil {
			t.Fatal(err)
		}
		seen[it.ID.String()]++
	}
	for i, id := range ids {
		if seen[id.String()] != 1 {
			t.Fatalf("entry %d (%s) read %d times", i, id, seen[id.String()])
		}
	}
	n, first, err := a.Unarchived(ctx)
	if err != nil || n != 26 || first.String() != live[0] {
		t.Fatalf("Unarchived: %d from %s, %v; want 26 from %s", n, first, err, live[0])
	}
}

// A trim without archiving (archiver trim) is judged against the archive
// itself: with Redis's record deleted, the remote still holds the stream's
// archive, and TrimLacks counts what the trim would remove that it lacks.
func TestHolds_TrimLacksWithoutARecord(t *testing.T) {
	ctx := context.Background()
	e, _ := remoteDir(t)
	e.appendN(t, 100)
	if _, err := e.run(t, 50); err != nil {
		t.Fatal(err)
	}
	e.rdb.Del(ctx, "emq:{cm}:archive:events")
	a := e.open(t)
	live, _, _ := xrangeIDs(t, e)
	for _, c := range []struct {
		keep int64
		want int64
	}{{60, 0}, {50, 0}, {10, 40}} {
		n, first, err := a.TrimLacks(ctx, archive.Policy{KeepLast: c.keep})
		if err != nil || n != c.want || (n > 0 && first.String() != live[0]) {
			t.Fatalf("keep %d: %d lacking from %s, %v; want %d", c.keep, n, first, err, c.want)
		}
	}
}

// A stream rolled back under its archive, as a promoted replica's is: the
// live stream emptied and its top set back (XSETID), then entries written
// again below W: 1,200 the archive holds (one of them under its id with
// other fields, as a second master of a split brain would write it), 100
// it lacks, and the 10 that were live above W. A merged read returns each
// entry once (the one written twice under one id both times, the
// archive's first), in id order across pages of 1,000; the run trims only
// the 500 archived entries below the first it lacks, and keeps 101.
func TestHolds_ARolledBackStreamKeepsWhatTheArchiveLacks(t *testing.T) {
	ctx := context.Background()
	e, _ := remoteDir(t)
	ids := e.appendN(t, 2000)
	a := e.open(t)
	a.SliceEntries, a.Exact = 500, true
	if _, err := a.Run(ctx, archive.Policy{KeepLast: 10}, nil); err != nil {
		t.Fatal(err)
	}
	var all []archive.Item
	for it, err := range a.Read(ctx, stream.First, stream.Last) {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, it)
	}
	key := e.log.Key()
	e.rdb.XTrimMaxLen(ctx, key, 0)
	if err := e.rdb.Do(ctx, "XSETID", key, "0-1", "MAXDELETEDID", "0-1").Err(); err != nil {
		t.Fatal(err)
	}
	type entry struct {
		sid    brand.StreamID
		fields []string
	}
	var again []entry
	add := func(sid brand.StreamID, f stream.Fields) {
		id, _ := brand.New(brand.EVT, sid)
		kv := []string{"id", id.String()}
		for k, v := range f {
			kv = append(kv, k, v)
		}
		again = append(again, entry{sid, kv})
	}
	for i, it := range all {
		switch {
		case i < 1200 && i == 500:
			add(it.StreamID, stream.Fields{"n": "other", "pad": "split brain"})
		case i < 1200, i >= 1990:
			add(it.StreamID, it.Fields)
		}
		if i >= 1000 && i < 1100 { // ids the archive never held
			add(brand.StreamID{MS: it.StreamID.MS, Seq: it.StreamID.Seq + 500000}, stream.Fields{"late": "1"})
		}
	}
	slices.SortFunc(again, func(x, y entry) int { return x.sid.Compare(y.sid) })
	for _, x := range again {
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: x.sid.String(), Values: x.fields}).Err(); err != nil {
			t.Fatal(err)
		}
	}

	r := e.open(t)
	if err := r.CheckRemote(ctx); err != nil {
		t.Fatal(err)
	}
	var prev brand.StreamID
	seen, n := map[string]int{}, 0
	for it, err := range r.Read(ctx, stream.First, stream.Last) {
		if err != nil {
			t.Fatal(err)
		}
		if it.StreamID.Compare(prev) < 0 {
			t.Fatalf("entry %d: %s after %s", n, it.StreamID, prev)
		}
		prev = it.StreamID
		seen[it.ID.String()]++
		n++
	}
	if n != 2000+100+1 || seen[ids[500].String()] != 2 {
		t.Fatalf("the merged read returned %d entries (want 2,101), %s %d times (want 2)", n, ids[500], seen[ids[500].String()])
	}
	for i, id := range ids {
		if seen[id.String()] != 1 && i != 500 {
			t.Fatalf("entry %d (%s) read %d times", i, id, seen[id.String()])
		}
	}
	r.SliceEntries, r.Exact = 500, true
	res, err := r.Run(ctx, archive.Policy{KeepLast: 10}, nil)
	if !errors.Is(err, archive.ErrKeptUnarchived) || res.KeptUnarchived != 101 || res.FirstKept != ids[500].StreamID.String() || res.Trimmed != 500 {
		t.Fatalf("run over the rolled-back stream: %+v, %v; want 101 kept from %s, 500 trimmed", res, err, ids[500].StreamID)
	}
	if got := xlen(t, e); got != 1200+100+10-500 {
		t.Fatalf("stream holds %d after the run, want %d", got, 1200+100+10-500)
	}
}
