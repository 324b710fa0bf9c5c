package failpoint_test

import (
	"strings"
	"testing"

	"github.com/silt-dev/silt/pkg/failpoint"
)

func TestParse(t *testing.T) {
	seen := map[failpoint.Name]bool{}
	for _, n := range failpoint.All {
		if seen[n] {
			t.Errorf("%s listed twice", n)
		}
		seen[n] = true
		if got, err := failpoint.Parse(string(n)); err != nil || got != n {
			t.Errorf("Parse(%q) = %q, %v", n, got, err)
		}
	}
	_, err := failpoint.Parse("after-comit")
	if err == nil || !strings.Contains(err.Error(), `"after-comit"`) || !strings.Contains(err.Error(), "after-commit") {
		t.Fatalf("Parse of a typo = %v, want an error naming it and the valid names", err)
	}
}
