package stream_test

import (
	"context"
	"maps"
	"slices"
	"testing"

	"github.com/silt-dev/silt/pkg/stream"
)

// TestReadFlat_AsStored: a flat read holds every field as added, a name
// added twice included, and agrees with ReadRaw (whose map keeps the last
// value) on every entry, bounds and count included.
func TestReadFlat_AsStored(t *testing.T) {
	l, rdb := newLog(t)
	ctx := context.Background()
	if _, err := l.AppendBatch(ctx, []stream.Fields{{"a": "1"}, {"b": "2", "c": ""}, {"d": "4"}}); err != nil {
		t.Fatal(err)
	}
	twice, err := rdb.Do(ctx, "XADD", l.Key(), "*", "x", "first", "id", "EVT_bad", "y", "", "x", "last").Text()
	if err != nil {
		t.Fatal(err)
	}
	flat, err := l.ReadFlat(ctx, stream.First, stream.Last, 10)
	if err != nil || len(flat) != 4 {
		t.Fatalf("ReadFlat: %d entries, %v", len(flat), err)
	}
	raw, err := l.ReadRaw(ctx, stream.First, stream.Last, 10)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range flat {
		asMap := map[string]string{}
		for j := 0; j < len(e.Pairs); j += 2 {
			asMap[e.Pairs[j]] = e.Pairs[j+1]
		}
		if e.StreamID != raw[i].StreamID || !maps.Equal(asMap, raw[i].Fields) || e.Bytes() < stream.EntryBytes(raw[i].Fields) {
			t.Errorf("entry %d: flat %v %q, raw %v %v", i, e.StreamID, e.Pairs, raw[i].StreamID, raw[i].Fields)
		}
		if id, ok := e.Get(stream.IDField); i < 3 && (!ok || id != raw[i].Fields[stream.IDField] || l.CheckFlat(e) != nil) {
			t.Errorf("entry %d: id field %q %v, check %v", i, id, ok, l.CheckFlat(e))
		}
	}
	last := flat[3]
	if last.StreamID.String() != twice || !slices.Equal(last.Pairs, []string{"x", "first", "id", "EVT_bad", "y", "", "x", "last"}) {
		t.Fatalf("entry added with a name twice reads %v %q", last.StreamID, last.Pairs)
	}
	if v, ok := last.Get("x"); !ok || v != "last" {
		t.Fatalf("Get(x) = %q %v, want the last value", v, ok)
	}
	if id, _ := last.Get("id"); id != "EVT_bad" || l.CheckFlat(last) == nil {
		t.Fatalf("an entry with id field %q checks as well formed", id)
	}
	two, err := l.ReadFlat(ctx, flat[1].StreamID, stream.Last, 2)
	if err != nil || len(two) != 2 || two[0].StreamID != flat[1].StreamID || two[1].StreamID != flat[2].StreamID {
		t.Fatalf("ReadFlat from the second entry, count 2: %v %v", two, err)
	}
	none, err := l.ReadFlat(ctx, stream.Last, stream.Last, 10)
	if err != nil || len(none) != 0 {
		t.Fatalf("ReadFlat past the end: %v %v", none, err)
	}
}
