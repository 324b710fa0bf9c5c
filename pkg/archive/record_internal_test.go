package archive

import (
	"bytes"
	"testing"

	"github.com/silt-dev/silt/pkg/brand"
)

// TestAppendRecord_AsAMap: a record encoded from an entry's pairs is the
// record of the map those pairs make: names sorted, a name given twice
// kept once with its last value, whatever the number of fields.
func TestAppendRecord_AsAMap(t *testing.T) {
	sid := brand.StreamID{MS: 7, Seq: 3}
	cases := [][]string{
		nil,
		{"id", "EVT_x"},
		{"b", "2", "a", "1", "c", ""},
		{"x", "first", "y", "", "x", "last"},
		{"z", "1", "z", "2", "z", "3"},
	}
	var many []string // past the insertion sort
	for i := range 40 {
		many = append(many, string(rune('a'+(i*7)%26))+string(rune('a'+i%3)), string(rune('0'+i%10)))
	}
	cases = append(cases, many)
	for _, pairs := range cases {
		m := map[string]string{}
		for i := 0; i < len(pairs); i += 2 {
			m[pairs[i]] = pairs[i+1]
		}
		got, _ := appendRecord(nil, sid, true, pairs, nil)
		want := encodeRecord(Record{StreamID: sid, Fields: m, Malformed: true})
		if !bytes.Equal(got, want) || len(got) > maxRecordSize(pairs) {
			t.Errorf("pairs %q: encoded %x, the map's record %x (bound %d)", pairs, got, want, maxRecordSize(pairs))
		}
		r, err := decodeRecord(got)
		if err != nil || len(r.Fields) != len(m) || r.StreamID != sid || !r.Malformed {
			t.Errorf("pairs %q decode to %+v, %v", pairs, r, err)
		}
	}
}
