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

// Every key the Keyspace makes parses back to its parts; keys of other
// layouts do not parse.
func TestParseKey(t *testing.T) {
	ks, _ := stream.NewKeyspace("pfx", "q-1")
	for _, c := range []struct {
		key  string
		want stream.Key
	}{
		{ks.Stream("events"), stream.Key{Keyspace: ks, Type: "stream", Stream: "events"}},
		{ks.DeadLetter("events", "billing"), stream.Key{Keyspace: ks, Type: "dead", Stream: "events", Group: "billing"}},
		{ks.Done("events", "g", "EVT_01"), stream.Key{Keyspace: ks, Type: "done", Stream: "events", Group: "g", ID: "EVT_01"}},
		{ks.DeadRetrying("events", "g", "EVT_02"), stream.Key{Keyspace: ks, Type: "dead-retrying", Stream: "events", Group: "g", ID: "EVT_02"}},
		{ks.CatchUp("events", "g"), stream.Key{Keyspace: ks, Type: "catchup", Stream: "events", Group: "g"}},
		{ks.Lease("events", "g"), stream.Key{Keyspace: ks, Type: "lease", Stream: "events", Group: "g"}},
		{ks.Attempts("events", "g"), stream.Key{Keyspace: ks, Type: "attempts", Stream: "events", Group: "g"}},
		{ks.StartWindows("events", "g"), stream.Key{Keyspace: ks, Type: "windows", Stream: "events", Group: "g"}},
		{ks.Replay("events", "r"), stream.Key{Keyspace: ks, Type: "replay", Stream: "events", Group: "r"}},
		{ks.ReplayHold("events", "r"), stream.Key{Keyspace: ks, Type: "replay-hold", Stream: "events", Group: "r"}},
		{ks.Archived("events", ""), stream.Key{Keyspace: ks, Type: "archive", Stream: "events"}},
		{ks.Archived("events", "g"), stream.Key{Keyspace: ks, Type: "archive", Stream: "events", Group: "g"}},
		{ks.Kinds(), stream.Key{Keyspace: ks, Type: "kinds"}},
		{ks.Policies(), stream.Key{Keyspace: ks, Type: "policies"}},
		{ks.PolicyRuns(), stream.Key{Keyspace: ks, Type: "policy-runs"}},
		{ks.Adopted(), stream.Key{Keyspace: ks, Type: "adopted"}},
	} {
		got, ok := stream.ParseKey(c.key)
		if !ok || got != c.want {
			t.Errorf("ParseKey(%q) = %+v, %v; want %+v", c.key, got, ok, c.want)
		}
	}
	for _, bad := range []string{"", "events", "pfx:{q}", "pfx:{q}:", "pfx:{q}:stream", "pfx:{q}:stream:a:b",
		"pfx:{q}:dead:a", "pfx:{q}:dead:a:b:c", "pfx:{q}:other:a", "pfx:{q}:stream:a b", "pf x:{q}:stream:a",
		"pfx:{q:1}:stream:a", "pfx:{q}:archive:a:live:g", "pfx:{q}:kinds:a", "pfx:{q}:done:a:g:"} {
		if k, ok := stream.ParseKey(bad); ok {
			t.Errorf("ParseKey(%q) = %+v, want not ok", bad, k)
		}
	}
	// The keys silt keeps for a stream adopted under its own key parse
	// whatever the key's hash tag holds (archiver run --all scans for the
	// adopted hash and the dead-letter streams).
	for _, key := range []string{"orders", "app:{tenant}:events", "app:events", "billing/eu west:v2"} {
		own, name, err := stream.KeyspaceFor("pfx", key)
		if err != nil {
			t.Fatal(err)
		}
		ks := stream.Keyspace{Prefix: "pfx", Queue: stream.HashTag(key)}
		for _, c := range []struct {
			key  string
			want stream.Key
		}{
			{own.Adopted(), stream.Key{Keyspace: ks, Type: "adopted"}},
			{own.DeadLetter(name, "g"), stream.Key{Keyspace: ks, Type: "dead", Stream: name, Group: "g"}},
			{own.Archived(name, "g"), stream.Key{Keyspace: ks, Type: "archive", Stream: name, Group: "g"}},
		} {
			if got, ok := stream.ParseKey(c.key); !ok || got != c.want {
				t.Errorf("ParseKey(%q), a key of %q = %+v, %v; want %+v", c.key, key, got, ok, c.want)
			}
		}
	}
}

// A stream under its own key keeps it; silt's keys for it take its hash
// tag (the key itself without one), so they share its Cluster slot.
func TestKeyspaceFor(t *testing.T) {
	for _, tc := range []struct{ key, tag, name string }{
		{"orders", "orders", "orders"},
		{"app:{tenant}:events", "tenant", "app_3A_7Btenant_7D_3Aevents"},
		{"a_b", "a_b", "a_5Fb"},
	} {
		ks, name, err := stream.KeyspaceFor("", tc.key)
		if err != nil {
			t.Fatal(err)
		}
		if name != tc.name || ks.Queue != tc.tag || ks.Stream(name) != tc.key || stream.HashTag(ks.Kinds()) != tc.tag {
			t.Errorf("%s: name %q queue %q stream %q kinds %q", tc.key, name, ks.Queue, ks.Stream(name), ks.Kinds())
		}
	}
	if _, _, err := stream.KeyspaceFor("", "bad\nkey"); !errors.Is(err, stream.ErrBadName) {
		t.Errorf("a key with a line break: %v", err)
	}
	// Hashed whole, with a '}': no hash tag of silt's keys hashes as the key.
	for _, key := range []string{"a}b", "{}a", "x}{y"} {
		if _, _, err := stream.KeyspaceFor("", key); !errors.Is(err, stream.ErrBadName) || !strings.Contains(err.Error(), "hash tag") {
			t.Errorf("%q: %v", key, err)
		}
	}
	// A tag that opens and never closes is the whole key, which a tag can hold.
	ks, name, err := stream.KeyspaceFor("", "a{b")
	if err != nil || ks.Queue != "a{b" || stream.HashTag(ks.Kinds()) != "a{b" {
		t.Errorf("a{b: %v, queue %q", err, ks.Queue)
	}
	if k, ok := stream.ParseKey(ks.Kinds()); !ok || k.Queue != "a{b" || name != "a_7Bb" {
		t.Errorf("a{b (named %q): its keys are not parsed back: %+v", name, k)
	}
}
