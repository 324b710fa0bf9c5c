package export

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

func TestFieldsJSON_IsEncodingJSON(t *testing.T) {
	for _, f := range []map[string]string{
		{},
		{"a": "1"},
		{"z": "last", "a": "first", "quote\"": "back\\slash", "ctl": "\x00\x01\x1f\t\n\r", "uni": "naïve café ✓", "html": "<a&b>"},
	} {
		var got, want map[string]string
		if err := json.Unmarshal([]byte(fieldsJSON(f)), &got); err != nil {
			t.Fatalf("fieldsJSON(%q) = %s: %v", f, fieldsJSON(f), err)
		}
		b, _ := json.Marshal(f)
		json.Unmarshal(b, &want)
		if len(got) != len(want) {
			t.Fatalf("fieldsJSON(%q) = %s", f, fieldsJSON(f))
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("fieldsJSON(%q) = %s: %q is %q", f, fieldsJSON(f), k, got[k])
			}
		}
	}
}

func FuzzFieldsJSON(f *testing.F) {
	f.Add("k", "v", "\x00\"\\")
	f.Fuzz(func(t *testing.T, k, v, w string) {
		in := map[string]string{k: v, k + "2": w}
		for key, val := range in {
			if !utf8.ValidString(key) || !utf8.ValidString(val) {
				return // fieldsJSON takes the UTF-8 pairs only
			}
		}
		var got map[string]string
		if err := json.Unmarshal([]byte(fieldsJSON(in)), &got); err != nil || len(got) != len(in) || got[k] != in[k] || got[k+"2"] != w {
			t.Fatalf("fieldsJSON(%q) = %s (%v)", in, fieldsJSON(in), err)
		}
	})
}
