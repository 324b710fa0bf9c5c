package stream

import (
	"encoding/base64"
	"unicode/utf8"
)

// SplitBinary splits fields for a text document (JSON, a Parquet string
// column): pairs whose name and value are valid UTF-8 stay as they are; the
// others (binary values) come back with name and value base64 encoded in
// the second map, because such documents cannot hold their bytes and
// encoders would replace them silently. Either map is nil when empty. When
// every pair is UTF-8 (the common case) text is fields itself, not a copy:
// callers must not modify it.
func SplitBinary(fields Fields) (text, b64 map[string]string) {
	binary := false
	for k, v := range fields {
		if !utf8.ValidString(v) || !utf8.ValidString(k) {
			binary = true
			break
		}
	}
	if !binary {
		if len(fields) == 0 {
			return nil, nil
		}
		return fields, nil
	}
	for k, v := range fields {
		if utf8.ValidString(v) && utf8.ValidString(k) {
			if text == nil {
				text = make(map[string]string, len(fields))
			}
			text[k] = v
			continue
		}
		if b64 == nil {
			b64 = map[string]string{}
		}
		b64[base64.StdEncoding.EncodeToString([]byte(k))] = base64.StdEncoding.EncodeToString([]byte(v))
	}
	return text, b64
}
