package jsonx

import (
	"encoding/json"
	"testing"
)

// FuzzAppendStringMap: what AppendStringMap writes decodes to what
// encoding/json's own output decodes to, for any strings.
func FuzzAppendStringMap(f *testing.F) {
	for _, s := range []string{"", "plain", "quote\"back\\slash", "\x00\x01\x1f\t\n\r", "naïve ✓", "<a&b>", "\xff\xfe", "\u2028\u2029"} {
		f.Add(s, s+"v")
	}
	f.Fuzz(func(t *testing.T, k, v string) {
		in := map[string]string{k: v, "z" + k: k}
		var got, want map[string]string
		if err := json.Unmarshal(AppendStringMap(nil, in), &got); err != nil {
			t.Fatalf("AppendStringMap(%q) = %s: %v", in, AppendStringMap(nil, in), err)
		}
		std, _ := json.Marshal(in)
		json.Unmarshal(std, &want)
		if len(got) != len(want) {
			t.Fatalf("%q: got %q, want %q", in, got, want)
		}
		for key, val := range want {
			if got[key] != val {
				t.Fatalf("%q: %q is %q, encoding/json gives %q", in, key, got[key], val)
			}
		}
	})
}
