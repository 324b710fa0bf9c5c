// Package durable holds the two steps of a crash-safe file write shared by
// the local object store (pkg/fence) and the local volume (pkg/graft): a
// temp file filled and fsynced, then, after it is linked or renamed into
// place, its directory fsynced; and the sweep of temp files a crash left.
package durable

import (
	"io"
	"os"
	"path/filepath"
	"time"
)

// File is what Fill needs of a freshly created temp file (an *os.File, or
// a test's fault-injecting stand-in).
type File interface {
	Write([]byte) (int, error)
	Sync() error
	Close() error
	Name() string
}

// Fill writes body to f, fsyncs and closes it. On error the file is removed.
func Fill(f File, body []byte) error {
	return FillWith(f, func(w io.Writer) error {
		_, err := w.Write(body)
		return err
	})
}

// FillWith is Fill with the content written by fill, which is handed f
// itself (an *os.File stays one, so io.Copy into it copies in the kernel).
func FillWith(f File, fill func(io.Writer) error) error {
	err := fill(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// SyncDir fsyncs a directory, so that a name linked or renamed into it
// survives a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// StaleAfter is the age past which a temp file is left over from a process
// that died before it placed it, not one being written now by this process
// or another sharing the directory: a commit stages its files for
// milliseconds, a merge writes its segment (up to --compact-target) for
// seconds.
const StaleAfter = time.Hour

// RemoveStale removes the regular files in dir last written more than
// StaleAfter ago. A killed archiver would otherwise leave one more temp file
// per kill, forever.
func RemoveStale(dir string) {
	files, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	cutoff := time.Now().Add(-StaleAfter)
	for _, f := range files {
		if info, err := f.Info(); err == nil && info.Mode().IsRegular() && info.ModTime().Before(cutoff) {
			os.Remove(filepath.Join(dir, f.Name()))
		}
	}
}
