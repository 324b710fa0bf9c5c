package stream_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/silt-dev/silt/pkg/stream"
)

func TestKeyspace_Keys(t *testing.T) {
	ks, err := stream.NewKeyspace("", "cm")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ks.Stream("events"), "emq:{cm}:stream:events"; got != want {
		t.Errorf("Stream = %q, want %q", got, want)
	}
	if got, want := ks.DeadLetter("events", "billing"), "emq:{cm}:dead:events:billing"; got != want {
		t.Errorf("DeadLetter = %q, want %q", got, want)
	}
}

func TestValidateName(t *testing.T) {
	for _, bad := range []string{"", "a{b", "a}b", "a:b", "a b", "a\nb", "é", strings.Repeat("x", 129)} {
		err := stream.ValidateName("queue", bad)
		if !errors.Is(err, stream.ErrBadName) || !strings.Contains(err.Error(), "queue name") {
			t.Errorf("ValidateName(%q) = %v, want ErrBadName naming the queue", bad, err)
		}
	}
	for _, good := range []string{"cm", "a.b_c-D9", strings.Repeat("x", 128)} {
		if err := stream.ValidateName("queue", good); err != nil {
			t.Errorf("ValidateName(%q) = %v", good, err)
		}
	}
	if _, err := stream.NewKeyspace("em{q", "cm"); err == nil || !strings.Contains(err.Error(), "prefix") {
		t.Errorf("NewKeyspace with a brace in the prefix: %v", err)
	}
}
