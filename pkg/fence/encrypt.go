package fence

import (
	"bufio"
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Client-side encryption at rest. Encrypted wraps a Store so that every
// object is written as AES-256-GCM ciphertext: no plaintext byte reaches the
// store. An object is a header and chunks:
//
//	header  "SLTE" | version 1 | 3 zero bytes | chunk size (u32 BE) | key id (8 bytes)
//	chunk   nonce (12 bytes) | ciphertext | tag (16 bytes)
//
// Each chunk holds encChunk plaintext bytes (the last one fewer) and is
// sealed with a random nonce and, as additional data, the object's key and
// the chunk's index, so chunks cannot be swapped within or between objects.
// A ranged read fetches and opens only the chunks it covers. The key id is
// the first 8 bytes of SHA-256 of the key: a reader with another key is told
// which one the object needs.

// ErrKey is wrapped by errors about the encryption key: missing, of the
// wrong size, or not the one an object was written with.
var ErrKey = errors.New("encryption key")

const (
	encMagic    = "SLTE"
	encVersion  = 1
	encHeader   = 20
	encChunk    = 64 << 10
	encOverhead = 12 + 16 // nonce and tag of each chunk
)

// Encrypted is a Store whose objects are encrypted with one AES-256 key.
type Encrypted struct {
	store Store
	aead  cipher.AEAD
	id    [8]byte
}

var _ Store = (*Encrypted)(nil)

// Encrypt wraps store with client-side encryption under key (32 bytes).
func Encrypt(store Store, key []byte) (*Encrypted, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("%w: want 32 bytes (AES-256), got %d", ErrKey, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKey, err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKey, err)
	}
	e := &Encrypted{store: store, aead: aead}
	sum := sha256.Sum256(key)
	copy(e.id[:], sum[:8])
	return e, nil
}

// KeyID names the key without revealing it (hex of the first 8 bytes of its SHA-256).
func (e *Encrypted) KeyID() string { return hex.EncodeToString(e.id[:]) }

// String names the wrapped store.
func (e *Encrypted) String() string { return fmt.Sprintf("%v (encrypted, key %s)", e.store, e.KeyID()) }

// Create encrypts body and creates it under key (Store's contract).
func (e *Encrypted) Create(ctx context.Context, key string, body []byte) error {
	return e.store.Create(ctx, key, e.seal(key, body))
}

func (e *Encrypted) seal(key string, body []byte) []byte {
	chunks := (len(body) + encChunk - 1) / encChunk
	out := e.appendHeader(make([]byte, 0, encHeader+len(body)+chunks*encOverhead))
	for i := 0; i < chunks; i++ {
		out = e.appendChunk(out, key, i, body[i*encChunk:min((i+1)*encChunk, len(body))])
	}
	return out
}

func (e *Encrypted) appendHeader(out []byte) []byte {
	out = append(out, encMagic...)
	out = append(out, encVersion, 0, 0, 0)
	out = binary.BigEndian.AppendUint32(out, encChunk)
	return append(out, e.id[:]...)
}

// appendChunk appends chunk i of the object under key: a random nonce, then
// plain sealed.
func (e *Encrypted) appendChunk(out []byte, key string, i int, plain []byte) []byte {
	nonce := make([]byte, 12)
	rand.Read(nonce)
	out = append(out, nonce...)
	return e.aead.Seal(out, nonce, plain, chunkAD(key, i))
}

var _ FileCreator = (*Encrypted)(nil)

// CreateFile implements FileCreator: the file is sealed chunk by chunk into
// a temp file beside it, from which the wrapped store creates the object;
// neither is held in memory whole.
func (e *Encrypted) CreateFile(ctx context.Context, key, path string, size int64, _ string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	src, err := OpenSized(key, path, size)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".seal-*")
	if err != nil {
		return fmt.Errorf("create %s: %w", key, err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	sum := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(tmp, sum), 256<<10)
	n, err := e.sealFrom(w, key, src)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		return fmt.Errorf("create %s: seal %s: %w", key, path, err)
	}
	return CreateFromFile(ctx, e.store, key, tmp.Name(), n, hex.EncodeToString(sum.Sum(nil)))
}

// sealFrom writes the object of src's bytes under key to w, as seal lays it
// out, and returns its size.
func (e *Encrypted) sealFrom(w io.Writer, key string, src io.Reader) (int64, error) {
	plain := make([]byte, encChunk)
	out := e.appendHeader(make([]byte, 0, encChunk+encOverhead))
	var size int64
	for i := 0; ; i++ {
		n, rerr := io.ReadFull(src, plain)
		if n > 0 {
			out = e.appendChunk(out, key, i, plain[:n])
		}
		if _, err := w.Write(out); err != nil {
			return 0, err
		}
		size, out = size+int64(len(out)), out[:0]
		switch {
		case rerr == io.EOF || rerr == io.ErrUnexpectedEOF:
			return size, nil
		case rerr != nil:
			return 0, rerr
		}
	}
}

// Get returns the plaintext bytes r selects (Store's contract), fetching
// only the chunks that hold them. A Suffix reads the whole object: where
// its last chunks start depends on a size only the object knows.
func (e *Encrypted) Get(ctx context.Context, key string, r Range) ([]byte, error) {
	if r.IsSuffix() {
		b, err := e.Get(ctx, key, Range{})
		if err != nil {
			return nil, err
		}
		return b[max(0, int64(len(b))+r.Off):], nil
	}
	if r.IsWhole() {
		b, err := e.store.Get(ctx, key, r)
		if err != nil {
			return nil, err
		}
		if err := e.checkHeader(key, b); err != nil {
			return nil, err
		}
		return e.open(ctx, key, b[encHeader:], 0)
	}
	first := r.Off / encChunk
	last := first
	if r.Len > 0 {
		last = (r.Off + r.Len - 1) / encChunk
	}
	span := Range{Off: encHeader + first*(encChunk+encOverhead)}
	if r.Len > 0 {
		span.Len = (last - first + 1) * (encChunk + encOverhead)
	}
	b, err := e.store.Get(ctx, key, span)
	if err != nil {
		return nil, err
	}
	plain, err := e.open(ctx, key, b, int(first))
	if err != nil {
		return nil, err
	}
	lo := r.Off - first*encChunk
	if lo > int64(len(plain)) {
		return nil, fmt.Errorf("get %s: range %d+%d outside the object", key, r.Off, r.Len)
	}
	plain = plain[lo:]
	if r.Len > 0 && int64(len(plain)) > r.Len {
		plain = plain[:r.Len]
	}
	return plain, nil
}

// SuffixReadsWhole is true: Get reads the whole object for a Suffix.
func (e *Encrypted) SuffixReadsWhole() bool { return true }

// open decrypts consecutive chunks starting with chunk index first.
func (e *Encrypted) open(ctx context.Context, key string, b []byte, first int) ([]byte, error) {
	out := make([]byte, 0, len(b))
	for i := first; len(b) > 0; i++ {
		n := min(len(b), encChunk+encOverhead)
		if n <= encOverhead {
			return nil, fmt.Errorf("get %s: chunk %d is truncated: corrupt object", key, i)
		}
		var err error
		out, err = e.aead.Open(out, b[:12], b[12:n], chunkAD(key, i))
		if err != nil {
			return nil, e.whyNotOpen(ctx, key, i)
		}
		b = b[n:]
	}
	return out, nil
}

// whyNotOpen tells a wrong key from a corrupt object by the object's header.
func (e *Encrypted) whyNotOpen(ctx context.Context, key string, chunk int) error {
	head, err := e.store.Get(ctx, key, Range{Len: encHeader})
	if err == nil {
		if err := e.checkHeader(key, head); err != nil {
			return err
		}
	}
	return fmt.Errorf("get %s: chunk %d fails authentication: the object is corrupt or was altered", key, chunk)
}

func (e *Encrypted) checkHeader(key string, b []byte) error {
	switch {
	case len(b) < encHeader || string(b[:4]) != encMagic:
		return fmt.Errorf("get %s: %w: the object is not encrypted (written without a key?)", key, ErrKey)
	case b[4] != encVersion:
		return fmt.Errorf("get %s: encryption format version %d, this build reads %d", key, b[4], encVersion)
	case binary.BigEndian.Uint32(b[8:12]) != encChunk:
		return fmt.Errorf("get %s: encrypted in chunks of %d bytes, this build reads %d", key, binary.BigEndian.Uint32(b[8:12]), encChunk)
	case !bytes.Equal(b[12:20], e.id[:]):
		return fmt.Errorf("get %s: %w: written with key %x, this run has key %s", key, ErrKey, b[12:20], e.KeyID())
	}
	return nil
}

// chunkAD is the additional data of chunk i of the object under key.
func chunkAD(key string, i int) []byte {
	ad := make([]byte, 0, len(key)+9)
	ad = append(ad, key...)
	ad = append(ad, 0)
	return binary.BigEndian.AppendUint64(ad, uint64(i))
}

// List lists keys (Store's contract); keys are not encrypted.
func (e *Encrypted) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	return e.store.List(ctx, prefix, after, limit)
}

// Delete removes an object (Store's contract).
func (e *Encrypted) Delete(ctx context.Context, key string) error { return e.store.Delete(ctx, key) }

// Plain wraps a store used without a key: an object that starts like an
// encrypted one is refused with ErrKey instead of being handed on as
// garbage (its reader would call it corrupt).
func Plain(store Store) Store { return plainStore{store} }

type plainStore struct{ Store }

func (p plainStore) Get(ctx context.Context, key string, r Range) ([]byte, error) {
	b, err := p.Store.Get(ctx, key, r)
	whole := r.Off == 0 || r.IsSuffix() && int64(len(b)) < -r.Off
	if err == nil && whole && len(b) >= 5 && string(b[:4]) == encMagic && b[4] == encVersion {
		return nil, fmt.Errorf("get %s: %w: the object is encrypted (key %x): give its key", key, ErrKey, b[12:min(len(b), 20)])
	}
	return b, err
}

// CreateHashed passes through when the wrapped store has it.
func (p plainStore) CreateHashed(ctx context.Context, key string, body []byte, sha256hex string) error {
	if hc, ok := p.Store.(HashedCreator); ok {
		return hc.CreateHashed(ctx, key, body, sha256hex)
	}
	return p.Store.Create(ctx, key, body)
}

// CreateFile passes through when the wrapped store has it.
func (p plainStore) CreateFile(ctx context.Context, key, path string, size int64, sha256hex string) error {
	return CreateFromFile(ctx, p.Store, key, path, size, sha256hex)
}

// String names the wrapped store.
func (p plainStore) String() string { return fmt.Sprint(p.Store) }
