package main

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzParseResult: the scanner's reading of a result line is
// json.Unmarshal's, whenever the scanner takes the line.
func FuzzParseResult(f *testing.F) {
	for _, s := range []string{
		`{"id":"EVT_01M8SSC1C50000000000000","ok":true}`,
		`{"id": "EVT_1", "ok": false, "error": "upstream 503"}`,
		`{"id":"EVT_1","ok":false,"error":"no such account","permanent":true}`,
		`{"ok":true,"id":"x"}`, ` { "id" : "a" , "ok" : true } `, `{"id":"a\"b","ok":true}`,
		`{"id":"a","ok":1}`, `{"id":"a","ok":true,"extra":null}`, `{"id":"a","ok":true}x`, `{"id":"a","id":"b","ok":true}`,
		`{"id":"é","ok":true}`, `{}`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := scanResult(b)
		if !ok {
			return
		}
		var want pipeResult
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("%q: scanned as %+v, json.Unmarshal refuses it: %v", b, got, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: scanned as %+v, json.Unmarshal reads %+v", b, got, want)
		}
	})
}

func TestParseResult_Shapes(t *testing.T) {
	yes, no := true, false
	for line, want := range map[string]pipeResult{
		`{"id":"EVT_1","ok":true}`:                              {ID: "EVT_1", OK: &yes},
		`{"id": "EVT_1", "ok": false, "error": "upstream 503"}`: {ID: "EVT_1", OK: &no, Error: "upstream 503"},
		`{"id":"a\"b","ok":true}`:                               {ID: `a"b`, OK: &yes}, // through json.Unmarshal
		`{"ok":true,"permanent":true,"id":"x"}`:                 {ID: "x", OK: &yes, Permanent: true},
	} {
		got, err := parseResult([]byte(line))
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %+v %v, want %+v", line, got, err, want)
		}
	}
	if _, err := parseResult([]byte(`{"id":"a","ok":tru}`)); err == nil {
		t.Error("a broken line parsed")
	}
}
