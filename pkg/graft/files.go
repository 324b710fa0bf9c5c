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
}

// osFS is the real file system.
type osFS struct{}

func (osFS) CreateTemp(dir, pattern string) (writable, error) { return os.CreateTemp(dir, pattern) }
func (osFS) Rename(from, to string) error                     { return os.Rename(from, to) }

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
	if err := s.fs.Rename(s.tmp, s.path); err != nil {
		os.Remove(s.tmp)
		return fmt.Errorf("write %s: %w", s.path, err)
	}
	return durable.SyncDir(filepath.Dir(s.path))
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
