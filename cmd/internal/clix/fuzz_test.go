package clix

import (
	"errors"
	"strings"
	"testing"

	"github.com/silt-dev/silt/pkg/brand"
)

// FuzzParseBound: any bound is a stream id or a usage error naming the flag.
func FuzzParseBound(f *testing.F) {
	for _, s := range []string{"-", "+", "1-0", "EVT_0000000000000000000000001", "USR_x", "2024-01-01T00:00:00Z", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, err := ParseBound("--from", s, brand.EVT)
		var ue *UsageError
		if err != nil && (!errors.As(err, &ue) || ue.Flag != "--from") {
			t.Fatalf("ParseBound(%q): %v is not a usage error naming --from", s, err)
		}
	})
}

// FuzzRedact: whatever the URL, a password given as ":canary-pw@" never
// shows in what Redact returns.
func FuzzRedact(f *testing.F) {
	for _, s := range []string{"redis://u:canary-pw@127.0.0.1:6379/0", "0#:canary-pw@", "redis://u:canary-pw#x@h",
		"rediss://:canary-pw@h:1/2?x=1", "https://h/p?mail=a@b", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got := Redact(s); strings.Contains(s, ":canary-pw@") && strings.Contains(got, "canary-pw") {
			t.Fatalf("Redact(%q) = %q shows the password", s, got)
		}
	})
}
