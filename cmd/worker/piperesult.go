package main

import "encoding/json"

// parseResult reads a co-process's result line. The lines handlers write
// ({"id":"EVT_...","ok":true}, with or without spaces: Node's
// JSON.stringify, Python's json.dumps) are read by a scanner of their
// shape, a fifth of json.Unmarshal's cost (a third of the worker's own CPU
// per --pipe entry went to the result line); anything else (escapes,
// numbers, nested values, other members) goes to json.Unmarshal, whose
// verdict stands.
func parseResult(b []byte) (pipeResult, error) {
	if r, ok := scanResult(b); ok {
		return r, nil
	}
	var r pipeResult
	err := json.Unmarshal(b, &r)
	return r, err
}

// scanResult reads an object of string and boolean members with no escape
// in its strings; ok is false for anything else, or a member named twice.
func scanResult(b []byte) (r pipeResult, ok bool) {
	i := 0
	space := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r') {
			i++
		}
	}
	str := func() (string, bool) {
		if i >= len(b) || b[i] != '"' {
			return "", false
		}
		for j := i + 1; j < len(b); j++ {
			switch c := b[j]; {
			case c == '"':
				s := string(b[i+1 : j])
				i = j + 1
				return s, true
			case c == '\\' || c < 0x20 || c >= 0x80: // escapes, controls, UTF-8: json.Unmarshal
				return "", false
			}
		}
		return "", false
	}
	lit := func(word string) bool {
		if len(b)-i >= len(word) && string(b[i:i+len(word)]) == word {
			i += len(word)
			return true
		}
		return false
	}
	var okSet, seenID, seenErr, seenPerm bool
	space()
	if i >= len(b) || b[i] != '{' {
		return r, false
	}
	i++
	for {
		space()
		name, good := str()
		if !good {
			return r, false
		}
		space()
		if i >= len(b) || b[i] != ':' {
			return r, false
		}
		i++
		space()
		switch name {
		case "id", "error":
			v, good := str()
			if !good {
				return r, false
			}
			if name == "id" {
				if seenID {
					return r, false
				}
				r.ID, seenID = v, true
			} else {
				if seenErr {
					return r, false
				}
				r.Error, seenErr = v, true
			}
		case "ok", "permanent":
			var v bool
			switch {
			case lit("true"):
				v = true
			case lit("false"):
			default:
				return r, false
			}
			if name == "ok" {
				if okSet {
					return r, false
				}
				r.OK, okSet = &v, true
			} else {
				if seenPerm {
					return r, false
				}
				r.Permanent, seenPerm = v, true
			}
		default:
			return r, false
		}
		space()
		if i >= len(b) {
			return r, false
		}
		switch b[i] {
		case ',':
			i++
		case '}':
			i++
			space()
			return r, i == len(b)
		default:
			return r, false
		}
	}
}
