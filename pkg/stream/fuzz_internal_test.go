package stream

import (
	"testing"
	"time"
)

// FuzzParseGap: a catch-up checkpoint either parses or is an error.
func FuzzParseGap(f *testing.F) {
	f.Add("1-0 5-3 2")
	f.Add("x y z")
	f.Add("18446744073709551615-18446744073709551615 0-0 -1")
	f.Fuzz(func(t *testing.T, s string) {
		if g, err := parseGap(s); err == nil && (g.last.String() == "" || g.first.String() == "") {
			t.Fatalf("parseGap(%q) = %+v without error", s, g)
		}
	})
}

// FuzzDecodeDeadLetter: a dead-letter record with any field values decodes
// or reports which fields are bad, never panics.
func FuzzDecodeDeadLetter(f *testing.F) {
	f.Add("EVT_x", "1-1", "3", time.Now().UTC().Format(time.RFC3339Nano), `{"a":"b"}`)
	f.Add("", "", "", "", "")
	f.Fuzz(func(t *testing.T, entryID, sid, attempts, when, payload string) {
		decodeDeadLetter(Entry{Fields: Fields{"entry_id": entryID, "entry_stream_id": sid, "attempts": attempts,
			"time": when, "payload": payload}})
	})
}
