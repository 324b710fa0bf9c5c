package fence

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Errors of the package. Backends translate their own errors into these.
var (
	// ErrExists: Create found the key already there (someone else's object).
	ErrExists = errors.New("object exists")
	// ErrNotFound: Get found no object under the key.
	ErrNotFound = errors.New("object not found")
	// ErrReadOnly: a store opened for reading was asked to write.
	ErrReadOnly = errors.New("store opened read-only")
	// ErrBadKey: the key is empty, absolute, contains ".." or bytes outside
	// [A-Za-z0-9._=~/-], or has an empty segment.
	ErrBadKey = errors.New("bad key")
	// ErrBadURL: Open could not make sense of a store URL.
	ErrBadURL = errors.New("bad store URL")
	// ErrNoConditionalWrites: the store accepted a second create of one key,
	// so it cannot fence commits; Open refuses it.
	ErrNoConditionalWrites = errors.New("store ignores conditional writes (If-None-Match)")
)

// Store is a create-only object store. Keys are relative slash-separated
// paths checked by CheckKey; they never escape the store's prefix.
//
// Create stores body under key if no object is there and returns nil, or
// returns ErrExists, leaving the existing object as it was. Readers see either
// no object or the whole body, never a part. When the outcome of an attempt
// is unknown (a timeout or a lost reply after which a retry finds the key
// taken), the backend reads the object back: if it holds body, Create
// succeeded; otherwise it returns ErrExists.
//
// Get returns the object's bytes in r (all of it for the zero Range), or
// ErrNotFound. List returns up to limit keys that start with prefix and sort
// after after, in byte order; it is for cold starts and GC, never for the hot
// path. Delete removes an object (GC only); deleting a missing key is not an
// error. Every method honours ctx and bounds each request with a timeout.
type Store interface {
	Create(ctx context.Context, key string, body []byte) error
	Get(ctx context.Context, key string, r Range) ([]byte, error)
	List(ctx context.Context, prefix, after string, limit int) ([]string, error)
	Delete(ctx context.Context, key string) error
}

// HashedCreator is a Store that can take the body's SHA-256 (hex) from a
// caller who computed it anyway, instead of hashing the body again. The
// contract is Create's; a wrong hash is the caller's bug and may be stored.
type HashedCreator interface {
	CreateHashed(ctx context.Context, key string, body []byte, sha256hex string) error
}

// FileCreator is a Store that can create an object from a local file
// without holding the file's bytes in memory (a merged segment of 64 MiB is
// streamed from disk). size and sha256hex are the file's, computed by the
// caller as it wrote it; a file of another size is refused. The contract is
// Create's; the file must not change while the call runs.
type FileCreator interface {
	CreateFile(ctx context.Context, key, path string, size int64, sha256hex string) error
}

// CreateFromFile creates key from the file at path on any store: through
// FileCreator when st has it, else by reading the file into memory (stores
// that transform the whole body, such as Encrypted).
func CreateFromFile(ctx context.Context, st Store, key, path string, size int64, sha256hex string) error {
	if fc, ok := st.(FileCreator); ok {
		return fc.CreateFile(ctx, key, path, size, sha256hex)
	}
	body, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", key, err)
	}
	if int64(len(body)) != size {
		return fmt.Errorf("create %s from %s: the file has %d bytes, want %d", key, path, len(body), size)
	}
	if hc, ok := st.(HashedCreator); ok {
		return hc.CreateHashed(ctx, key, body, sha256hex)
	}
	return st.Create(ctx, key, body)
}

// OpenSized opens the file of a CreateFile call after checking its size,
// for FileCreator implementations.
func OpenSized(key, path string, size int64) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", key, err)
	}
	if fi, err := f.Stat(); err != nil || fi.Size() != size {
		f.Close()
		if err == nil {
			err = fmt.Errorf("the file has %d bytes, want %d", fi.Size(), size)
		}
		return nil, fmt.Errorf("create %s from %s: %w", key, path, err)
	}
	return f, nil
}

// Range selects bytes [Off, Off+Len) of an object; Len 0 means to the end.
// A negative Off with Len 0 selects the object's last -Off bytes (all of it
// when it is shorter): see Suffix.
type Range struct {
	Off, Len int64
}

// Suffix selects an object's last n bytes, or the whole object when it has
// fewer: a reader that finds a record at the end of an object (a packed
// commit) reads it in one request without knowing the object's size.
func Suffix(n int64) Range { return Range{Off: -n} }

// SuffixReadsWhole reports whether a Suffix read from st fetches the whole
// object (Encrypted: its last chunks' places depend on a size only the
// object knows). A wrapping Store passes the answer of the store it wraps on
// with a method SuffixReadsWhole() bool.
func SuffixReadsWhole(st Store) bool {
	w, ok := st.(interface{ SuffixReadsWhole() bool })
	return ok && w.SuffixReadsWhole()
}

// IsSuffix reports whether r selects the object's end (Suffix).
func (r Range) IsSuffix() bool { return r.Off < 0 }

// IsWhole reports whether r selects the whole object.
func (r Range) IsWhole() bool { return r.Off == 0 && r.Len == 0 }

// CheckKey validates a key. Allowed: non-empty segments of [A-Za-z0-9._=~-]
// separated by '/', no segment "." or "..", at most 512 bytes. ('=' is for
// Hive-style partitions such as date=2026-12-01.)
func CheckKey(key string) error {
	if key == "" || len(key) > 512 {
		return fmt.Errorf("key %q: %w: empty or longer than 512 bytes", key, ErrBadKey)
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("key %q: %w: empty, \".\" or \"..\" segment", key, ErrBadKey)
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '=' || c == '~') {
				return fmt.Errorf("key %q: %w: byte %q", key, ErrBadKey, c)
			}
		}
	}
	return nil
}
