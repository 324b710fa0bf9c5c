package clix

import (
	"strconv"
	"strings"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// ParseTime reads a time given as RFC 3339, as Unix milliseconds, as
// "now", or as a duration ago ("5m", "36h": that long before now).
func ParseTime(flag, s string) (time.Time, error) {
	return parseTimeAt(flag, s, time.Now())
}

func parseTimeAt(flag, s string, now time.Time) (time.Time, error) {
	if s == "now" {
		return now.UTC(), nil
	}
	if d, err := time.ParseDuration(s); err == nil && s != "0" {
		if d < 0 {
			return time.Time{}, Usagef(flag, "%q: a duration ago must be positive", s)
		}
		return now.Add(-d).UTC(), nil
	}
	if s != "" && strings.Trim(s, "0123456789") == "" {
		ms, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return time.Time{}, Usagef(flag, "%q: Unix milliseconds out of range", s)
		}
		return time.UnixMilli(ms).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, Usagef(flag, "%q is not RFC 3339 (2026-12-01T05:00:00Z), Unix milliseconds, now, or a duration ago (5m, 36h)", s)
	}
	return t, nil
}

// ParseWindow reads "T0,T1" into inclusive stream-id bounds.
func ParseWindow(flag, s string) (from, to brand.StreamID, err error) {
	a, b, ok := strings.Cut(s, ",")
	if !ok {
		return from, to, Usagef(flag, "%q: want T0,T1", s)
	}
	t0, err := ParseTime(flag, strings.TrimSpace(a))
	if err != nil {
		return from, to, err
	}
	t1, err := ParseTime(flag, strings.TrimSpace(b))
	if err != nil {
		return from, to, err
	}
	if t1.Before(t0) {
		return from, to, Usagef(flag, "%q: T1 is before T0", s)
	}
	return brand.WindowStart(t0), brand.WindowEnd(t1), nil
}

// ParseBound reads a range bound: "-" (the first id), "+" (the last), a
// branded id of the stream's kind, or a stream id <ms>-<seq>. With kind ""
// a branded id of any kind passes: a first pass, before the stream's kind
// is read from Redis, that catches every other usage error unconnected.
func ParseBound(flag, s string, kind brand.Kind) (brand.StreamID, error) {
	switch {
	case s == "-":
		return stream.First, nil
	case s == "+":
		return stream.Last, nil
	case len(s) > brand.KindLen && s[brand.KindLen] == '_':
		id, err := brand.Parse(s)
		if err != nil {
			return brand.StreamID{}, Usagef(flag, "%v", err)
		}
		if kind != "" && id.Kind != kind {
			return brand.StreamID{}, Usagef(flag, "%s is of kind %s, the stream holds %s", s, id.Kind, kind)
		}
		return id.StreamID, nil
	}
	sid, err := brand.ParseStreamID(s)
	if err != nil {
		return brand.StreamID{}, Usagef(flag, "%q is not -, +, a branded id or a stream id <ms>-<seq>", s)
	}
	return sid, nil
}
