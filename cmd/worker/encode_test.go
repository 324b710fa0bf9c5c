package main

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// appendDelivery writes what json.Marshal of the same document writes, as
// a reader decodes it: handlers see no difference.
func FuzzAppendDelivery(f *testing.F) {
	f.Add("k", "v", "\xff\x00", "fix-1", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", int64(2), true)
	f.Add("", "", "", "", "", int64(0), false)
	f.Fuzz(func(t *testing.T, k, v, bin, replay, tp string, attempts int64, recovered bool) {
		id, _ := brand.New(brand.EVT, brand.StreamID{MS: 1796000000000, Seq: uint64(attempts & 0xff)})
		d := stream.Delivery{ID: id, StreamID: id.StreamID, Fields: stream.Fields{k: v, "b": bin}, Attempts: attempts,
			Deliveries: attempts + 1, Group: "g" + k, Consumer: "c" + v, Recovered: recovered, Replay: replay}
		doc := deliveryDocOf(d)
		doc.Traceparent = tp
		var got, want deliveryDoc
		if err := json.Unmarshal(appendDelivery(nil, doc), &got); err != nil {
			t.Fatalf("appendDelivery wrote %s: %v", appendDelivery(nil, doc), err)
		}
		std, _ := json.Marshal(doc)
		json.Unmarshal(std, &want)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("appendDelivery decodes to %+v; encoding/json's to %+v", got, want)
		}
	})
}
