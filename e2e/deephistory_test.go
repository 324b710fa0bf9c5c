package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
)

// coldIDs runs `archiver read` with env (a fresh data directory: a cold
// reader) and returns the branded ids it printed, in order.
func coldIDs(t *testing.T, env []string) []string {
	t.Helper()
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(silt(t, "", env, "archiver", "read", "--format", "text")), "\n") {
		ids = append(ids, strings.Fields(line)[0])
	}
	return ids
}

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
	cold := func(name string) []string {
		return archiverEnv(srv, filepath.Join(dir, name), "file://"+remote)
	}
	// A packed commit holds its segment until compaction replaces it: one
	// deleted before is data gone, and a read says which object.
	first := filepath.Join(remote, "emq.cm.events", "commits", fmt.Sprintf("%020d", 1))
	if err := os.Rename(first, first+".aside"); err != nil {
		t.Fatal(err)
	}
	if _, errOut, err := runArchiver(cold("cold-read-0"), "read"); err == nil || !strings.Contains(errOut, "emq.cm.events/commits/00000000000000000001") {
		t.Fatalf("read with a live commit object gone: %v, %s; want an error naming it", err, errOut)
	}
	if err := os.Rename(first+".aside", first); err != nil {
		t.Fatal(err)
	}
	silt(t, "", env, "archiver", "compact", "--min-entries", "8")
	// The lifecycle rule: the first five commit objects are gone.
	for lsn := 1; lsn <= 5; lsn++ {
		if err := os.Remove(filepath.Join(remote, "emq.cm.events", "commits", fmt.Sprintf("%020d", lsn))); err != nil {
			t.Fatal(err)
		}
	}
	got := coldIDs(t, cold("cold-read"))
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
	if n := len(coldIDs(t, cold("cold-read-2"))); n != len(all) {
		t.Fatalf("cold read after a cold run: %d entries, want %d", n, len(all))
	}
	out := silt(t, "", append(env, "SILT_GROUP=late"), "worker", "run", "--stdout", "--block", "300ms",
		"--archive-remote", "file://"+remote, "--archive-cache", filepath.Join(dir, "cold-cache"))
	if n := strings.Count(out, "\n"); n != len(all) {
		t.Fatalf("a new group through --archive-remote got %d entries, want %d", n, len(all))
	}
	_, errOut, err := runArchiver(cold("cold-verify"), "verify")
	if err == nil || !strings.Contains(errOut, "emq.cm.events/commits/00000000000000000001..00000000000000000005 (5 objects)") {
		t.Fatalf("verify with commits deleted: %v\n%s", err, errOut)
	}
}

// TestDeepHistory_CompactionUnderColdReadersGCAndKills: an archive of 150
// small commits is compacted (once killed at each step of a compaction,
// then to the end) while cold readers read the whole history over and over
// and gc runs with a short grace beside them; then the archiver goes on
// (its runs compact too). Every read holds every entry once, in order;
// verify passes; gc removes the replaced segments.
func TestDeepHistory_CompactionUnderColdReadersGCAndKills(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	remote := "file://" + filepath.Join(dir, "remote")
	env := archiverEnv(srv, filepath.Join(dir, "data"), remote)
	ids := feed(t, env, 3000)
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "10", "--slice-entries", "20", "--exact", "--no-compact")
	var reads atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var once sync.Once
	halt := func() { once.Do(func() { close(stop) }); wg.Wait() }
	t.Cleanup(halt) // before the temp dirs go, even when the test fails
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				out, errOut, err := runArchiver(archiverEnv(srv, filepath.Join(dir, fmt.Sprintf("reader-%d-%d", r, i)), remote), "read", "--format", "text")
				if err != nil {
					t.Errorf("cold read during compaction: %v\n%s", err, errOut)
					return
				}
				lines := strings.Split(strings.TrimSpace(out), "\n")
				if len(lines) < len(ids) {
					t.Errorf("cold read during compaction: %d entries, want at least %d", len(lines), len(ids))
					return
				}
				for j, id := range ids {
					if f := strings.Fields(lines[j]); f[0] != id {
						t.Errorf("cold read during compaction: entry %d is %s, want %s (a gap or a duplicate)", j, f[0], id)
						return
					}
				}
				reads.Add(1)
			}
		}()
	}
	gc := loop(t, env, "archiver", "gc", "--grace", "3s", "--force")
	compact := []string{"compact", "--target", "40000", "--min-entries", "8"}
	for _, step := range []string{"segment-written", "segment-uploaded", "commit-put", "compaction-committed", "checkpoint-leaves", "checkpoint-put"} {
		_, errOut, err := runArchiver(append(env, "SILT_FAILPOINT="+step+":1"), compact...)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("compact with a kill at %s: %v\n%s", step, err, errOut)
		}
	}
	out := silt(t, "", env, "archiver", compact...)
	var res struct{ Entries int64 }
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Entries == 0 || res.Entries > 20 {
		t.Fatalf("compact: %s (%v); want at most 20 segments left of 150", out, err)
	}
	more := feed(t, env, 500)
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "10", "--slice-entries", "20", "--exact",
		"--compact-target", "40000")
	time.Sleep(4 * time.Second) // past gc's grace: the replaced segments go
	halt()
	gc.finish()
	if reads.Load() == 0 {
		t.Fatal("no cold read finished during compaction: the test raced nothing")
	}
	silt(t, "", env, "archiver", "gc", "--grace", "1s", "--force")
	all := append(slices.Clone(ids), more...)
	cold := archiverEnv(srv, filepath.Join(dir, "final"), remote)
	if got := coldIDs(t, cold); !slices.Equal(got, all) {
		t.Fatalf("final cold read: %d entries, want the %d appended, in order, once", len(got), len(all))
	}
	var ver struct {
		Remote struct{ Commits, Entries, Collected int }
	}
	json.Unmarshal([]byte(silt(t, "", cold, "archiver", "verify")), &ver)
	if ver.Remote.Collected == 0 || ver.Remote.Entries >= ver.Remote.Commits/4 {
		t.Fatalf("verify after compaction and gc: %+v; want replaced segments collected and few entries", ver.Remote)
	}
	t.Logf("%d cold reads during compaction; verify %+v", reads.Load(), ver.Remote)
}

// TestDeepHistory_ArchiveKeepFor: history retention is a run's flag, not a
// bucket rule. Entries older than --archive-keep-for leave the archive
// through the fence (prune commit, checkpoint), cold readers read exactly
// the rest, gc --drop-old-commits then deletes the objects (a packed
// commit holds its segment), verify passes, and pull still rebuilds a warm
// copy.
func TestDeepHistory_ArchiveKeepFor(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	remote := "file://" + filepath.Join(dir, "remote")
	env := archiverEnv(srv, filepath.Join(dir, "data"), remote)
	old := feed(t, env, 1000)
	silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "10", "--slice-entries", "50", "--exact")
	time.Sleep(2 * time.Second)
	recent := feed(t, env, 500)
	out := silt(t, "", env, "archiver", "run", "--stream", "events", "--keep-last", "10", "--slice-entries", "50", "--exact",
		"--archive-keep-for", "1500ms")
	if !strings.Contains(out, `"pruned":20`) {
		t.Fatalf("run with --archive-keep-for 1500ms: %s; want the 20 old segments pruned", out)
	}
	want := append(slices.Clone(old[len(old)-10:]), recent...) // the 10 kept live, then the recent feed
	cold := archiverEnv(srv, filepath.Join(dir, "cold"), remote)
	got := coldIDs(t, cold)
	// The 10 entries that stayed live were archived by the second run, after
	// the pruned ones: they are recent segments and stay.
	if !slices.Equal(got, want) {
		t.Fatalf("cold read after the prune: %d entries (first %s), want %d (first %s)", len(got), got[0], len(want), want[0])
	}
	// A grace under a minute is refused without --force: a usage error.
	if code, _, errOut := exitCode(t, env, "", "archiver", "gc", "--grace", "10s"); code != 2 || !strings.Contains(errOut, "--grace") {
		t.Fatalf("gc --grace 10s: exit %d, %s; want a usage error naming --grace", code, errOut)
	}
	time.Sleep(1100 * time.Millisecond)
	silt(t, "", env, "archiver", "gc", "--grace", "1s", "--force")
	var ver struct {
		Remote struct {
			Collected, Entries, Commits int
			ChainStart                  int `json:"chain_start"`
		}
	}
	json.Unmarshal([]byte(silt(t, "", cold, "archiver", "verify")), &ver)
	if got = coldIDs(t, archiverEnv(srv, filepath.Join(dir, "cold-1"), remote)); !slices.Equal(got, want) {
		t.Fatalf("cold read after gc: %d entries, want %d", len(got), len(want))
	}
	// The pruned commits hold their segments (packed): they go, with the
	// other old commit objects, by --drop-old-commits; the chain then starts
	// at a checkpoint.
	gcOut := silt(t, "", env, "archiver", "gc", "--grace", "1s", "--force", "--drop-old-commits")
	var dropped struct {
		Dropped int `json:"dropped_commits"`
	}
	if err := json.Unmarshal([]byte(gcOut), &dropped); err != nil || dropped.Dropped < 20 {
		t.Fatalf("gc --drop-old-commits: %s; want the 20 pruned commits dropped at least", gcOut)
	}
	json.Unmarshal([]byte(silt(t, "", archiverEnv(srv, filepath.Join(dir, "cold-2"), remote), "archiver", "verify")), &ver)
	if ver.Remote.ChainStart == 0 {
		t.Fatalf("verify after dropping old commits: %+v; want the chain to start at a checkpoint", ver.Remote)
	}
	if got = coldIDs(t, archiverEnv(srv, filepath.Join(dir, "cold-3"), remote)); !slices.Equal(got, want) {
		t.Fatalf("cold read after dropping old commits: %d entries, want %d", len(got), len(want))
	}
	// A warm copy is still rebuilt by pull (the repair verify names), from
	// the checkpoint the chain starts at, and then reads the same history.
	warm := archiverEnv(srv, filepath.Join(dir, "warm"), remote)
	var pulled struct {
		ChainStart int `json:"chain_start"`
		Segments   int `json:"segments"`
	}
	if err := json.Unmarshal([]byte(silt(t, "", warm, "archiver", "pull")), &pulled); err != nil || pulled.ChainStart != ver.Remote.ChainStart || pulled.Segments == 0 {
		t.Fatalf("pull after dropping old commits: %+v %v; want the chain from checkpoint %d", pulled, err, ver.Remote.ChainStart)
	}
	silt(t, "", warm, "archiver", "verify")
	if got = coldIDs(t, warm); !slices.Equal(got, want) {
		t.Fatalf("read of the pulled copy: %d entries, want %d", len(got), len(want))
	}
}

// TestDeepHistory_CompactorRacingTwoArchivers: two archivers loop on one
// stream while producers append, a compactor loops beside them (its
// commits race theirs for every LSN), and gc loops with a short grace.
// The merged read then holds every appended entry once, in order, and
// verify passes.
func TestDeepHistory_CompactorRacingTwoArchivers(t *testing.T) {
	srv := testserver.Redis(t)
	dir := t.TempDir()
	remote := "file://" + filepath.Join(dir, "remote")
	p := startProducer(t, srv, 500*time.Microsecond)
	run := []string{"run", "--stream", "events", "--keep-last", "10", "--slice-entries", "20", "--compact-target", "30000"}
	a1 := loop(t, archiverEnv(srv, filepath.Join(dir, "a1"), remote), "archiver", run...)
	a2 := loop(t, archiverEnv(srv, filepath.Join(dir, "a2"), remote), "archiver", run...)
	c := loop(t, archiverEnv(srv, filepath.Join(dir, "c"), remote), "archiver", "compact", "--target", "30000", "--min-entries", "8")
	g := loop(t, archiverEnv(srv, filepath.Join(dir, "g"), remote), "archiver", "gc", "--grace", "2s", "--force")
	time.Sleep(8 * time.Second)
	ids := p.finish()
	for _, l := range []*looper{a1, a2, c, g} {
		l.finish()
	}
	races := a1.lostRaces + a2.lostRaces
	t.Logf("archiver runs %d+%d (lost races %d), compactions %d, gc runs %d; failures %d %d %d %d (last: %s %s)",
		a1.runs, a2.runs, races, c.runs, g.runs, a1.failures, a2.failures, c.failures, g.failures, a1.lastErr, c.lastErr)
	if a1.runs+a2.runs < 4 || c.runs < 2 {
		t.Fatal("the loops hardly ran: nothing raced")
	}
	counts := checkHistory(t, archiverEnv(srv, filepath.Join(dir, "final"), remote), ids)
	var ver struct {
		Remote struct{ Commits, Entries int }
	}
	json.Unmarshal([]byte(silt(t, "", archiverEnv(srv, filepath.Join(dir, "final"), remote), "archiver", "verify")), &ver)
	if ver.Remote.Entries == 0 || ver.Remote.Entries*2 > ver.Remote.Commits {
		t.Fatalf("verify %+v: compaction did not keep up (want fewer live segments than half the commits)", ver.Remote)
	}
	report(t, scenario{Name: "compactor racing two archivers, gc beside them", Runs: a1.runs + a2.runs + c.runs,
		Faults: int(races), Detected: int(races), counts: counts})
}

// TestDeepHistory_DropKilledAtAnyMoment: `archiver gc --drop-old-commits`
// against a store 5 ms away per DELETE, killed with SIGKILL after a random
// number of its deletes, again and again: after every kill `archiver
// verify` passes (the chain starts at the checkpoint above what the kill
// left, the rest counted as unchained), a cold read is the whole history,
// and a run to the end leaves unchained only the packed commits compaction
// left live.
func TestDeepHistory_DropKilledAtAnyMoment(t *testing.T) {
	srv := testserver.Redis(t)
	minio, px, remote := minioBehindProxy(t)
	dir := t.TempDir()
	env := func(name string) []string {
		return append(archiverEnv(srv, filepath.Join(dir, name), remote), minio.Env()...)
	}
	ids := feed(t, env("data"), 1500)
	silt(t, "", env("data"), "archiver", "run", "--stream", "events", "--keep-last", "10", "--slice-entries", "3", "--exact")
	// Each packed commit holds its segment: compaction replaces them, so the
	// drop has the old commits to delete.
	silt(t, "", env("data"), "archiver", "compact", "--min-entries", "8")
	time.Sleep(1100 * time.Millisecond)
	silt(t, "", env("data"), "archiver", "gc", "--grace", "1s", "--force") // superseded checkpoints first: the kills land in the drop
	px.Delay("DELETE", 5*time.Millisecond)
	type verified struct {
		Remote struct {
			Commits    int
			ChainStart int `json:"chain_start"`
			Unchained  int
		}
	}
	verify := func(what string) verified {
		t.Helper()
		var r verified
		out := silt(t, "", env(fmt.Sprintf("verify-%d", time.Now().UnixNano())), "archiver", "verify")
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("verify %s: %v: %s", what, err, out)
		}
		return r
	}
	before := verify("before the drop")
	kills, partial := 0, 0
	for attempt := 0; partial < 3; attempt++ {
		if attempt == 12 {
			t.Fatalf("%d kills, %d of them mid-drop: the drop ends before a kill can land", kills, partial)
		}
		cmd := exec.Command(filepath.Join(binDir, "archiver"), "gc", "--grace", "1s", "--force", "--drop-old-commits")
		cmd.Env = append(os.Environ(), env("data")...)
		var errOut strings.Builder
		cmd.Stderr = &errOut
		start := px.Seen("DELETE")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		after := start + 1 + int64(rand.IntN(60)) // some deletes in
		var err error
	wait:
		for {
			select {
			case err = <-done:
				break wait
			case <-time.After(time.Millisecond):
				if px.Seen("DELETE") >= after {
					cmd.Process.Signal(syscall.SIGKILL)
					err = <-done
					break wait
				}
			}
		}
		if err == nil { // it finished before the kill: nothing left to cut short
			if partial == 0 {
				t.Fatalf("the drop finished before %d deletes and no kill had left commits unchained", after-start)
			}
			break
		}
		if !killedBySignal(err, syscall.SIGKILL) {
			t.Fatalf("gc --drop-old-commits: %v\n%s", err, errOut.String())
		}
		kills++
		r := verify(fmt.Sprintf("after kill %d", kills))
		// A kill while the first deletes were held may have deleted nothing:
		// the whole chain then verifies from commit 1.
		if r.Remote.ChainStart+r.Remote.Commits != before.Remote.Commits {
			t.Fatalf("verify after kill %d: %+v; want the chain up to commit %d", kills, r.Remote, before.Remote.Commits)
		}
		if r.Remote.Unchained > 0 {
			partial++
		}
	}
	silt(t, "", env("data"), "archiver", "gc", "--grace", "1s", "--force", "--drop-old-commits")
	final := verify("after the drop finished")
	// What stays below the chain's start: packed commits compaction left
	// (fewer than its --min-entries 8 at the end), whose segments are live.
	if final.Remote.Unchained >= 8 || final.Remote.ChainStart == 0 {
		t.Fatalf("verify after the drop finished: %+v", final.Remote)
	}
	got := coldIDs(t, env("cold"))
	want := ids // the archive and the 10 kept live, merged
	seen := map[string]bool{}
	c := counts{Entries: len(want)}
	for _, id := range got {
		if seen[id] {
			c.Duplicates++
		}
		seen[id] = true
	}
	for _, id := range want {
		if !seen[id] {
			c.Lost++
		}
	}
	report(t, scenario{Name: "gc --drop-old-commits killed after a random number of deletes, verified after each kill", Runs: kills + 1, Faults: kills, counts: c})
	if !slices.Equal(got, want) {
		t.Fatalf("cold read after the drops: %d entries, want the %d appended, in order, once", len(got), len(want))
	}
	t.Logf("%d kills (%d left commits unchained); chain from %d before, %d after", kills, partial, before.Remote.ChainStart, final.Remote.ChainStart)
}
