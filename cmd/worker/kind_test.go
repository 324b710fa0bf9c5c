package main

import (
	"strings"
	"testing"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// The stream's first append records its kind; later commands take it from
// the stream, and --kind is a check.
func TestAppend_TheStreamOwnsItsKind(t *testing.T) {
	srv := testserver.Redis(t)
	at := func(stream string, args ...string) []string {
		return append([]string{"--redis", srv.URL(), "--queue", "cm", "--stream", stream}, args...)
	}
	if code, out, errOut := runWorker(t, "", append([]string{"append"}, at("jobs", "--kind", "JOB", "a=1")...)...); code != 0 || !strings.HasPrefix(out, "JOB_") {
		t.Fatalf("first append: exit %d %s %s", code, out, errOut)
	}
	if code, out, _ := runWorker(t, "", append([]string{"append"}, at("jobs", "a=2")...)...); code != 0 || !strings.HasPrefix(out, "JOB_") {
		t.Fatalf("append without --kind into a JOB stream: exit %d, %q", code, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{at("jobs", "--kind", "USR", "a=3"), "holds JOB ids"},
		{at("fresh", "--kind", "XYZ", "a=1"), "--new-kind"},
		{append(at("jobs", "--stream", "other"), "a=1"), "--stream"},
	} {
		code, _, errOut := runWorker(t, "", append([]string{"append"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("append %v: exit %d, stderr %q; want 2 saying %q", tc.args, code, errOut, tc.want)
		}
	}
	if code, out, errOut := runWorker(t, "", append([]string{"append"}, at("custom", "--kind", "XYZ", "--new-kind", "a=1")...)...); code != 0 || !strings.HasPrefix(out, "XYZ_") {
		t.Fatalf("a new kind with --new-kind: exit %d %s %s", code, out, errOut)
	}
	// Consumers take the kind from the stream: nothing is malformed.
	for _, stream := range []string{"jobs", "custom"} {
		code, out, errOut := runWorker(t, "", append([]string{"run"}, at(stream, "--group", "g", "--block", "100ms", "--", "true")...)...)
		if sum := parseSummary(t, out); code != 0 || sum.Malformed != 0 || sum.Acked == 0 {
			t.Fatalf("run on %s without --kind: exit %d, %+v, %s", stream, code, sum, errOut)
		}
	}
}
