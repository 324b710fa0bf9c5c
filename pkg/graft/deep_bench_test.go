package graft

import (
	"context"
	"encoding/json"
	"fmt"
	"math/bits"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/fence"
)

// Deep history (BENCHMARKS.md D1-D4): archives of 1k to 1M
// commits of 10 records each, built through Volume.Commit (its local files
// discarded: only the remote is kept; superseded checkpoint nodes are
// collected as the build goes, as gc would), then opened cold by child
// processes that count their object requests and report their peak RSS;
// then compacted (64 MiB target), collected (gc), verified (every commit
// kept), collected again (gc --drop-old-commits) and the objects counted.
//
//	TMPDIR=/dev/shm SILT_DEEP_SIZES=1000,10000,100000,1000000 \
//	  go test -run '^$' -bench DeepHistory -benchtime 1x -timeout 90m ./pkg/graft
//
// Archives are built under $TMPDIR/silt-deep-<n> and removed at the end.
func BenchmarkDeepHistory(b *testing.B) {
	sizes := os.Getenv("SILT_DEEP_SIZES")
	if sizes == "" {
		sizes = "1000,10000,100000"
	}
	var rows []deepResult
	for _, f := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(f)
		if err != nil {
			b.Fatal(err)
		}
		remote := filepath.Join(os.TempDir(), fmt.Sprintf("silt-deep-%d", n))
		built := time.Now()
		if err := buildDeep(remote, n); err != nil {
			b.Fatal(err)
		}
		b.Logf("%d commits ready in %s", n, time.Since(built).Round(time.Millisecond))
		for _, mode := range []string{"reader", "writer", "compact"} {
			r, err := runDeepChild(remote, mode)
			if err != nil {
				b.Fatal(err)
			}
			r.Commits, r.Mode = n, mode
			rows = append(rows, r)
		}
		os.RemoveAll(remote)
	}
	b.StopTimer()
	base := map[string]int64{}
	fmt.Printf("\n| commits | process | open requests | open ms | window requests | 2*log2(segments) | peak RSS MiB | RSS / first |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.Mode == "compact" {
			continue
		}
		if base[r.Mode] == 0 {
			base[r.Mode] = r.RSS
		}
		fmt.Printf("| %d | %s | %d | %.1f | %d | %d | %.1f | %.2f |\n", r.Commits, r.Mode, r.OpenRequests, r.OpenMS,
			r.WindowRequests, 2*bits.Len(uint(r.Commits)), float64(r.RSS)/1024, float64(r.RSS)/float64(base[r.Mode]))
	}
	fmt.Printf("\n| commits | segment bytes | segments before | after compaction and gc: segments | commit objects | checkpoint objects | compaction s | verify s | peak RSS MiB: open and compaction | then gc | then verify | then drop old commits |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.Mode == "compact" {
			fmt.Printf("| %d | %d | %d | %d | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", r.Commits, r.SegmentBytes, r.SegmentsBefore, r.Segments,
				r.CommitObjects, r.CheckpointObjects, r.CompactMS/1000, r.VerifyMS/1000, float64(r.RSSCompact)/1024, float64(r.RSSGC)/1024,
				float64(r.RSSVerify)/1024, float64(r.RSS)/1024)
		}
	}
}

// vmHWM returns this process's peak resident set in KiB (0 if unknown).
func vmHWM() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

type deepResult struct {
	Mode           string  `json:"mode"`
	Commits        int     `json:"commits"`
	OpenRequests   int64   `json:"open_requests"`
	OpenMS         float64 `json:"open_ms"`
	WindowRequests int64   `json:"window_requests"`
	RSS            int64   `json:"rss_kib"`
	// compact mode
	SegmentBytes      int64   `json:"segment_bytes"`
	SegmentsBefore    int     `json:"segments_before"`
	Segments          int     `json:"segments"`
	CommitObjects     int     `json:"commit_objects"`
	CheckpointObjects int     `json:"checkpoint_objects"`
	CompactMS         float64 `json:"compact_ms"`
	RSSCompact        int64   `json:"rss_compact_kib"` // peak RSS after the open and the compaction
	RSSGC             int64   `json:"rss_gc_kib"`      // after gc too
	RSSVerify         int64   `json:"rss_verify_kib"`  // after verify too (then --drop-old-commits: RSS)
	VerifyMS          float64 `json:"verify_ms"`
	HeapSysMiB        float64 `json:"heap_sys_mib"`
	GoSysMiB          float64 `json:"go_sys_mib"`
}

// discardFS drops the generator's local files: only the remote matters.
type discardFS struct{}

type discardFile struct{ name string }

func (discardFile) Write(b []byte) (int, error) { return len(b), nil }
func (discardFile) Sync() error                 { return nil }
func (discardFile) Close() error                { return nil }
func (f discardFile) Name() string              { return f.name }

func (discardFS) CreateTemp(dir, pattern string) (writable, error) {
	return discardFile{filepath.Join(dir, "discarded")}, nil
}
func (discardFS) Rename(from, to string) error { return nil }
func (discardFS) SyncDir(dir string) error     { return nil }

// buildDeep makes (or finds) a remote of n commits, each writing 10
// record-sized pages above the last, with meta n = the commit number.
func buildDeep(remote string, n int) error {
	done := filepath.Join(remote, ".built")
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	os.RemoveAll(remote)
	st, err := fence.OpenLocal(remote)
	if err != nil {
		return err
	}
	ctx := context.Background()
	data, err := os.MkdirTemp("", "silt-deep-data")
	if err != nil {
		return err
	}
	defer os.RemoveAll(data)
	v, err := OpenWith(ctx, data, "vol", st, Options{KeepMeta: []string{"n"}})
	if err != nil {
		return err
	}
	v.fs = discardFS{}
	pages := make([]Page, 10)
	for i := 1; i <= n; i++ {
		for j := range pages {
			pages[j] = Page{No: 1<<62 + uint64((i-1)*10+j), Data: fmt.Appendf(nil, "record %d of commit %d, about a hundred bytes of an entry's fields ............", j, i)}
		}
		if _, err := v.Commit(ctx, pages, map[string]string{"n": fmt.Sprintf("%012d", i)}); err != nil {
			return err
		}
		if i%20000 == 0 { // what gc does to superseded checkpoint nodes, so tmpfs holds a million commits
			k, err := v.keptRoots(ctx, 0)
			if err != nil {
				return err
			}
			if _, err := v.gcCheckpoints(ctx, k, 0); err != nil {
				return err
			}
		}
	}
	return os.WriteFile(done, nil, 0o644)
}

// CountingStore wraps a store and counts requests by kind (a test helper,
// exported to the graft_test package through this test file).
type CountingStore struct {
	fence.Store
	Creates, Gets, Lists atomic.Int64
	FullLists            atomic.Int64 // lists of a whole prefix (no limit, or a walk's page)
}

func (c *CountingStore) Create(ctx context.Context, k string, b []byte) error {
	c.Creates.Add(1)
	return c.Store.Create(ctx, k, b)
}

// CreateFile counts a create from a file and keeps the inner store's
// streaming (a compaction's merged segment is never held in memory).
func (c *CountingStore) CreateFile(ctx context.Context, k, path string, size int64, sum string) error {
	c.Creates.Add(1)
	return fence.CreateFromFile(ctx, c.Store, k, path, size, sum)
}

func (c *CountingStore) Get(ctx context.Context, k string, r fence.Range) ([]byte, error) {
	c.Gets.Add(1)
	return c.Store.Get(ctx, k, r)
}

func (c *CountingStore) List(ctx context.Context, p, a string, n int) ([]string, error) {
	c.Lists.Add(1)
	if n == 0 || n >= 1000 { // no limit, or a page of a walk over the whole prefix
		c.FullLists.Add(1)
	}
	return c.Store.List(ctx, p, a, n)
}

// Reset zeroes the counts.
func (c *CountingStore) Reset() {
	c.Creates.Store(0)
	c.Gets.Store(0)
	c.Lists.Store(0)
	c.FullLists.Store(0)
}

// Requests is every request counted.
func (c *CountingStore) Requests() int64 { return c.Creates.Load() + c.Gets.Load() + c.Lists.Load() }

func runDeepChild(remote, mode string) (deepResult, error) {
	var r deepResult
	cmd := exec.Command(os.Args[0], "-test.run=^TestDeepChild$")
	cmd.Env = append(os.Environ(), "SILT_DEEP_CHILD="+mode, "SILT_DEEP_REMOTE="+remote)
	out, err := cmd.Output()
	if err != nil {
		return r, fmt.Errorf("deep child %s: %w\n%s", mode, err, out)
	}
	line := out
	if i := strings.Index(string(out), "{"); i >= 0 {
		line = out[i:]
		if j := strings.Index(string(line), "\n"); j >= 0 {
			line = line[:j]
		}
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return r, fmt.Errorf("deep child %s: %w: %s", mode, err, out)
	}
	// The child's own high-water mark (VmHWM): its rusage maxrss would
	// include the parent's, whose memory a vfork-style exec shares.
	if r.RSS == 0 {
		r.RSS = cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss
	}
	fmt.Fprintf(os.Stderr, "deep child %s: %s\n", mode, line)
	return r, nil
}

// TestDeepChild is the measured process: a cold open, then a window read
// (the commit in the middle, found by its meta as the archive finds a
// time), and for the writer one more commit.
func TestDeepChild(t *testing.T) {
	mode := os.Getenv("SILT_DEEP_CHILD")
	if mode == "" {
		t.Skip("the child of BenchmarkDeepHistory")
	}
	st, err := fence.OpenLocal(os.Getenv("SILT_DEEP_REMOTE"))
	if err != nil {
		t.Fatal(err)
	}
	cs := &CountingStore{Store: st}
	ctx := context.Background()
	start := time.Now()
	v, err := OpenWith(ctx, t.TempDir(), "vol", cs, Options{KeepMeta: []string{"n"}})
	if err != nil {
		t.Fatal(err)
	}
	r := deepResult{Mode: mode, OpenRequests: cs.Requests(), OpenMS: float64(time.Since(start).Microseconds()) / 1000}
	cs.Reset()
	target := fmt.Sprintf("%012d", v.Head()/2)
	for c, err := range v.Entries(ctx, func(m map[string]string) bool { return m["n"] < target }) {
		if err != nil {
			t.Fatal(err)
		}
		seg, err := v.Segment(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := seg.Lookup(seg.Pages()[0]); err != nil {
			t.Fatal(err)
		}
		break
	}
	r.WindowRequests = cs.Requests()
	if mode == "compact" {
		count := func(dir string) int {
			keys, err := st.List(ctx, "vol/"+dir+"/", "", 0)
			if err != nil {
				t.Fatal(err)
			}
			return len(keys)
		}
		s := v.Stats()
		r.SegmentBytes, r.SegmentsBefore = s.Bytes, int(s.Entries)
		start := time.Now()
		if _, err := v.Compact(ctx, CompactOptions{MaxBytes: 1 << 40}); err != nil {
			t.Fatal(err)
		}
		r.CompactMS = float64(time.Since(start).Microseconds()) / 1000
		r.RSSCompact = vmHWM()
		if _, err := v.GC(ctx, 0, true); err != nil {
			t.Fatal(err)
		}
		r.RSSGC = vmHWM()
		start = time.Now()
		if _, err := v.VerifyRemote(ctx); err != nil { // every commit kept: the whole chain
			t.Fatal(err)
		}
		r.VerifyMS, r.RSSVerify = float64(time.Since(start).Microseconds())/1000, vmHWM()
		if _, err := v.DropOldCommits(ctx, 0, true, 0); err != nil { // gc --drop-old-commits
			t.Fatal(err)
		}
		r.Segments, r.CommitObjects = count("segments"), count("commits")
		r.CheckpointObjects = count("checkpoints") + count("index") + count("branches")
	}
	if mode == "writer" {
		top := v.Head() * 10
		if _, err := v.Commit(ctx, []Page{{No: 1<<62 + top + 1000, Data: []byte("one more")}}, map[string]string{"n": "999999999999"}); err != nil {
			t.Fatal(err)
		}
	}
	r.RSS = vmHWM()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.HeapSysMiB, r.GoSysMiB = float64(ms.HeapSys)/(1<<20), float64(ms.Sys)/(1<<20)
	if path := os.Getenv("SILT_DEEP_HEAPPROFILE"); path != "" {
		f, _ := os.Create(path + "." + mode)
		pprof.WriteHeapProfile(f)
		f.Close()
	}
	b, _ := json.Marshal(r)
	fmt.Printf("%s\n", b)
}
