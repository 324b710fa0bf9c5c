package stream

import (
	"encoding/base64"
	"testing"
)

func TestSplitBinary(t *testing.T) {
	if text, b64 := SplitBinary(nil); text != nil || b64 != nil {
		t.Fatalf("nil fields: %v %v", text, b64)
	}
	plain := Fields{"a": "1", "naïve": "café"}
	if text, b64 := SplitBinary(plain); len(text) != 2 || b64 != nil || text["naïve"] != "café" {
		t.Fatalf("UTF-8 fields: %v %v", text, b64)
	}
	mixed := Fields{"a": "1", "blob": "\xff\x00", "\xfe": "v"}
	text, b64 := SplitBinary(mixed)
	if len(text) != 1 || text["a"] != "1" || len(b64) != 2 {
		t.Fatalf("mixed fields: %v %v", text, b64)
	}
	if b64[base64.StdEncoding.EncodeToString([]byte("blob"))] != base64.StdEncoding.EncodeToString([]byte("\xff\x00")) {
		t.Fatalf("binary value: %v", b64)
	}
	if len(mixed) != 3 {
		t.Fatal("SplitBinary changed its input")
	}
}
