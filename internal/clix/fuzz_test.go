package clix

import (
	"errors"
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
