package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// The archive protocol under seeded fault schedules (the FoundationDB and
// TigerBeetle idea, at our scale). Each seed draws a schedule of appends,
// archive runs (some killed at a random step, some from a fresh data
// directory as a scheduled container would), compaction, gc, cold reads,
// and faults on the remote and on Redis: the bucket rolled back to an
// earlier copy, its newest commit deleted, a watermark forged with a valid
// checksum, a second Redis on the same prefix, Redis restarted empty, an
// adoption. After every step the invariant is checked:
//
//   - a cold read either exits 0 with every entry appended (and not lost
//     to Redis's own restart) exactly once, in order, and nothing foreign,
//     or fails naming why; on a sound remote it never fails;
//   - an archive run on a faulted remote never exits 0 (it would commit or
//     trim by a history it cannot prove), on a sound one never refuses;
//   - every entry above the watermark Redis recorded is still live: no
//     trim above a proven W.
//
// SILT_FAULT_SEEDS=1-200 (or 7,9,12) runs other seeds; a failure prints its
// seed and step log, and the same seed replays the same schedule
// (scripts/faultschedule.sh).

// defaultFaultSeeds run in the test command.
const defaultFaultSeeds = "1-40"

func TestFaultSchedule(t *testing.T) {
	seeds, err := parseSeeds(cmp.Or(os.Getenv("SILT_FAULT_SEEDS"), defaultFaultSeeds))
	if err != nil {
		t.Fatal(err)
	}
	var runs, faults, refused int
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			w := newFaultWorld(t, seed)
			w.play(tier(40, 120))
			runs, faults, refused = runs+w.runs, faults+w.faults, refused+w.refusals
		})
	}
	report(t, scenario{Name: "archive protocol under seeded fault schedules", Runs: runs, Faults: faults, Detected: refused})
}

// parseSeeds reads "1-6" or "3,9,12".
func parseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for _, part := range strings.Split(s, ",") {
		lo, hi, ranged := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.ParseUint(lo, 10, 64)
		b := a
		if err == nil && ranged {
			b, err = strconv.ParseUint(hi, 10, 64)
		}
		if err != nil || b < a {
			return nil, fmt.Errorf("SILT_FAULT_SEEDS=%q: want N, N-M or a comma-separated list", s)
		}
		for n := a; n <= b; n++ {
			out = append(out, n)
		}
	}
	return out, nil
}

// faultWorld is one seed's system: a Redis, a local remote, a warm data
// directory, and what the test knows must be there.
type faultWorld struct {
	t      *testing.T
	seed   uint64
	rng    *rand.Rand
	srv    *testserver.RedisServer
	rdb    *redis.Client
	log    *stream.Log
	remote string // the remote's directory
	warm   string // the warm data directory
	steps  []string

	appended []string        // stream ids, in append order
	allowed  map[string]bool // every id this Redis ever had
	required map[string]bool // ids a complete read must hold (all but those Redis's restart took)
	good     string          // the remote as it was before the fault in force ("": none)
	faulted  string          // the fault in force on the remote ("": sound)
	flushed  bool            // Redis restarted empty and nothing adopted the archive since
	flushW   string          // the W Redis had recorded when it restarted empty
	snaps    []string        // copies of the remote taken after clean runs

	runs, faults, refusals int
}

func newFaultWorld(t *testing.T, seed uint64) *faultWorld {
	srv := testserver.Redis(t)
	w := &faultWorld{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x5117)), srv: srv, rdb: srv.Client(t),
		remote: t.TempDir(), warm: t.TempDir(), allowed: map[string]bool{}, required: map[string]bool{}}
	ks, _ := stream.NewKeyspace("", "cm")
	var err error
	if w.log, err = stream.NewLog(w.rdb, ks, "events", brand.EVT); err != nil {
		t.Fatal(err)
	}
	return w
}

// failf ends the seed with its schedule so far, for replay.
func (w *faultWorld) failf(format string, args ...any) {
	w.t.Helper()
	w.t.Fatalf("seed %d, step %d: %s\nschedule so far (replay: SILT_FAULT_SEEDS=%d go test -run TestFaultSchedule ./e2e):\n  %s",
		w.seed, len(w.steps), fmt.Sprintf(format, args...), w.seed, strings.Join(w.steps, "\n  "))
}

func (w *faultWorld) step(format string, args ...any) {
	w.steps = append(w.steps, fmt.Sprintf(format, args...))
}

func (w *faultWorld) play(n int) {
	for range n {
		switch r := w.rng.IntN(100); {
		case r < 25:
			w.appendSome()
		case r < 50:
			w.archive(false)
		case r < 55:
			w.archiveLoop()
		case r < 62:
			w.maintain()
		case r < 72:
			w.coldRead()
		default:
			w.fault()
		}
		w.checkTrim()
	}
	// The end: repair what is still faulted, adopt after a restart, archive
	// once more and read the whole history cold.
	if w.faulted != "" {
		w.repair()
	}
	for try := 0; w.flushed && try < 3; try++ { // an adoption may be killed
		w.appendSome()
		w.archive(true)
	}
	w.archive(false)
	w.checkTrim()
	if !w.coldRead() && w.faulted == "" && !w.flushed {
		w.failf("the final cold read failed on a sound remote")
	}
}

// appendSome appends 1-40 entries.
func (w *faultWorld) appendSome() {
	n := 1 + w.rng.IntN(40)
	batch := make([]stream.Fields, n)
	for i := range batch {
		batch[i] = stream.Fields{"n": fmt.Sprint(len(w.appended) + i), "seed": fmt.Sprint(w.seed)}
	}
	ids, err := w.log.AppendBatch(context.Background(), batch)
	if err != nil {
		w.failf("append: %v", err)
	}
	for _, id := range ids {
		sid := id.StreamID.String()
		w.appended = append(w.appended, sid)
		w.allowed[sid], w.required[sid] = true, true
	}
	w.step("append %d", n)
}

// env is the archiver's environment against this world's Redis and remote.
func (w *faultWorld) env(dataDir string) []string {
	return []string{"SILT_REDIS_URL=" + w.srv.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events",
		"SILT_DATA_DIR=" + dataDir, "SILT_ARCHIVE_REMOTE=file://" + w.remote, "SILT_CONSISTENCY_WAIT=0s", "SILT_LOG_LEVEL=error"}
}

// archiver runs the archiver and returns its exit code (-1: killed) and stderr.
func (w *faultWorld) archiver(env []string, args ...string) (int, string) {
	cmd := exec.Command(filepath.Join(binDir, "archiver"), args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	transcript.add(out.String(), errOut.String())
	w.runs++
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), errOut.String()
	}
	if err != nil {
		w.failf("archiver %v: %v", args, err)
	}
	return 0, errOut.String()
}

// dataDir is the warm directory, or, as often, a fresh one (a new host).
func (w *faultWorld) dataDir() (string, string) {
	if w.rng.IntN(2) == 0 {
		return w.warm, "warm"
	}
	return w.t.TempDir(), "cold"
}

// killPoints are the archive run's steps a kill may hit.
var killPoints = []string{"after-fold", "segment-uploaded", "commit-put", "head-updated", "after-commit", "after-trim", "checkpoint-put"}

// archive runs `archiver run`, sometimes killed at a step; adopt adds
// --adopt-remote (after Redis's restart).
func (w *faultWorld) archive(adopt bool) {
	dir, temp := w.dataDir()
	env := w.env(dir)
	args := []string{"run", "--stream", "events", "--keep-last", fmt.Sprint(w.rng.IntN(15)), "--slice-entries", fmt.Sprint(3 + w.rng.IntN(20))}
	if args[4] == "0" {
		args[4] = "1"
	}
	if w.rng.IntN(2) == 0 {
		args = append(args, "--exact")
	}
	if adopt {
		args = append(args, "--adopt-remote")
	}
	kill := ""
	if w.rng.IntN(4) == 0 {
		kill = fmt.Sprintf("%s:%d", killPoints[w.rng.IntN(len(killPoints))], 1+w.rng.IntN(3))
		env = append(env, "SILT_FAILPOINT="+kill)
		w.faults++
	}
	code, errOut := w.archiver(env, args...)
	w.step("archive %s %v kill=%q: exit %d %s", temp, args[1:], kill, code, firstLine(errOut))
	switch {
	case code == 0 && w.faulted != "":
		w.failf("archive run exited 0 on a remote with %s", w.faulted)
	case code == 0 && w.flushed && !adopt && w.hasArchive():
		w.failf("archive run exited 0 on an archive Redis lost its record of")
	case code == 0 && adopt:
		w.flushed = false
	case code == -1: // killed; an adoption killed after its record was written took effect
		w.flushed = w.flushed && !(adopt && w.recordLSN() > 0)
	case w.faulted != "" || w.flushed:
		w.refusals++
		if code != 4 && !strings.Contains(errOut, "not proven") && !strings.Contains(errOut, "behind") {
			w.failf("archive run on a faulted remote: exit %d without naming why: %s", code, errOut)
		}
	case code != 0:
		w.failf("archive run on a sound remote: exit %d: %s", code, errOut)
	}
	if code == 0 && w.faulted == "" && !w.flushed {
		snap := w.t.TempDir()
		copyTree(w.t, w.remote, snap)
		w.snaps = append(w.snaps, snap)
	}
}

// archiveLoop runs `archiver run --loop` for a few passes, then stops it
// with SIGTERM or SIGKILL; every pass on a faulted remote must have been
// refused, every pass on a sound one must have worked.
func (w *faultWorld) archiveLoop() {
	dir, temp := w.dataDir()
	cmd := exec.Command(filepath.Join(binDir, "archiver"), "run", "--stream", "events", "--keep-last", fmt.Sprint(1+w.rng.IntN(10)),
		"--slice-entries", fmt.Sprint(3+w.rng.IntN(20)), "--loop", "--every", "50ms")
	cmd.Env = append(os.Environ(), w.env(dir)...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		w.failf("archiver --loop: %v", err)
	}
	time.Sleep(time.Duration(150+w.rng.IntN(450)) * time.Millisecond)
	sig := []os.Signal{syscall.SIGTERM, syscall.SIGKILL}[w.rng.IntN(2)]
	cmd.Process.Signal(sig)
	err := cmd.Wait()
	transcript.add(out.String(), errOut.String())
	w.runs++
	if sig == syscall.SIGKILL {
		w.faults++
	}
	passes, refused := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var sum struct {
			Streams []struct {
				Error    string
				Unproven bool
			}
			Interrupted bool
		}
		if json.Unmarshal([]byte(line), &sum) != nil || len(sum.Streams) == 0 || sum.Interrupted {
			continue // a pass the signal cut short says nothing either way
		}
		passes++
		switch st := sum.Streams[0]; {
		case st.Error == "" && w.faulted != "":
			w.failf("an archive --loop pass worked on a remote with %s", w.faulted)
		case st.Error == "" && w.flushed && w.hasArchive():
			w.failf("an archive --loop pass worked on an archive Redis lost its record of")
		case st.Error != "" && w.faulted == "" && !w.flushed:
			w.failf("an archive --loop pass on a sound remote failed: %s", st.Error)
		case st.Error != "":
			refused++
		}
	}
	w.refusals += refused
	w.step("archive --loop %s stopped by %v after %d passes (%d refused): %v %s", temp, sig, passes, refused, err, firstLine(errOut.String()))
	if code := exitStatus(err); sig == syscall.SIGTERM && code != 0 && code != 3 {
		w.failf("archive --loop stopped by SIGTERM: exit %d", code)
	}
}

// maintain runs compaction or gc (some with --drop-old-commits).
func (w *faultWorld) maintain() {
	dir, temp := w.dataDir()
	args := []string{"compact", "--min-entries", "2"}
	if w.rng.IntN(2) == 0 {
		args = []string{"gc", "--grace", "1s", "--force"}
		if w.rng.IntN(2) == 0 {
			args = append(args, "--drop-old-commits")
		}
	}
	code, errOut := w.archiver(w.env(dir), args...)
	w.step("%s %v: exit %d %s", temp, args, code, firstLine(errOut))
	switch {
	case code == 0 && w.faulted != "":
		w.failf("%s exited 0 on a remote with %s", args[0], w.faulted)
	case code != 0 && w.faulted == "" && !w.flushed:
		w.failf("%s on a sound remote: exit %d: %s", args[0], code, errOut)
	case code != 0:
		w.refusals++
	}
}

// coldRead reads the whole history from a fresh data directory and checks
// it; it reports whether the read exited 0.
func (w *faultWorld) coldRead() bool {
	cmd := exec.Command(filepath.Join(binDir, "archiver"), "read")
	cmd.Env = append(os.Environ(), w.env(w.t.TempDir())...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	transcript.add(out.String(), errOut.String())
	w.runs++
	if err != nil {
		w.step("cold read: %v %s", err, firstLine(errOut.String()))
		if w.faulted == "" && !w.flushed {
			w.failf("cold read of a sound archive failed: %v\n%s", err, errOut.String())
		}
		w.refusals++
		return false
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if line == "" {
			continue
		}
		var rec struct {
			StreamID string `json:"stream_id"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			w.failf("cold read line %q: %v", line, err)
		}
		got = append(got, rec.StreamID)
	}
	w.step("cold read: %d entries", len(got))
	seen := map[string]bool{}
	for i, sid := range got {
		switch {
		case !w.allowed[sid]:
			w.failf("cold read exited 0 with %s, an entry this Redis never had (a foreign history)", sid)
		case seen[sid]:
			w.failf("cold read exited 0 with %s twice", sid)
		case i > 0 && compareSID(got[i-1], sid) >= 0:
			w.failf("cold read exited 0 out of order: %s after %s", sid, got[i-1])
		}
		seen[sid] = true
	}
	for _, sid := range w.appended {
		if w.required[sid] && !seen[sid] {
			w.failf("cold read exited 0 without %s (%d of %d required entries): a short history", sid, len(got), countTrue(w.required))
		}
	}
	return true
}

// checkTrim checks that every required entry above the watermark Redis
// recorded is still live: nothing was trimmed above a proven W.
func (w *faultWorld) checkTrim() {
	ctx := context.Background()
	rec, ok, err := w.log.ArchiveRecord(ctx)
	if err != nil {
		w.failf("archive record: %v", err)
	}
	recW := w.flushW
	if ok && rec.W != "" {
		recW = rec.W
	}
	live := map[string]bool{}
	for _, m := range w.rdb.XRange(ctx, w.log.Key(), "-", "+").Val() {
		live[m.ID] = true
	}
	for _, sid := range w.appended {
		if w.required[sid] && (recW == "" || compareSID(sid, recW) > 0) && !live[sid] {
			w.failf("entry %s is above the recorded W %q and no longer live: trimmed above a proven W", sid, recW)
		}
	}
}

// fault injects one fault on the remote or on Redis.
func (w *faultWorld) fault() {
	if w.faulted != "" {
		if w.rng.IntN(2) == 0 {
			w.repair()
		}
		return
	}
	// The remote is behind Redis's record only when it lost a recorded
	// commit: a copy from before the record, or the recorded head deleted.
	head, recorded := remoteHead(w.remote), w.recordLSN()
	switch r := w.rng.IntN(6); {
	case r == 0 && len(w.snaps) > 1:
		snap := w.snaps[w.rng.IntN(len(w.snaps)-1)]
		if remoteHead(snap) < recorded {
			w.hold("the bucket rolled back")
			copyTree(w.t, snap, w.remote)
		}
	case r == 1 && head > 0 && head == recorded && !hasCheckpoint(w.remote, head): // a checkpoint at head carries its commit
		w.hold("its newest commit deleted")
		os.Remove(commitPath(w.remote, head))
	case r == 2 && head > 0 && !hasCheckpoint(w.remote, head): // a checkpoint at head carries the commit, as written
		w.hold("a forged watermark")
		if !w.forge(head) {
			w.faulted, w.good, w.faults = "", "", w.faults-1 // nothing to forge: no fault
			w.step("(no commit to forge)")
		}
	case r == 3 && w.hasRecord():
		w.secondRedis()
	case r == 4:
		w.restartEmpty()
	case r == 5 && w.flushed:
		w.archive(true)
	}
}

// hold marks the remote faulted, keeping its sound copy for the repair.
func (w *faultWorld) hold(fault string) {
	w.good = w.t.TempDir()
	copyTree(w.t, w.remote, w.good)
	w.faulted = fault
	w.faults++
	w.step("fault: %s", fault)
}

// repair puts the sound copy of the remote back.
func (w *faultWorld) repair() {
	copyTree(w.t, w.good, w.remote)
	w.step("repair: %s undone", w.faulted)
	w.faulted, w.good = "", ""
}

// forge raises the watermark of the newest commit (a packed one) to the
// newest appended id, with its checksum line recomputed.
func (w *faultWorld) forge(head uint64) bool {
	path := commitPath(w.remote, head)
	obj, err := os.ReadFile(path)
	if err != nil || len(w.appended) == 0 {
		return false
	}
	forged, ok := testserver.ForgeWatermark(obj, w.appended[len(w.appended)-1])
	if !ok {
		return false
	}
	return os.WriteFile(path, forged, 0o644) == nil
}

// secondRedis is another Redis with a stream of the same name archiving to
// and reading from this world's remote: both must be refused, and its
// stream keep every entry.
func (w *faultWorld) secondRedis() {
	other := testserver.Redis(w.t)
	ks, _ := stream.NewKeyspace("", "cm")
	l, _ := stream.NewLog(other.Client(w.t), ks, "events", brand.EVT)
	if _, err := l.AppendBatch(context.Background(), []stream.Fields{{"n": "foreign"}, {"n": "foreign"}}); err != nil {
		w.failf("second Redis: %v", err)
	}
	w.faults++
	env := []string{"SILT_REDIS_URL=" + other.URL(), "SILT_QUEUE=cm", "SILT_STREAM=events", "SILT_DATA_DIR=" + w.t.TempDir(),
		"SILT_ARCHIVE_REMOTE=file://" + w.remote, "SILT_CONSISTENCY_WAIT=0s"}
	runCode, runErr := w.archiver(env, "run", "--stream", "events", "--keep-last", "1", "--exact")
	readCode, readErr := w.archiver(env, "read")
	w.step("fault: a second Redis on the prefix: run exit %d, read exit %d", runCode, readCode)
	if runCode != 4 || readCode != 4 {
		w.failf("a second Redis on the same prefix: run exit %d (%s), read exit %d (%s); want both refused (4)",
			runCode, firstLine(runErr), readCode, firstLine(readErr))
	}
	if n := other.Client(w.t).XLen(context.Background(), l.Key()).Val(); n != 2 {
		w.failf("the second Redis's stream holds %d of 2", n)
	}
	w.refusals += 2
}

// restartEmpty restarts Redis without persistence: the live entries and the
// archive's record are gone (lost to the restart, not to silt); what the
// record proved archived stays required.
func (w *faultWorld) restartEmpty() {
	ctx := context.Background()
	rec, ok, _ := w.log.ArchiveRecord(ctx)
	w.srv.Restart(w.t) // same port: the producer's client reconnects, its minter goes on
	w.rdb.Ping(ctx)    // the pool's old connections fail once
	w.flushW = ""
	if ok {
		w.flushW = rec.W
	}
	for _, sid := range w.appended {
		if w.flushW == "" || compareSID(sid, w.flushW) > 0 {
			delete(w.required, sid)
		}
	}
	w.flushed = w.flushed || w.hasArchive()
	w.faults++
	w.step("fault: Redis restarted empty (record W %q)", rec.W)
}

func (w *faultWorld) hasRecord() bool { return w.recordLSN() > 0 }

func (w *faultWorld) recordLSN() uint64 {
	rec, ok, err := w.log.ArchiveRecord(context.Background())
	if err != nil || !ok {
		return 0
	}
	return rec.LSN
}

func (w *faultWorld) hasArchive() bool { return remoteHead(w.remote) > 0 }

// remoteHead is the highest commit LSN in a local remote's directory.
func remoteHead(dir string) uint64 {
	var head uint64
	matches, _ := filepath.Glob(filepath.Join(dir, "*", "commits", "*"))
	for _, m := range matches {
		if n, err := strconv.ParseUint(filepath.Base(m), 10, 64); err == nil {
			head = max(head, n)
		}
	}
	return head
}

// hasCheckpoint reports whether the remote holds a checkpoint at lsn (its
// root carries the commit byte for byte).
func hasCheckpoint(dir string, lsn uint64) bool {
	matches, _ := filepath.Glob(filepath.Join(dir, "*", "checkpoints", fmt.Sprintf("%020d", uint64(math.MaxUint64)-lsn)))
	return len(matches) > 0
}

func commitPath(dir string, lsn uint64) string {
	matches, _ := filepath.Glob(filepath.Join(dir, "*", "commits", fmt.Sprintf("%020d", lsn)))
	if len(matches) == 0 {
		return ""
	}
	return matches[0]
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.RemoveAll(dst); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
}

func compareSID(a, b string) int {
	x, errA := brand.ParseStreamID(a)
	y, errB := brand.ParseStreamID(b)
	if errA != nil || errB != nil {
		return strings.Compare(a, b)
	}
	return x.Compare(y)
}

func countTrue(m map[string]bool) int {
	n := 0
	for _, v := range m {
		if v {
			n++
		}
	}
	return n
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	if len(line) > 300 {
		line = line[:300] + "..."
	}
	return line
}
