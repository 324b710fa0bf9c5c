package clix

import (
	"fmt"

	"github.com/silt-dev/silt/pkg/archive"
)

// PolicyFlags says a declared retention policy as the flags of `archiver
// policy set` that declare it ("" for nil).
func PolicyFlags(d *archive.Declared) string {
	if d == nil {
		return ""
	}
	s := ""
	if d.KeepLast > 0 {
		s += fmt.Sprintf("--keep-last %d ", d.KeepLast)
	}
	if d.KeepFor > 0 {
		s += fmt.Sprintf("--keep-for %s ", d.KeepFor)
	}
	if d.Exact {
		s += "--exact "
	}
	if d.Archive {
		return s + "--archive"
	}
	return s + "--no-archive"
}
