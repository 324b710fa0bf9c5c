package clix

import (
	"testing"
	"time"
)

func TestParseTime(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"now":                  now,
		"5m":                   now.Add(-5 * time.Minute),
		"36h":                  now.Add(-36 * time.Hour),
		"1764590400000":        time.UnixMilli(1764590400000).UTC(),
		"2026-11-30T08:00:00Z": time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC),
		"0":                    time.UnixMilli(0).UTC(),
	} {
		got, err := parseTimeAt("--since", in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseTimeAt(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"-5m", "yesterday", "", "5 m"} {
		if _, err := parseTimeAt("--since", in, now); err == nil {
			t.Errorf("parseTimeAt(%q) took it", in)
		}
	}
}
