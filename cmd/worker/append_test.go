package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
)

// runWorker runs the worker binary's main with args and returns its exit code and output.
func runWorker(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), append([]string{"worker"}, args...), strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestAppend_OneEntry(t *testing.T) {
	srv := testserver.Redis(t)
	code, out, errOut := runWorker(t, "", "append", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "user=u1", "note=a b=c")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	id, err := brand.Parse(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("output %q is not a branded id: %v", out, err)
	}
	msgs := srv.Client(t).XRange(context.Background(), "emq:{cm}:stream:events", "-", "+").Val()
	if len(msgs) != 1 || msgs[0].ID != id.StreamID.String() || msgs[0].Values["note"] != "a b=c" {
		t.Fatalf("stream holds %v, want one entry %s", msgs, id)
	}
}

func TestAppend_StdinStopsAtBadLine(t *testing.T) {
	srv := testserver.Redis(t)
	stdin := "{\"a\":\"1\"}\n\n{\"a\":\"2\"}\n{\"a\":3}\n{\"a\":\"4\"}\n"
	code, out, errOut := runWorker(t, stdin, "append", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--batch", "1")
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(errOut, "stdin line 4") || !strings.Contains(errOut, "appended 2 entries") {
		t.Fatalf("stderr %q does not name line 4 and the 2 appended entries", errOut)
	}
	if ids := strings.Fields(out); len(ids) != 2 {
		t.Fatalf("printed %d ids, want 2: %q", len(ids), out)
	}
	if n := srv.Client(t).XLen(context.Background(), "emq:{cm}:stream:events").Val(); n != 2 {
		t.Fatalf("XLEN = %d, want 2", n)
	}
}

func TestAppend_StdinBatches(t *testing.T) {
	srv := testserver.Redis(t)
	var in strings.Builder
	for range 1234 {
		in.WriteString(`{"k":"v"}` + "\n")
	}
	code, out, errOut := runWorker(t, in.String(), "append", "--redis", srv.URL(), "--queue", "cm", "--stream", "events", "--batch", "100")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	ids := strings.Fields(out)
	if len(ids) != 1234 {
		t.Fatalf("printed %d ids", len(ids))
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			t.Fatalf("ids out of order at %d", i)
		}
	}
}

func TestAppend_UsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no queue", []string{"append", "--stream", "s", "a=1"}, "--queue"},
		{"brace in queue", []string{"append", "--queue", "c{m", "--stream", "s", "a=1"}, "--queue"},
		{"newline in stream", []string{"append", "--queue", "cm", "--stream", "s\nx", "a=1"}, "--stream"},
		{"bad kind", []string{"append", "--queue", "cm", "--stream", "s", "--kind", "evt", "a=1"}, "--kind"},
		{"bad field", []string{"append", "--queue", "cm", "--stream", "s", "novalue"}, `"novalue"`},
		{"id field", []string{"append", "--queue", "cm", "--stream", "s", "id=x"}, `"id=x"`},
		{"bad redis url", []string{"append", "--redis", "http://x", "--queue", "cm", "--stream", "s", "a=1"}, "--redis"},
		{"bad log level", []string{"append", "--log-level", "loud", "--queue", "cm", "--stream", "s", "a=1"}, "--log-level"},
		{"unknown flag", []string{"append", "--nope"}, "-nope"},
		{"unknown command", []string{"nope"}, "nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runWorker(t, "", tc.args...)
			if code != 2 || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stderr %q; want 2 naming %s", code, errOut, tc.want)
			}
		})
	}
}

func TestAppend_PasswordNeverPrinted(t *testing.T) {
	const canary = "canary-Pw-7f3a"
	srv := testserver.Redis(t, "--requirepass", "the-real-one")
	for _, url := range []string{
		"redis://default:" + canary + "@" + srv.Addr + "/0",   // auth failure
		"redis://default:" + canary + "@127.0.0.1:1/0",        // nobody listens
		"redis://default:" + canary + "@" + srv.Addr + "/abc", // bad db
	} {
		code, out, errOut := runWorker(t, "", "append", "--redis", url, "--redis-wait", "300ms", "--log-level", "debug", "--queue", "cm", "--stream", "s", "a=1")
		if code == 0 {
			t.Fatalf("append with %s succeeded", url)
		}
		if strings.Contains(out+errOut, canary) {
			t.Fatalf("password printed: %s%s", out, errOut)
		}
		if !strings.Contains(errOut, "xxxxx") {
			t.Errorf("error %q does not name the redacted URL", errOut)
		}
	}
}

// FuzzParseLine: a stdin line is fields or an error, never a panic; the
// fields it gives hold exactly the strings of the JSON object.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{`{"a":"1"}`, `{"id":"x"}`, `{"a":1}`, `[]`, ``, `{"a":"\u0000"}`, `{"a":"1"} {"b":"2"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		parseLine(line)
	})
}

// A JSON line is taken as it is or refused, never changed: invalid UTF-8,
// null, non-string values and repeated keys are errors; binary fields come
// base64-encoded under "fields_base64".
func TestParseLine_NeverChangesInput(t *testing.T) {
	for _, tc := range []struct {
		line string
		want string // error text; "" for success
	}{
		{"{\"a\":\"caf\xe9\"}", "invalid UTF-8 at byte 9"},
		{`{"a":null}`, `field "a" is null`},
		{`{"a":1}`, "is not a string"},
		{`{"a":{"b":"c"}}`, "is not a string"},
		{`{"a":"1","a":"2"}`, "given twice"},
		{`{"fields_base64":{"Yg==":"not base64!"}}`, "is not base64"},
		{`{"fields_base64":"x"}`, "must be an object"},
		{`{"a":"é","fields_base64":{"Yg==":"/w=="}}`, ""},
	} {
		f, err := parseLine([]byte(tc.line))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.line, err)
		case tc.want == "" && (f["a"] != "é" || f["b"] != "\xff" || len(f) != 2):
			t.Errorf("%q: fields %q", tc.line, f)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: error %v, want one saying %q", tc.line, err, tc.want)
		}
	}
}

// Empty stdin appends nothing and says so (exit 0: an upstream that had
// nothing to send is not an error).
func TestAppend_EmptyStdinSaysSo(t *testing.T) {
	srv := testserver.Redis(t)
	code, out, errOut := runWorker(t, "", "append", "--redis", srv.URL(), "--queue", "cm", "--stream", "events")
	if code != 0 || out != "" || !strings.Contains(errOut, "stdin held no entries") {
		t.Fatalf("exit %d, stdout %q, stderr %s", code, out, errOut)
	}
}
