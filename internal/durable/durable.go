// Package durable holds the two steps of a crash-safe file write shared by
// the local object store (pkg/fence) and the local volume (pkg/graft): a
// temp file filled and fsynced, then, after it is linked or renamed into
// place, its directory fsynced.
package durable

import "os"

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
	_, err := f.Write(body)
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
