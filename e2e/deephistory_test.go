package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/silt-dev/silt/internal/testserver"
)

// TestDeepHistory_LifecycleDeleteStopsNothing is issue 14's user path: an
// archive of many small commits whose oldest commit objects a bucket
// lifecycle rule deleted. Cold readers (empty data directories, as the
// Terraform tasks start) still read the whole history through the
// checkpoints, the archiver still archives and trims, a worker with
// --archive-remote still catches a new group up, and verify names exactly
// the objects that are gone.
func TestDeepHistory_LifecycleDeleteStopsNothing(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	remote := filepath.Join(dir, "remote")
	env := archiverEnv(srv, filepath.Join(dir, "data"), "file://"+remote)
	ids := feed(t, env, 2000)
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "10", "--slice-entries", "20", "--exact")
	// The lifecycle rule: the first five commit objects are gone.
	for lsn := 1; lsn <= 5; lsn++ {
		if err := os.Remove(filepath.Join(remote, "emq.cm.events", "commits", fmt.Sprintf("%020d", lsn))); err != nil {
			t.Fatal(err)
		}
	}
	cold := func(name string) []string {
		return archiverEnv(srv, filepath.Join(dir, name), "file://"+remote)
	}
	readIDs := func(name string) []string {
		var out []string
		for _, line := range strings.Split(strings.TrimSpace(silt(t, "", cold(name), "archiver", "read", "--format", "text")), "\n") {
			out = append(out, strings.Fields(line)[0])
		}
		return out
	}
	got := readIDs("cold-read")
	if len(got) != len(ids) || got[0] != ids[0] || got[len(got)-1] != ids[len(ids)-1] {
		t.Fatalf("cold read after the lifecycle delete: %d entries, want %d", len(got), len(ids))
	}
	for i := range ids {
		if got[i] != ids[i] {
			t.Fatalf("cold read entry %d = %s, want %s", i, got[i], ids[i])
		}
	}
	silt(t, "", cold("cold-status"), "archiver", "status")
	more := feed(t, env, 100)
	silt(t, "", cold("cold-run"), "archiver", "run", "--stream", "events", "--keep-last", "10", "--slice-entries", "20", "--exact")
	all := append(ids, more...)
	if n := len(readIDs("cold-read-2")); n != len(all) {
		t.Fatalf("cold read after a cold run: %d entries, want %d", n, len(all))
	}
	out := silt(t, "", append(env, "EMQ_GROUP=late"), "worker", "run", "--stdout", "--block", "300ms",
		"--archive-remote", "file://"+remote, "--archive-cache", filepath.Join(dir, "cold-cache"))
	if n := strings.Count(out, "\n"); n != len(all) {
		t.Fatalf("a new group through --archive-remote got %d entries, want %d", n, len(all))
	}
	_, errOut, err := runArchiver(cold("cold-verify"), "verify")
	if err == nil || !strings.Contains(errOut, "emq.cm.events/commits/00000000000000000001..00000000000000000005 (5 objects)") {
		t.Fatalf("verify with commits deleted: %v\n%s", err, errOut)
	}
}
