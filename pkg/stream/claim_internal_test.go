package stream

import (
	"context"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// TestClaimScript_RecordsDeletedAsGaps: entries trimmed while pending come
// back from XAUTOCLAIM as deleted; the script records "id-1 id+1 0" for each,
// with the decimal carries right at the edges of ms and seq.
func TestClaimScript_RecordsDeletedAsGaps(t *testing.T) {
	rdb := testserver.Redis(t).Client(t)
	ctx := context.Background()
	const key, gaps = "emq:{q}:stream:s", "emq:{q}:catchup:s:g"
	for _, id := range []string{"1000-0", "1000-9", "1000-19", "1001-18446744073709551615", "1002-5"} {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: id, Values: []string{"a", "1"}})
	}
	rdb.XGroupCreate(ctx, key, "g", "0")
	rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{key, ">"}, Count: 10})
	rdb.XTrimMinID(ctx, key, "1002-0")
	res, err := claimScript.Run(ctx, rdb, []string{key, gaps, "emq:{q}:windows:s:g", "emq:{q}:attempts:s:g"}, "g", "w1", 0, "0-0", 10, "1").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if claimed, _ := res[1].([]any); len(claimed) != 1 {
		t.Fatalf("claimed %v, want the one live entry", res[1])
	}
	got := rdb.LRange(ctx, gaps, 0, -1).Val()
	want := []string{"999-18446744073709551615 1000-1 0", "1000-8 1000-10 0", "1000-18 1000-20 0",
		"1001-18446744073709551614 1002-0 0"}
	if !slices.Equal(got, want) {
		t.Fatalf("gaps %q, want %q", got, want)
	}
	for _, g := range got {
		if _, err := parseGap(g); err != nil {
			t.Fatal(err)
		}
	}
	if n := rdb.XPending(ctx, key, "g").Val().Count; n != 1 {
		t.Fatalf("%d pending, want 1 (the deleted ones left the PEL)", n)
	}
}
