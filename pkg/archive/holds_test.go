package archive_test

import (
	"context"
	"errors"
	"testing"

	"github.com/silt-dev/silt/pkg/archive"
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
