package stream_test

import (
	"strings"
	"testing"

	"github.com/silt-dev/silt/pkg/stream"
)

// FuzzParseKey: any key parses or is refused without panicking; a key that
// parses is its parts put back together (prefix, queue in braces, type,
// then its names), so the scan of archiver run --all takes a key for what
// it is.
func FuzzParseKey(f *testing.F) {
	ks, _ := stream.NewKeyspace("emq", "q")
	own, name, _ := stream.KeyspaceFor("emq", "app:events")
	for _, seed := range []string{ks.Stream("s"), ks.DeadLetter("s", "g"), ks.Done("s", "g", "EVT_1"), ks.Archived("s", "g"),
		ks.Adopted(), own.Adopted(), own.DeadLetter(name, "g"), "emq:{app:events}:stream:x", "emq:{}:adopted", "emq:{a}b}:dead:s:g"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, key string) {
		k, ok := stream.ParseKey(key)
		if !ok {
			return
		}
		head := k.Prefix + ":{" + k.Queue + "}:" + k.Type
		if !strings.HasPrefix(key, head) {
			t.Fatalf("ParseKey(%q) = %+v: the key does not start with %q", key, k, head)
		}
		for _, part := range []string{k.Stream, k.Group, k.ID} {
			if part != "" && !strings.Contains(key[len(head):], ":"+part) {
				t.Fatalf("ParseKey(%q) = %+v: %q is not in the key", key, k, part)
			}
		}
		if k.Type == "stream" {
			if _, err := stream.NewKeyspace(k.Prefix, k.Queue); err != nil {
				t.Fatalf("ParseKey(%q) = %+v: a stream of silt's own in a queue no keyspace takes: %v", key, k, err)
			}
		}
	})
}
