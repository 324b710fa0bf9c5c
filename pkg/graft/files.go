package graft

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/silt-dev/silt/pkg/fence/durable"
)

// writable is the part of an open file a volume writes through.
type writable = durable.File

// fileSystem is how a volume creates its local files. It is the seam the
// fault tests use to fill the disk or fail a write, a sync or a rename.
type fileSystem interface {
	CreateTemp(dir, pattern string) (writable, error)
	Rename(from, to string) error
	SyncDir(dir string) error
}

// osFS is the real file system.
type osFS struct{}

func (osFS) CreateTemp(dir, pattern string) (writable, error) { return os.CreateTemp(dir, pattern) }
func (osFS) Rename(from, to string) error                     { return os.Rename(from, to) }
func (osFS) SyncDir(dir string) error                         { return durable.SyncDir(dir) }

// files is the volume's file system.
func (v *Volume) files() fileSystem {
	if v.fs == nil {
		return osFS{}
	}
	return v.fs
}

// writeFile writes b to path durably: a temp file in the volume's tmp
// directory, fsynced, closed, renamed into place, then the directory
// fsynced. On error the temp file is removed and path is left as it was.
func (v *Volume) writeFile(path string, b []byte) error {
	s := v.stageFile(path, b)
	if s.err != nil {
		return s.err
	}
	return s.place()
}

// staged is a file written and fsynced in the tmp directory, not yet in place.
type staged struct {
	path, tmp string
	fs        fileSystem
	err       error
}

// stageFile is the first half of writeFile: the temp file, written, fsynced
// and closed. On error it is already removed.
func (v *Volume) stageFile(path string, b []byte) staged {
	s := staged{path: path, fs: v.files()}
	f, err := s.fs.CreateTemp(filepath.Join(v.dir, "tmp"), "w-*")
	if err != nil {
		s.err = fmt.Errorf("write %s: %w", path, err)
		return s
	}
	s.tmp = f.Name()
	if err := durable.Fill(f, b); err != nil {
		s.err = fmt.Errorf("write %s: %w", path, err)
	}
	return s
}

// place renames a staged file into place and fsyncs its directory.
func (s staged) place() error {
	if err := s.placeCache(); err != nil {
		return err
	}
	if err := s.fs.SyncDir(filepath.Dir(s.path)); err != nil {
		return fmt.Errorf("write %s: sync its directory: %w", s.path, err)
	}
	return nil
}

// dirSync is a directory fsync running beside its caller.
type dirSync struct {
	done chan struct{}
	err  error
}

// placeBeside renames a staged file into place and starts the fsync of
// its directory on a goroutine: the caller goes on, and waits for it
// (Volume.Sync) before anything that must follow the file's durability.
func (s staged) placeBeside() (*dirSync, error) {
	if err := s.placeCache(); err != nil {
		return nil, err
	}
	ds := &dirSync{done: make(chan struct{})}
	go func() {
		defer close(ds.done)
		if err := s.fs.SyncDir(filepath.Dir(s.path)); err != nil {
			ds.err = fmt.Errorf("write %s: sync its directory: %w", s.path, err)
		}
	}()
	return ds, nil
}

// Sync waits until the local record of the volume's last commit is
// durable and returns the error of making it so. Commit returns once the
// remote holds the commit and its local record is in place; the fsync of
// the record's directory finishes beside the caller's next step. The next
// commit waits for it before it creates anything (its error fails that
// commit, which creates nothing); a caller that stops after a commit, or
// proves it, calls Sync. An error is returned to the callers waiting when
// the sync ends, then forgotten: the remote holds the commit, and an open
// after a crash that lost the local copy adopts it from there.
func (v *Volume) Sync() error {
	v.syncMu.Lock()
	ds := v.syncing
	v.syncMu.Unlock()
	if ds == nil {
		return nil
	}
	<-ds.done
	v.syncMu.Lock()
	if v.syncing == ds {
		v.syncing = nil
	}
	v.syncMu.Unlock()
	if ds.err != nil {
		return fmt.Errorf("volume %s: %w", v.name, ds.err)
	}
	return nil
}

// placeCache renames a staged file into place without syncing its
// directory: a copy of what the remote holds, which a crash may lose (it is
// fetched again) but never leaves partly written.
func (s staged) placeCache() error {
	if err := s.fs.Rename(s.tmp, s.path); err != nil {
		os.Remove(s.tmp)
		return fmt.Errorf("write %s: %w", s.path, err)
	}
	return nil
}

// drop removes a staged file that is not to be placed.
func (s staged) drop() {
	if s.err == nil {
		os.Remove(s.tmp)
	}
}

// readFile reads a local file.
func readFile(path string) ([]byte, error) { return os.ReadFile(path) }

// readCommitFile reads and checks the local commit file of lsn.
func (v *Volume) readCommitFile(lsn uint64) (*Commit, error) {
	path := v.localCommit(lsn)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := DecodeCommit(path, b)
	if err != nil {
		return nil, fmt.Errorf("open volume %s: %w", v.name, err)
	}
	return c, nil
}

// isNotExist reports a missing file.
func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// writeCache writes a file that is only a cache (checked whenever it is
// read): temp file and rename, no fsync. Errors are dropped: a missing
// cache file costs a GET.
func (v *Volume) writeCache(path string, b []byte) {
	f, err := os.CreateTemp(filepath.Join(v.dir, "tmp"), "c-*")
	if err != nil {
		return
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil || os.Rename(f.Name(), path) != nil {
		os.Remove(f.Name())
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// writeCommitFile stores the local copy of a commit object and moves the
// head hint (a hint: written without fsync, checked at open).
func (v *Volume) writeCommitFile(lsn uint64, obj []byte) error {
	if err := v.writeFile(v.localCommit(lsn), obj); err != nil {
		return err
	}
	v.hint(lsn)
	return nil
}
