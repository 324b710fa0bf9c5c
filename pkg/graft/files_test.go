package graft

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/fence/durable"
)

// faultFS is a file layer that fails: after room bytes a write returns
// ENOSPC (a short write first, as a full disk does), or Sync or Rename
// returns EIO. A packed commit writes two files at once: it is safe for
// concurrent use.
type faultFS struct {
	mu         sync.Mutex
	room       int // bytes that still fit; negative: unlimited
	syncErr    error
	renameErr  error
	dirSyncErr error
	calls      int
	injections int
}

type faultFile struct {
	*os.File
	fs *faultFS
}

func (f *faultFS) CreateTemp(dir, pattern string) (writable, error) {
	file, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f}, nil
}

func (f *faultFS) Rename(from, to string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.renameErr != nil {
		f.injections++
		return f.renameErr
	}
	return os.Rename(from, to)
}

func (f *faultFS) SyncDir(dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dirSyncErr != nil {
		f.injections++
		return f.dirSyncErr
	}
	return durable.SyncDir(dir)
}

func (f *faultFile) Write(b []byte) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.room < 0 || len(b) <= f.fs.room {
		if f.fs.room >= 0 {
			f.fs.room -= len(b)
		}
		return f.File.Write(b)
	}
	n, _ := f.File.Write(b[:f.fs.room])
	f.fs.room = 0
	f.fs.injections++
	return n, syscall.ENOSPC
}

func (f *faultFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.syncErr != nil {
		f.fs.injections++
		return f.fs.syncErr
	}
	return f.File.Sync()
}

// TestVolume_DiskFaults: a full disk, a failed fsync and a failed rename
// while page files are written give a clear error naming the file; no temp
// file is left, the volume verifies, and the next commit (disk healthy
// again) succeeds: at the same LSN when the fault came before the commit
// object, after it when it came after. A packed commit creates its one
// object while its local files are written, so there every fault comes
// after: the commit stands, and the error says the local copy failed.
func TestVolume_DiskFaults(t *testing.T) {
	for _, format := range []string{"unpacked", "packed"} {
		t.Run(format, func(t *testing.T) { diskFaults(t, format == "unpacked") })
	}
}

func diskFaults(t *testing.T, unpacked bool) {
	for _, tc := range []struct {
		name      string
		fs        *faultFS
		want      string
		committed bool // the fault hit after the commit object was created
	}{
		{"disk full", &faultFS{room: 100}, "no space left on device", false},
		{"disk full at once", &faultFS{room: 0}, "no space left on device", false},
		{"disk full after the segment", &faultFS{room: 5092 + 10}, "no space left on device", true},
		{"fsync EIO", &faultFS{room: -1, syncErr: syscall.EIO}, "input/output error", false},
		{"rename EIO", &faultFS{room: -1, renameErr: syscall.EIO}, "input/output error", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			st, err := fence.OpenLocal(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			v, err := OpenWith(ctx, dir, "vol", st, Options{Unpacked: unpacked})
			if err != nil {
				t.Fatal(err)
			}
			pages := []Page{{No: 1 << 63, Data: bytes.Repeat([]byte("a"), 5000)}}
			if _, err := v.Commit(ctx, pages, nil); err != nil {
				t.Fatal(err)
			}
			v.fs = tc.fs
			_, err = v.Commit(ctx, []Page{{No: 1<<63 + 1, Data: bytes.Repeat([]byte("b"), 5000)}}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), filepath.Join(dir, "vol")) {
				t.Fatalf("commit on a failing disk: %v, want an error saying %q and naming the file", err, tc.want)
			}
			if tc.fs.injections == 0 {
				t.Fatal("no fault was injected")
			}
			if v.Head() != 1 {
				t.Fatalf("head %d after a failed commit, want 1", v.Head())
			}
			if tmp, _ := os.ReadDir(filepath.Join(dir, "vol", "tmp")); len(tmp) != 0 {
				t.Fatalf("%d temp files left behind", len(tmp))
			}
			if _, err := v.VerifyLocal(ctx); err != nil {
				t.Fatalf("volume corrupt after the fault: %v", err)
			}
			// The next run: a fresh handle on a healthy disk adopts what the
			// remote holds and commits after it.
			v2, err := OpenWith(ctx, dir, "vol", st, Options{Unpacked: unpacked})
			if err != nil {
				t.Fatal(err)
			}
			want := uint64(2)
			if tc.committed || !unpacked {
				want = 3
			}
			c, err := v2.Commit(ctx, []Page{{No: 1<<63 + 1, Data: []byte("b")}}, nil)
			if err != nil || c.LSN != want {
				t.Fatalf("recovery commit: %v (%+v), want LSN %d", err, c, want)
			}
			if _, err := v2.VerifyLocal(ctx); err != nil {
				t.Fatal(err)
			}
			if b, err := v2.ReadAt(ctx, 2, 1<<63); err != nil || len(b) != 5000 {
				t.Fatalf("page of commit 1 after recovery: %d bytes, %v", len(b), err)
			}
			if errors.Is(err, ErrCorrupt) {
				t.Fatal(err)
			}
		})
	}
}

// A commit's local record is placed and its directory synced beside the
// caller: a failed directory sync does not undo the commit (the remote
// holds it, the head moved on); Sync returns the error, once, and a commit
// made while the sync before it failed fails too, creating nothing on the
// remote. On a healthy disk the next commit goes through, and a new
// handle opens at its head.
func TestCommit_LocalRecordSyncedBeside(t *testing.T) {
	ctx := context.Background()
	st, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	v, err := Open(ctx, dir, "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	page := func(n int) []Page { return []Page{{No: 1<<63 + uint64(n), Data: bytes.Repeat([]byte{byte(n)}, 300)}} }
	if _, err := v.Commit(ctx, page(1), nil); err != nil {
		t.Fatal(err)
	}
	if err := v.Sync(); err != nil {
		t.Fatalf("sync on a healthy disk: %v", err)
	}
	faults := &faultFS{room: -1, dirSyncErr: syscall.EIO}
	v.fs = faults
	if c, err := v.Commit(ctx, page(2), nil); err != nil || c.LSN != 2 || v.Head() != 2 {
		t.Fatalf("commit 2 with its record's directory sync failing: %v, head %d; want it made, its sync reported apart", err, v.Head())
	}
	err = v.Sync()
	if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), v.localCommit(2)) {
		t.Fatalf("sync after commit 2: %v, want EIO naming %s", err, v.localCommit(2))
	}
	if err := v.Sync(); err != nil {
		t.Fatalf("sync again: %v, want the error reported once", err)
	}
	if _, err := v.Commit(ctx, page(3), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Commit(ctx, page(4), nil); !errors.Is(err, syscall.EIO) {
		t.Fatalf("commit 4 after commit 3's record sync failed: %v, want EIO", err)
	}
	if _, err := st.Get(ctx, v.commitKey(4), fence.Range{}); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("commit 4 on the remote after it failed: %v, want none", err)
	}
	if faults.injections != 2 {
		t.Fatalf("%d faults injected, want 2 (the syncs of commits 2 and 3)", faults.injections)
	}
	faults.dirSyncErr = nil
	if c, err := v.Commit(ctx, page(4), nil); err != nil || c.LSN != 4 {
		t.Fatalf("commit 4 on a healthy disk: %v", err)
	}
	if err := v.Sync(); err != nil {
		t.Fatal(err)
	}
	v2, err := Open(ctx, dir, "vol", st)
	if err != nil || v2.Head() != 4 {
		t.Fatalf("open after: head %d, %v", v2.Head(), err)
	}
	if _, err := v2.VerifyLocal(ctx); err != nil {
		t.Fatal(err)
	}
}

// Opening a volume removes what a killed process left in its tmp directory
// (a merged segment half written, a staged commit) once it is an hour old,
// and nothing younger: another process may be writing it.
func TestOpen_SweepsStaleTmpFiles(t *testing.T) {
	ctx := context.Background()
	data := t.TempDir()
	st, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(data, "vol", "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	for name, stale := range map[string]bool{"m-1": true, "i-1": true, "w-2": false, "m-3": false} {
		path := filepath.Join(tmp, name)
		if err := os.WriteFile(path, bytes.Repeat([]byte("x"), 1<<10), 0o644); err != nil {
			t.Fatal(err)
		}
		if stale {
			if err := os.Chtimes(path, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := Open(ctx, data, "vol", st); err != nil {
		t.Fatal(err)
	}
	var left []string
	files, _ := os.ReadDir(tmp)
	for _, f := range files {
		left = append(left, f.Name())
	}
	if strings.Join(left, " ") != "m-3 w-2" {
		t.Fatalf("tmp holds %v after open, want the two young files only", left)
	}
}

// The head hint is the head's LSN in 20 digits, written in place over the
// file's first bytes: every hint is as long, so nothing of an earlier one,
// nor of a shorter one an older build wrote, is left after it. An open
// reads either and probes on to the newest commit file.
func TestHint_WrittenInPlaceAndReadInEitherForm(t *testing.T) {
	ctx := context.Background()
	data := t.TempDir()
	st, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	v, err := Open(ctx, data, "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	commit := func(v *Volume, no uint64) {
		t.Helper()
		if _, err := v.Commit(ctx, []Page{{No: no, Data: []byte("x")}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(data, "vol", "head")
	hinted := func(want string) {
		t.Helper()
		if b, err := os.ReadFile(path); err != nil || string(b) != want {
			t.Fatalf("head hint %q (%v), want %q", b, err, want)
		}
	}
	for no := range uint64(12) {
		commit(v, no+1)
	}
	hinted("00000000000000000012")
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	// An older build's hint, shorter and behind the commit files.
	if err := os.WriteFile(path, []byte("9"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := Open(ctx, data, "vol", st)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := w.newestLocalCommit(); err != nil || c == nil || c.LSN != 12 {
		t.Fatalf("newest local commit after a hint of 9: %v, %v; want 12", c, err)
	}
	commit(w, 13)
	hinted("00000000000000000013")
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) {
		t.Fatal("the head hint was replaced, not written in place")
	}
	if c, err := w.newestLocalCommit(); err != nil || c == nil || c.LSN != 13 {
		t.Fatalf("newest local commit: %v, %v; want 13", c, err)
	}
}
