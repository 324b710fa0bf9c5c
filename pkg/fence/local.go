package fence

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/silt-dev/silt/pkg/fence/durable"
)

// tmpDir is where the local store stages objects before linking them in
// place; it is skipped by List.
const tmpDir = ".tmp"

// Local is a Store in a local directory: the embedded default remote.
// Create writes a temp file, fsyncs it, then link(2)s it to its name, which
// fails if the name exists, and fsyncs the directory: the whole object
// appears at once, and only once.
type Local struct {
	root     string
	readOnly bool
}

var _ Store = (*Local)(nil)

// OpenLocal opens (creating if needed) a local store rooted at dir.
func OpenLocal(dir string) (*Local, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("local store %q: %w: the directory must be absolute", dir, ErrBadURL)
	}
	if err := os.MkdirAll(filepath.Join(dir, tmpDir), 0o755); err != nil {
		return nil, fmt.Errorf("local store: %w", err)
	}
	durable.RemoveStale(filepath.Join(dir, tmpDir)) // what a killed create left
	return &Local{root: dir}, nil
}

// OpenLocalReadOnly opens a local store for reading only: nothing is
// created, a directory that does not exist is an empty store, and Create and
// Delete fail with ErrReadOnly. Readers (archiver read, status) use it, so
// that looking leaves no directory behind.
func OpenLocalReadOnly(dir string) (*Local, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("local store %q: %w: the directory must be absolute", dir, ErrBadURL)
	}
	return &Local{root: dir, readOnly: true}, nil
}

// Root returns the store's directory.
func (l *Local) Root() string { return l.root }

func (l *Local) path(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return filepath.Join(l.root, filepath.FromSlash(key)), nil
}

// Create implements Store.
func (l *Local) Create(ctx context.Context, key string, body []byte) error {
	return l.create(ctx, key, func(w io.Writer) error {
		_, err := w.Write(body)
		return err
	})
}

var _ FileCreator = (*Local)(nil)

// CreateFile implements FileCreator: the file is copied by the kernel
// (copy_file_range where the file system has it), never through memory.
func (l *Local) CreateFile(ctx context.Context, key, path string, size int64, _ string) error {
	if l.readOnly {
		return fmt.Errorf("create %s: %w", key, ErrReadOnly)
	}
	src, err := OpenSized(key, path, size)
	if err != nil {
		return err
	}
	defer src.Close()
	return l.create(ctx, key, func(w io.Writer) error {
		n, err := io.Copy(w, src)
		if err == nil && n != size {
			err = fmt.Errorf("copied %d bytes of %s, want %d", n, path, size)
		}
		return err
	})
}

// create stages an object filled by fill (then fsynced) and links it to
// key's path, which fails if the key exists.
func (l *Local) create(ctx context.Context, key string, fill func(io.Writer) error) error {
	if l.readOnly {
		return fmt.Errorf("create %s: %w", key, ErrReadOnly)
	}
	dst, err := l.path(key)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tmp, err := writeTemp(filepath.Join(l.root, tmpDir), fill)
	if err != nil {
		return fmt.Errorf("create %s: %w", key, err)
	}
	defer os.Remove(tmp)
	if err := linkInto(tmp, dst); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create %s: %w", key, ErrExists)
		}
		return fmt.Errorf("create %s: %w", key, err)
	}
	if err := durable.SyncDir(filepath.Dir(dst)); err != nil {
		return fmt.Errorf("create %s: sync directory: %w", key, err)
	}
	return nil
}

// linkInto links tmp to dst, creating dst's directory. A concurrent Delete
// may remove that directory once empty between the two steps, so a missing
// directory is created again, a few times.
func linkInto(tmp, dst string) error {
	var err error
	for range 5 {
		if err = os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err = os.Link(tmp, dst); !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return err
}

// writeTemp creates a file in dir, fills it with fill, fsyncs and closes
// it. On error the file is removed.
func writeTemp(dir string, fill func(io.Writer) error) (string, error) {
	f, err := os.CreateTemp(dir, "obj-*")
	if err != nil {
		return "", err
	}
	if err := durable.FillWith(f, fill); err != nil {
		return "", err
	}
	return f.Name(), nil
}

// Get implements Store.
func (l *Local) Get(ctx context.Context, key string, r Range) ([]byte, error) {
	p, err := l.path(key)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	defer f.Close()
	if r.IsWhole() {
		b, err := io.ReadAll(f)
		if err != nil {
			return nil, fmt.Errorf("get %s: %w", key, err)
		}
		return b, nil
	}
	return readRange(f, key, r)
}

func readRange(f *os.File, key string, r Range) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	if r.IsSuffix() && r.Len == 0 {
		r.Off = max(0, st.Size()+r.Off)
	}
	if r.Off < 0 || r.Len < 0 || r.Off > st.Size() {
		return nil, fmt.Errorf("get %s: range %d+%d outside object of %d bytes", key, r.Off, r.Len, st.Size())
	}
	n := st.Size() - r.Off
	if r.Len > 0 {
		n = min(n, r.Len)
	}
	b := make([]byte, n)
	if _, err := f.ReadAt(b, r.Off); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	return b, nil
}

// List implements Store. Directories are read in chunks and only the
// limit smallest keys are held, so a page of a directory of a million
// objects (gc of a volume never collected) costs the page's memory, not
// the directory's; its time is still a read of the whole directory.
func (l *Local) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	if _, err := os.Stat(l.root); errors.Is(err, fs.ErrNotExist) && l.readOnly {
		return nil, nil // nothing was ever stored here
	}
	keys := &smallest{limit: limit}
	base := prefix[:strings.LastIndexByte(prefix, '/')+1] // the deepest directory every key lies under
	if base != "" && !fs.ValidPath(strings.TrimSuffix(base, "/")) {
		base = "" // never a path out of the root: such a prefix matches no key (CheckKey)
	}
	if err := l.listDir(ctx, base, prefix, after, keys); err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	slices.Sort(keys.keys)
	return keys.keys, nil
}

// listDir adds the keys under the directory of key prefix rel ("" or
// ending in "/") that start with prefix and sort after after.
func (l *Local) listDir(ctx context.Context, rel, prefix, after string, keys *smallest) error {
	f, err := os.Open(filepath.Join(l.root, filepath.FromSlash(rel)))
	if errors.Is(err, fs.ErrNotExist) && rel != "" {
		return nil // no object under it
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && !fi.IsDir() {
		return nil // an object: the prefix names a directory inside it
	}
	for {
		entries, err := f.ReadDir(1024)
		for _, d := range entries {
			if err := ctx.Err(); err != nil {
				return err
			}
			key := rel + d.Name()
			if !d.IsDir() {
				if strings.HasPrefix(key, prefix) && key > after {
					keys.add(key)
				}
				continue
			}
			if key == tmpDir {
				continue
			}
			if sub := key + "/"; strings.HasPrefix(prefix, sub) || strings.HasPrefix(sub, prefix) {
				if err := l.listDir(ctx, sub, prefix, after, keys); err != nil {
					return err
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// smallest keeps the limit smallest keys added (every key when limit is 0),
// unordered: a max-heap on keys while it is full.
type smallest struct {
	limit int
	keys  []string
}

func (s *smallest) add(key string) {
	switch {
	case s.limit <= 0 || len(s.keys) < s.limit:
		s.keys = append(s.keys, key)
		if len(s.keys) == s.limit {
			heap.Init(s)
		}
	case key < s.keys[0]:
		s.keys[0] = key
		heap.Fix(s, 0)
	}
}

func (s *smallest) Len() int           { return len(s.keys) }
func (s *smallest) Less(i, j int) bool { return s.keys[i] > s.keys[j] }
func (s *smallest) Swap(i, j int)      { s.keys[i], s.keys[j] = s.keys[j], s.keys[i] }
func (s *smallest) Push(x any)         { s.keys = append(s.keys, x.(string)) }
func (s *smallest) Pop() any {
	k := s.keys[len(s.keys)-1]
	s.keys = s.keys[:len(s.keys)-1]
	return k
}

// Delete implements Store.
func (l *Local) Delete(ctx context.Context, key string) error {
	if l.readOnly {
		return fmt.Errorf("delete %s: %w", key, ErrReadOnly)
	}
	p, err := l.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	// Remove directories the delete left empty (os.Remove fails on others).
	for dir := filepath.Dir(p); dir != l.root && strings.HasPrefix(dir, l.root); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break
		}
	}
	return nil
}
