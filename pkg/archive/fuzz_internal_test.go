package archive

import (
	"testing"

	"github.com/silt-dev/silt/pkg/brand"
)

// FuzzDecodeRecord: any bytes decode to a record or an ErrBadRecord, never
// a panic; what decodes re-encodes to the same bytes.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(Record{StreamID: brand.StreamID{MS: 1, Seq: 2}, Fields: map[string]string{"id": "EVT_x", "a": "\x00\xff"}}))
	f.Add(encodeRecord(Record{Malformed: true}))
	f.Add([]byte{1, 0, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(b)
		if err != nil {
			return
		}
		if again, err := decodeRecord(encodeRecord(r)); err != nil || again.StreamID != r.StreamID || len(again.Fields) != len(r.Fields) {
			t.Fatalf("re-encoded record decodes to %+v, %v; want %+v", again, err, r)
		}
	})
}
