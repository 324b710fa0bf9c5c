package graft

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// writable is the part of an open file a volume writes through.
type writable interface {
	io.Writer
	Sync() error
	Close() error
	Name() string
}

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

// writeFile writes b to path durably: a temp file in the volume's tmp
// directory, fsynced, closed, renamed into place, then the directory
// fsynced. On error the temp file is removed and path is left as it was.
func (v *Volume) writeFile(path string, b []byte) error {
	fsys := v.fs
	if fsys == nil {
		fsys = osFS{}
	}
	f, err := fsys.CreateTemp(filepath.Join(v.dir, "tmp"), "w-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fsys.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
