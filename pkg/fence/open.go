package fence

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
)

// ParseURL parses a store URL and checks the part every backend shares:
//
//	file:///abs/dir                      a local directory (this package)
//	s3://bucket[/prefix]?endpoint=...    S3-compatible storage (package fence/s3)
//
// A file URL is checked whole (Dir returns its directory); an s3 URL's
// bucket and parameters are package s3's to read. Errors wrap ErrBadURL,
// say which part is wrong, and never show a password.
func ParseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadURL, redactErr(err))
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("%w: file URL with host %q: want file:///absolute/dir", ErrBadURL, u.Host)
		}
		if u.Path == "" || !filepath.IsAbs(u.Path) {
			return nil, fmt.Errorf("%w: file URL path %q is not absolute: want file:///absolute/dir", ErrBadURL, u.Path)
		}
		return u, nil
	case "s3":
		return u, nil
	case "":
		// Not echoed: without a scheme, nothing says which part would be a
		// password (a mistyped "user:pw@host" parses as a path).
		return nil, fmt.Errorf("%w: the store URL has no scheme: want file:///dir or s3://bucket/prefix", ErrBadURL)
	}
	return nil, fmt.Errorf("%w: unknown scheme %q: want file or s3", ErrBadURL, u.Scheme)
}

// Dir returns the directory of a file URL that ParseURL accepted.
func Dir(u *url.URL) string { return filepath.Clean(u.Path) }

func redactErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil {
			ue.URL = u.Redacted()
		} else {
			ue.URL = "(unparsable URL)"
		}
	}
	return err
}

// Mode says what a store is opened for.
type Mode int

const (
	// ReadOnly: a local directory is opened with OpenLocalReadOnly (nothing
	// is created, writes fail with ErrReadOnly); a remote is not probed.
	ReadOnly Mode = iota
	// ReadWrite: the store is probed (Probe) and refused unless it keeps
	// the create-only contract.
	ReadWrite
)

// Open opens the local directory of a file URL. An s3 URL is opened by
// package fence/s3 (s3.OpenURL), so that a program storing only locally
// links no AWS code; the CLIs choose between the two by scheme.
func Open(ctx context.Context, raw string, mode Mode) (Store, error) {
	u, err := ParseURL(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "file" {
		return nil, fmt.Errorf("%w: fence.Open opens file URLs; open %s URLs with package fence/s3 (s3.OpenURL)", ErrBadURL, u.Scheme)
	}
	if mode == ReadOnly {
		return OpenLocalReadOnly(Dir(u))
	}
	st, err := OpenLocal(Dir(u))
	if err != nil {
		return nil, err
	}
	if err := Probe(ctx, st); err != nil {
		return nil, err
	}
	return st, nil
}

// Probe creates a random key twice and fails with ErrNoConditionalWrites
// unless the second create is refused. It removes the probe object after.
func Probe(ctx context.Context, st Store) error {
	var b [8]byte
	rand.Read(b[:])
	key := "probe/" + hex.EncodeToString(b[:])
	if err := st.Create(ctx, key, []byte("first")); err != nil {
		return fmt.Errorf("probe %s: %w", st, err)
	}
	defer st.Delete(context.WithoutCancel(ctx), key)
	err := st.Create(ctx, key, []byte("second"))
	switch {
	case err == nil:
		return fmt.Errorf("probe %s: a second create of %s succeeded: %w; refusing to use it as a commit fence", st, key, ErrNoConditionalWrites)
	case errors.Is(err, ErrExists):
		return nil
	}
	return fmt.Errorf("probe %s: %w", st, err)
}

// String names the local store.
func (l *Local) String() string { return "file://" + l.root }
