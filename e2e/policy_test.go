package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/silt-dev/silt/internal/testing/testserver"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// TestPolicy_DeclaredRetentionUnderOneDriver is issue 20's user path: four
// streams of one queue, kept by count, kept by age, trim-only and
// undeclared, under one `archiver run --all --loop --every 1s` on MinIO
// while producers append to all four. Each holds what its policy says; the
// archived ones read back whole through the merged read; the trim-only one
// lost only its oldest entries beyond its count; the undeclared one is
// untouched; the statuses show each policy and its last run.
func TestPolicy_DeclaredRetentionUnderOneDriver(t *testing.T) {
	srv := testserver.Redis(t)
	minio := testserver.MinIO(t)
	dir := t.TempDir()
	remote := minio.URL(minio.CreateBucket(t), "policies")
	env := []string{"SILT_REDIS_URL=" + srv.URL(), "SILT_QUEUE=pq", "SILT_DATA_DIR=" + filepath.Join(dir, "data"), "SILT_ARCHIVE_REMOTE=" + remote}
	env = append(env, minio.Env()...)
	declare := func(name string, args ...string) {
		out := silt(t, "", env, "archiver", append([]string{"policy", "set", "--stream", name}, args...)...)
		if !strings.Contains(out, `"stream":"`+name+`"`) {
			t.Fatalf("policy set %s: %s", name, out)
		}
	}
	declare("bycount", "--keep-last", "50", "--exact")
	declare("byage", "--keep-for", "2s", "--exact")
	declare("scratch", "--keep-last", "30", "--exact", "--no-archive")
	// "untouched" declares nothing.
	if code, _, errOut := exitCode(t, env, "", "archiver", "policy", "set", "--stream", "x"); code != 2 || !strings.Contains(errOut, "--keep-last") {
		t.Fatalf("policy set without a policy: exit %d, %s", code, errOut)
	}

	names := []string{"bycount", "byage", "scratch", "untouched"}
	ks, _ := stream.NewKeyspace("", "pq")
	var mu sync.Mutex
	appended := map[string][]string{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, name := range names {
		l, err := stream.NewLog(srv.Universal(t), ks, name, brand.EVT)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				ids, err := l.AppendBatch(ctx, []stream.Fields{{"n": fmt.Sprint(n)}, {"n": fmt.Sprint(n), "k": "2"}})
				mu.Lock()
				for _, id := range ids {
					appended[name] = append(appended[name], id.String())
				}
				mu.Unlock()
				if err != nil && ctx.Err() == nil {
					t.Errorf("append to %s: %v", name, err)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	driver := exec.Command(filepath.Join(binDir, "archiver"), "run", "--all", "--loop", "--every", "1s", "--slice-entries", "40")
	driver.Env = append(os.Environ(), env...)
	var dout lockedBuffer
	var derr strings.Builder
	driver.Stdout, driver.Stderr = &dout, &derr
	if err := driver.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	// Stop the producers, let the driver make two more passes, stop it.
	cancel()
	wg.Wait()
	atStop := strings.Count(dout.String(), "\n")
	for deadline := time.Now().Add(20 * time.Second); strings.Count(dout.String(), "\n") < atStop+2 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	driver.Process.Signal(syscall.SIGTERM)
	werr := driver.Wait()
	transcript.add(dout.String(), derr.String())
	if code := exitStatus(werr); code != 0 && code != 3 {
		t.Fatalf("the driver: %v\n%s", werr, derr.String())
	}
	passes := strings.Count(dout.String(), "\n")
	if passes < 3 || strings.Contains(dout.String(), `"error"`) {
		t.Fatalf("the driver ran %d passes: %s", passes, dout.String())
	}
	if !strings.Contains(dout.String(), `"stream":"untouched","policy":"none: undeclared"`) {
		t.Fatalf("the driver's summary does not list the undeclared stream as such: %s", dout.String())
	}

	rdb := srv.Universal(t)
	xlen := func(name string) int64 {
		n, err := rdb.XLen(context.Background(), ks.Stream(name)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	readAll := func(name string) []string {
		var ids []string
		out := silt(t, "", append(env, "SILT_STREAM="+name, "SILT_DATA_DIR="+filepath.Join(dir, "read-"+name)), "archiver", "read", "--format", "text")
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			ids = append(ids, strings.Fields(line)[0])
		}
		return ids
	}
	// Kept by count: 50 live, the rest archived, all of it readable.
	if n := xlen("bycount"); n != 50 {
		t.Fatalf("bycount holds %d live entries, its policy keeps 50", n)
	}
	if got := readAll("bycount"); !slices.Equal(got, appended["bycount"]) {
		t.Fatalf("bycount merged read: %d entries, %d appended", len(got), len(appended["bycount"]))
	}
	// Kept by age: nothing live older than 2 s (and the driver's beat), all readable.
	first, err := rdb.XRange(context.Background(), ks.Stream("byage"), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(first) > 0 {
		sid, _ := brand.ParseStreamID(first[0].ID)
		if age := time.Since(sid.Time()); age > 2*time.Second+3500*time.Millisecond {
			t.Fatalf("byage's oldest live entry is %s old, its policy keeps 2s", age)
		}
	}
	if got := readAll("byage"); !slices.Equal(got, appended["byage"]) {
		t.Fatalf("byage merged read: %d entries, %d appended", len(got), len(appended["byage"]))
	}
	// Trim only: exactly the newest 30, nothing archived.
	live, err := rdb.XRange(context.Background(), ks.Stream("scratch"), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	all := appended["scratch"]
	if len(live) != 30 || live[0].ID != mustSID(t, all[len(all)-30]) {
		t.Fatalf("scratch holds %d entries (from %s), its policy keeps the newest 30 (from %s)", len(live), live[0].ID, mustSID(t, all[len(all)-30]))
	}
	// Undeclared: untouched.
	if n := xlen("untouched"); n != int64(len(appended["untouched"])) {
		t.Fatalf("untouched holds %d of its %d entries: an undeclared stream was trimmed", n, len(appended["untouched"]))
	}

	// policy ls: three policies, each with a last run.
	ls := strings.Split(strings.TrimSpace(silt(t, "", env, "archiver", "policy", "ls")), "\n")
	if len(ls) != 3 {
		t.Fatalf("policy ls: %d lines, want 3:\n%s", len(ls), strings.Join(ls, "\n"))
	}
	for _, line := range ls {
		var p struct {
			Stream  string
			LastRun *struct{ At time.Time } `json:"last_run"`
		}
		json.Unmarshal([]byte(line), &p)
		if p.LastRun == nil || time.Since(p.LastRun.At) > time.Minute {
			t.Fatalf("policy ls: %s has no recent last run: %s", p.Stream, line)
		}
	}
	// The statuses say the policy and its last run.
	if out := silt(t, "", append(env, "SILT_STREAM=bycount"), "archiver", "status"); !strings.Contains(out, "--keep-last 50 --exact --archive, last ran") {
		t.Fatalf("archiver status: %s", out)
	}
	if out := silt(t, "", append(env, "SILT_STREAM=scratch"), "worker", "status"); !strings.Contains(out, "--keep-last 30 --exact --no-archive") || !strings.Contains(out, "policy last ran") {
		t.Fatalf("worker status: %s", out)
	}
	if out := silt(t, "", append(env, "SILT_STREAM=untouched"), "worker", "status"); !strings.Contains(out, "none declared") {
		t.Fatalf("worker status of an undeclared stream: %s", out)
	}
	// A one-off run whose flags contradict a declared policy is refused; the
	// same flags on an undeclared stream apply.
	if code, _, errOut := exitCode(t, env, "", "archiver", "run", "--stream", "bycount", "--keep-last", "10"); code != 1 || !strings.Contains(errOut, "declares --keep-last 50") {
		t.Fatalf("run with flags against a declared policy: exit %d, %s", code, errOut)
	}
	silt(t, "", env, "archiver", "run", "--stream", "untouched", "--keep-last", "10", "--exact")
	if n := xlen("untouched"); n != 10 {
		t.Fatalf("a one-off run on the undeclared stream left %d live, want 10", n)
	}
	// Removing a policy leaves the stream alone from then on.
	silt(t, "", env, "archiver", "policy", "rm", "--stream", "scratch")
	out := silt(t, "", env, "archiver", "run", "--all")
	if !strings.Contains(out, `"stream":"scratch","policy":"none: undeclared"`) {
		t.Fatalf("run --all after policy rm: %s", out)
	}
}

func mustSID(t *testing.T, branded string) string {
	t.Helper()
	id, err := brand.Parse(branded)
	if err != nil {
		t.Fatal(err)
	}
	return id.StreamID.String()
}

// lockedBuffer is a strings.Builder a child process writes to while the
// test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
