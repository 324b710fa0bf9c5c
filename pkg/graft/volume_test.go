package graft_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/graft"
)

// counting wraps a store and counts requests by kind.
type counting = graft.CountingStore

func newStore(t *testing.T) *fence.Local {
	t.Helper()
	st, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func openVolume(t *testing.T, dir string, st fence.Store) *graft.Volume {
	t.Helper()
	v, err := graft.Open(context.Background(), dir, "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// openUnpacked opens a volume that writes format 1 commits (a segment
// object, then the commit object), as on an encrypted store.
func openUnpacked(t *testing.T, dir string, st fence.Store) *graft.Volume {
	t.Helper()
	v, err := graft.OpenWith(context.Background(), dir, "vol", st, graft.Options{Unpacked: true})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func read(t *testing.T, v *graft.Volume, lsn, no uint64) string {
	t.Helper()
	b, err := v.ReadAt(context.Background(), lsn, no)
	if err != nil {
		t.Fatalf("ReadAt(%d, %d): %v", lsn, no, err)
	}
	return string(b)
}

const archiveBase = 1 << 63

func TestVolume_BusinessAndArchivePagesWithSnapshots(t *testing.T) {
	st := newStore(t)
	dir := t.TempDir()
	v := openVolume(t, dir, st)
	ctx := context.Background()
	commit := func(pages ...graft.Page) {
		t.Helper()
		if _, err := v.Commit(ctx, pages, map[string]string{"n": fmt.Sprint(v.Head() + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	commit(graft.Page{No: 1, Data: []byte("balance 10")}, graft.Page{No: archiveBase, Data: []byte("rec 0")})
	commit(graft.Page{No: 1, Data: []byte("balance 20")}, graft.Page{No: 2, Data: []byte("other")}, graft.Page{No: archiveBase + 1, Data: []byte("rec 1")})
	commit(graft.Page{No: 1, Data: []byte("balance 30")})
	if got := read(t, v, 3, 1); got != "balance 30" {
		t.Fatalf("latest business page = %q", got)
	}
	if got := read(t, v, 1, 1); got != "balance 10" {
		t.Fatalf("snapshot 1 = %q", got)
	}
	if got := read(t, v, 2, 1); got != "balance 20" {
		t.Fatalf("snapshot 2 = %q", got)
	}
	if got := read(t, v, 3, archiveBase+1); got != "rec 1" {
		t.Fatalf("archive page = %q", got)
	}
	if _, err := v.ReadAt(ctx, 1, 2); !errors.Is(err, graft.ErrPageNotFound) {
		t.Fatalf("page 2 at LSN 1: %v", err)
	}
	if v.Latest().Meta["n"] != "3" {
		t.Fatalf("meta %v", v.Latest().Meta)
	}
	// A fresh data directory opens from the remote alone (cold start).
	cold := openVolume(t, t.TempDir(), st)
	if cold.Head() != 3 || read(t, cold, 2, 1) != "balance 20" || read(t, cold, 3, archiveBase) != "rec 0" {
		t.Fatalf("cold start: head %d", cold.Head())
	}
	// The first handle's directory reopens from its local files.
	again := openVolume(t, dir, st)
	if again.Head() != 3 || read(t, again, 1, 1) != "balance 10" {
		t.Fatalf("reopen: head %d", again.Head())
	}
}

func TestVolume_RequestsPerCommitAndNoListInSteadyState(t *testing.T) {
	st := &counting{Store: newStore(t)}
	dir := t.TempDir()
	v := openVolume(t, dir, st)
	v.Commit(context.Background(), []graft.Page{{No: 1, Data: []byte("a")}}, nil)
	st.Creates.Store(0)
	st.Gets.Store(0)
	st.Lists.Store(0)
	const commits = 20
	for i := range commits {
		if _, err := v.Commit(context.Background(), []graft.Page{{No: uint64(i + 2), Data: []byte("x")}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	perCommit := float64(st.Creates.Load()+st.Gets.Load()+st.Lists.Load()) / commits
	t.Logf("requests per commit: %.2f (creates %d, gets %d, lists %d)", perCommit, st.Creates.Load(), st.Gets.Load(), st.Lists.Load())
	// One object per commit (packed), and three per checkpoint (leaf,
	// branch, root) every CheckpointEvery commits.
	if perCommit > 1+3.0/graft.CheckpointEvery+0.01 || st.Lists.Load() != 0 || st.Gets.Load() != 0 {
		t.Fatalf("%.2f requests per commit, %d lists, %d gets; want <= 1.2, 0 and 0", perCommit, st.Lists.Load(), st.Gets.Load())
	}
	// Reopening with a local head asks for the newest checkpoint key (one
	// LIST of one key) and probes forward; it never lists the commits.
	st.Lists.Store(0)
	st.FullLists.Store(0)
	openVolume(t, dir, st)
	if st.Lists.Load() != 1 || st.FullLists.Load() != 0 {
		t.Fatalf("reopen with a local head: %d lists, %d of a whole prefix; want 1 and 0", st.Lists.Load(), st.FullLists.Load())
	}
}

func TestVolume_LostRaceAdoptsWinner(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	a := openVolume(t, t.TempDir(), st)
	b := openVolume(t, t.TempDir(), st)
	if _, err := a.Commit(ctx, []graft.Page{{No: 1, Data: []byte("from a")}}, nil); err != nil {
		t.Fatal(err)
	}
	_, err := b.Commit(ctx, []graft.Page{{No: 1, Data: []byte("from b")}}, nil)
	var ce *graft.ConflictError
	if !errors.As(err, &ce) || ce.LSN != 1 || ce.Winner.Writer != a.Writer() {
		t.Fatalf("b's commit = %v, want a ConflictError naming a's commit", err)
	}
	if b.Head() != 1 || read(t, b, 1, 1) != "from a" {
		t.Fatalf("b did not adopt the winner: head %d", b.Head())
	}
	if _, err := b.Commit(ctx, []graft.Page{{No: 2, Data: []byte("b again")}}, nil); err != nil {
		t.Fatalf("b after adopting: %v", err)
	}
}

func TestVolume_ConcurrentWritersNeverCorrupt(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	const writers, each = 4, 10
	var wg sync.WaitGroup
	var won, lost atomic.Int64
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := graft.Open(ctx, t.TempDir(), "vol", st)
			if err != nil {
				t.Error(err)
				return
			}
			for i := range each {
				_, err := v.Commit(ctx, []graft.Page{{No: uint64(w*100 + i), Data: []byte(fmt.Sprintf("w%d-%d", w, i))}}, nil)
				switch {
				case graft.IsConflict(err):
					lost.Add(1)
				case err != nil:
					t.Error(err)
					return
				default:
					won.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	v := openVolume(t, t.TempDir(), st)
	if v.Head() != uint64(won.Load()) {
		t.Fatalf("head %d, %d commits won", v.Head(), won.Load())
	}
	if _, err := v.VerifyRemote(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d commits won, %d races lost", won.Load(), lost.Load())
}

func TestVolume_VerifyAndPullRepair(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	dir := t.TempDir()
	v := openVolume(t, dir, st)
	for i := range 3 {
		v.Commit(ctx, []graft.Page{{No: uint64(i), Data: bytes.Repeat([]byte{byte('a' + i)}, 100)}}, nil)
	}
	if rep, err := v.VerifyRemote(ctx); err != nil || rep.Commits != 3 || rep.Pages != 3 {
		t.Fatalf("VerifyRemote: %+v %v", rep, err)
	}
	if _, err := v.VerifyLocal(ctx); err != nil {
		t.Fatal(err)
	}
	// Corrupt the local copy of commit 2's segment.
	seg := commitAt(t, v, 2).Segment.Key
	local := filepath.Join(dir, "vol", "segments", filepath.Base(seg))
	flip(t, local, 50)
	v2 := openVolume(t, dir, st)
	if _, err := v2.VerifyLocal(ctx); !errors.Is(err, graft.ErrCorrupt) || !strings.Contains(err.Error(), local) {
		t.Fatalf("VerifyLocal of a corrupt file = %v, want it named", err)
	}
	if _, err := v2.Read(ctx, 1); !errors.Is(err, graft.ErrCorrupt) {
		t.Fatalf("Read of a corrupt page = %v", err)
	}
	if _, err := v2.Pull(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := v2.VerifyLocal(ctx); err != nil {
		t.Fatalf("after Pull: %v", err)
	}
	if got := read(t, v2, 3, 1); got != strings.Repeat("b", 100) {
		t.Fatalf("after Pull page 1 = %q", got)
	}
	// Corrupt the remote object: VerifyRemote names it.
	flip(t, filepath.Join(st.Root(), filepath.FromSlash(seg)), 60)
	if _, err := v2.VerifyRemote(ctx); !errors.Is(err, graft.ErrCorrupt) || !strings.Contains(err.Error(), seg) {
		t.Fatalf("VerifyRemote of a corrupt object = %v, want it named", err)
	}
}

// commitAt returns the live entry written by commit lsn.
func commitAt(t *testing.T, v *graft.Volume, lsn uint64) *graft.Commit {
	t.Helper()
	for c, err := range v.Entries(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		if c.LSN == lsn {
			return c
		}
	}
	t.Fatalf("no entry of commit %d", lsn)
	return nil
}

func flip(t *testing.T, path string, at int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[at] ^= 0xff
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestVolume_GCRemovesOnlyOrphans(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	a := openUnpacked(t, t.TempDir(), st)
	b := openUnpacked(t, t.TempDir(), st)
	a.Commit(ctx, []graft.Page{{No: 1, Data: []byte("a")}}, nil)
	b.Commit(ctx, []graft.Page{{No: 1, Data: []byte("b")}}, nil) // loses: its segment is an orphan
	segs, _ := st.List(ctx, "vol/segments/", "", 0)
	if len(segs) != 2 {
		t.Fatalf("%d segments before GC", len(segs))
	}
	if n, err := a.GC(ctx, time.Hour, false); err != nil || n != 0 {
		t.Fatalf("GC within the grace period removed %d, %v", n, err)
	}
	if n, err := a.GC(ctx, 0, true); err != nil || n != 1 {
		t.Fatalf("GC removed %d, %v; want the one orphan", n, err)
	}
	if _, err := a.VerifyRemote(ctx); err != nil {
		t.Fatalf("after GC: %v", err)
	}
}

func TestVolume_LargeRemoteSegmentReadByRange(t *testing.T) {
	st := &counting{Store: newStore(t)}
	ctx := context.Background()
	w := openVolume(t, t.TempDir(), st)
	var pages []graft.Page
	for i := range 100 {
		pages = append(pages, graft.Page{No: archiveBase + uint64(i), Data: bytes.Repeat([]byte{byte(i)}, 1000)})
	}
	if _, err := w.Commit(ctx, pages, nil); err != nil {
		t.Fatal(err)
	}
	r := openVolume(t, t.TempDir(), st)
	r.CacheWholeBelow = 1000
	st.Gets.Store(0)
	got := read(t, r, 1, archiveBase+42)
	if got != string(bytes.Repeat([]byte{42}, 1000)) {
		t.Fatal("wrong page")
	}
	if n := st.Gets.Load(); n != 3 {
		t.Fatalf("%d GETs for one page of a large remote segment, want 3 (trailer, index, page)", n)
	}
	// Another page of it (a worker recovering payload after payload): the
	// index is kept, so the page alone.
	if got := read(t, r, 1, archiveBase+7); got != string(bytes.Repeat([]byte{7}, 1000)) {
		t.Fatal("wrong page")
	}
	if n := st.Gets.Load(); n != 4 {
		t.Fatalf("%d GETs for two pages of a large remote segment, want 4 (the index read once)", n)
	}
}

// TestVolume_LargeRemoteSegmentWalkedAhead: pages of a large remote
// segment read in order (a reader walking the history) are fetched ahead
// in growing ranges: 2,000 pages of 1,000 bytes (2 MB) in a dozen GETs,
// not 2,000; a byte flipped inside such a range is an ErrCorrupt naming
// the segment, never wrong bytes.
func TestVolume_LargeRemoteSegmentWalkedAhead(t *testing.T) {
	st := &counting{Store: newStore(t)}
	ctx := context.Background()
	w := openVolume(t, t.TempDir(), st)
	var pages []graft.Page
	for i := range 2000 {
		pages = append(pages, graft.Page{No: archiveBase + uint64(i), Data: bytes.Repeat([]byte{byte(i)}, 1000)})
	}
	c, err := w.Commit(ctx, pages, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := openVolume(t, t.TempDir(), st)
	r.CacheWholeBelow = 1000
	st.Gets.Store(0)
	seg, err := r.Segment(ctx, c) // as the archive's reads walk it
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		if got, err := seg.Lookup(p.No); err != nil || !bytes.Equal(got, p.Data) {
			t.Fatalf("page %d: %v", p.No, err)
		}
	}
	if n := st.Gets.Load(); n > 12 {
		t.Fatalf("%d GETs to walk 2,000 pages of a large remote segment, want at most 12", n)
	}
	bad := &flipping{Store: st, pages: 32 + 2000*(16+1000)} // the records end where the index starts
	r = openVolume(t, t.TempDir(), bad)
	r.CacheWholeBelow = 1000
	if seg, err = r.Segment(ctx, c); err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		got, err := seg.Lookup(p.No)
		if errors.Is(err, graft.ErrCorrupt) && strings.Contains(err.Error(), c.Segment.Key) && bad.flipped.Load() > 0 {
			return
		}
		if err != nil || !bytes.Equal(got, p.Data) {
			t.Fatalf("page %d from a flipped range: %q, %v; want ErrCorrupt naming %s", p.No, got, err, c.Segment.Key)
		}
	}
	t.Fatalf("walk over flipped ranges: no error (%d ranges flipped)", bad.flipped.Load())
}

func TestOpen_BadName(t *testing.T) {
	for _, name := range []string{"", "a/b", "..", "a b"} {
		if _, err := graft.Open(context.Background(), t.TempDir(), name, newStore(t)); err == nil {
			t.Errorf("Open(%q) succeeded", name)
		}
	}
}

// flipping is a store whose range reads of page records (16-byte head and
// 1000 bytes of data) come back with one byte flipped in their middle, as a
// bad disk or a bad proxy would return them.
type flipping struct {
	fence.Store
	pages   int64 // > 0: read-ahead ranges (longer than a record) ending below this offset are flipped instead
	flipped atomic.Int64
}

func (f *flipping) Get(ctx context.Context, k string, r fence.Range) ([]byte, error) {
	b, err := f.Store.Get(ctx, k, r)
	segment := strings.Contains(k, "/segments/") || strings.Contains(k, "/commits/") && !r.IsSuffix() // a packed commit's segment
	if err == nil && segment && (f.pages == 0 && r.Len == 16+1000 || r.Len > 16+1000 && r.Off+r.Len <= f.pages) {
		b = bytes.Clone(b)
		b[len(b)/2] ^= 0x01
		f.flipped.Add(1)
	}
	return b, err
}

// TestVolume_CorruptPageReadByRangeIsNamed: a page read by range from a large
// remote segment is checked against its own checksum (the whole-segment
// checks do not see a range read); a flipped byte is an ErrCorrupt naming
// the object, never wrong bytes. The silt_negative_checksum build skips the
// page checksum and must fail here.
func TestVolume_CorruptPageReadByRangeIsNamed(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	w := openVolume(t, t.TempDir(), st)
	var pages []graft.Page
	for i := range 50 {
		pages = append(pages, graft.Page{No: archiveBase + uint64(i), Data: bytes.Repeat([]byte{byte(i)}, 1000)})
	}
	c, err := w.Commit(ctx, pages, nil)
	if err != nil {
		t.Fatal(err)
	}
	bad := &flipping{Store: st}
	r := openVolume(t, t.TempDir(), bad)
	r.CacheWholeBelow = 1000
	detected := 0
	for i := 49; i >= 0; i-- { // out of order: each page is a range of its own (no read-ahead)
		got, err := r.ReadAt(ctx, 1, archiveBase+uint64(i))
		switch {
		case errors.Is(err, graft.ErrCorrupt) && strings.Contains(err.Error(), c.Segment.Key):
			detected++
		case err != nil:
			t.Fatalf("page %d: %v, want ErrCorrupt naming %s", i, err, c.Segment.Key)
		case !bytes.Equal(got, pages[i].Data):
			t.Logf("page %d: corrupt bytes returned as good", i)
		}
	}
	t.Logf("history TestVolume_CorruptPageReadByRangeIsNamed: injected %d, detected %d", bad.flipped.Load(), detected)
	if int64(detected) != bad.flipped.Load() || detected == 0 {
		t.Fatalf("detected %d of %d flipped page reads", detected, bad.flipped.Load())
	}
}

// reads records the range of each GET.
type reads struct {
	fence.Store
	mu     sync.Mutex
	ranges []fence.Range
}

func (r *reads) Get(ctx context.Context, k string, rg fence.Range) ([]byte, error) {
	r.mu.Lock()
	r.ranges = append(r.ranges, rg)
	r.mu.Unlock()
	return r.Store.Get(ctx, k, rg)
}

func (r *reads) take() []fence.Range {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.ranges
	r.ranges = nil
	return out
}

// ReadBack asks the remote for no more of a packed commit than the record
// it expects, in one GET; whatever commit the remote holds instead, its
// record shorter or longer, is read whole and returned, to be refused by
// its hash.
func TestVolume_ReadBackReadsTheRecordItExpects(t *testing.T) {
	ctx := context.Background()
	local := newStore(t)
	st := &reads{Store: local}
	v := openVolume(t, t.TempDir(), st)
	page := []graft.Page{{No: 1, Data: bytes.Repeat([]byte("p"), 100<<10)}} // a segment longer than any record
	c, err := v.Commit(ctx, page, map[string]string{"w": "1-0"})
	if err != nil {
		t.Fatal(err)
	}
	st.take()
	back, err := v.ReadBack(ctx, c)
	if err != nil || back.Hash() != c.Hash() {
		t.Fatalf("read back: %v, %v", back, err)
	}
	got := st.take()
	if len(got) != 1 || !got[0].IsSuffix() || -got[0].Off >= 4<<10 {
		t.Fatalf("read back with GETs of %+v; want one of the record's last bytes, under 4 KiB", got)
	}

	// Another writer's commit 1 in its place, its record shorter or
	// longer than this one's (a remote that kept another object).
	for _, meta := range []map[string]string{nil, {"w": strings.Repeat("9", 10<<10)}} {
		other := newStore(t)
		if _, err := openVolume(t, t.TempDir(), other).Commit(ctx, page, meta); err != nil {
			t.Fatal(err)
		}
		obj, err := other.Get(ctx, "vol/commits/"+fmt.Sprintf("%020d", 1), fence.Range{})
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(local.Root(), "vol", "commits", fmt.Sprintf("%020d", 1))
		if err := os.WriteFile(path, obj, 0o644); err != nil {
			t.Fatal(err)
		}
		back, err := v.ReadBack(ctx, c)
		if err != nil || back.Hash() == c.Hash() || back.Meta["w"] != meta["w"] {
			t.Fatalf("read back of another commit (meta of %d bytes): %v, %v; want that commit, read whole", len(meta["w"]), back, err)
		}
	}
}
