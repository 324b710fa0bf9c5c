// Package jsonx appends the few JSON shapes silt writes per entry (a
// string, an object of strings) without encoding/json's reflection: the
// hot paths of the worker's handlers and of the export write one document
// per entry.
package jsonx

import (
	"slices"
	"strconv"
)

// AppendString appends s as a JSON string. Invalid UTF-8 bytes become
// U+FFFD, as encoding/json writes them; '<', '>' and '&' stay as they are.
func AppendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < 0x80 {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := decodeRune(s[i:])
		if r == 0xFFFD && size == 1 { // invalid UTF-8
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' { // valid JSON, but not JavaScript: escaped as encoding/json does
			b = append(b, s[start:i]...)
			b = append(b, `\u202`...)
			b = append(b, hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// AppendStringMap appends m as a JSON object, keys sorted.
func AppendStringMap(b []byte, m map[string]string) []byte {
	var few [16]string // an entry's fields, sorted on the stack
	keys := few[:0]
	if len(m) > len(few) {
		keys = make([]string, 0, len(m))
	}
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, k)
		b = append(b, ':')
		b = AppendString(b, m[k])
	}
	return append(b, '}')
}

// AppendInt appends n.
func AppendInt(b []byte, n int64) []byte { return strconv.AppendInt(b, n, 10) }
