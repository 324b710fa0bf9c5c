package export

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math"
	"strings"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/fence"
)

// manifestVersion is the format of a manifest object; a reader refuses a
// newer one rather than guess at it.
const manifestVersion = 1

// ManifestRoot is where the manifests live under the target.
const ManifestRoot = "_silt/export"

// Manifest records one exported file: the range of the merged history it
// covers and what the file holds.
type Manifest struct {
	Version int    `json:"version"`
	Seq     uint64 `json:"seq"`            // 1, 2, ... per exported stream
	Prev    string `json:"prev,omitempty"` // SHA-256 of the previous manifest object
	// Source names the archive exported (its volume: prefix/queue/stream)
	// and Identity the archive's identity once it has commits; a target
	// refuses the export of another source under the same name.
	Source   string `json:"source"`
	Identity string `json:"identity,omitempty"`
	Name     string `json:"name"` // the stream= partition
	Format   Format `json:"format"`
	// From and To bound the covered range of stream ids, both included:
	// every entry of the merged history in it is in File, once.
	From      string    `json:"from"`
	To        string    `json:"to"`
	File      string    `json:"file"`
	Rows      int64     `json:"rows"`
	Malformed int64     `json:"malformed,omitempty"`
	Bytes     int64     `json:"bytes"`
	SHA256    string    `json:"sha256"` // of the file's bytes
	Time      time.Time `json:"time"`

	raw []byte // the object as stored
	key string
}

// Covered returns the manifest's range.
func (m *Manifest) Covered() (from, to brand.StreamID, err error) {
	if from, err = brand.ParseStreamID(m.From); err != nil {
		return from, to, fmt.Errorf("manifest %s: from %q: %w", m.key, m.From, err)
	}
	if to, err = brand.ParseStreamID(m.To); err != nil {
		return from, to, fmt.Errorf("manifest %s: to %q: %w", m.key, m.To, err)
	}
	return from, to, nil
}

// Hash is the SHA-256 of the stored manifest object, the next one's Prev.
func (m *Manifest) Hash() string {
	sum := sha256.Sum256(m.raw)
	return hex.EncodeToString(sum[:])
}

func manifestDir(name string) string { return ManifestRoot + "/" + name + "/" }

func manifestKey(name string, seq uint64) string {
	return manifestDir(name) + fmt.Sprintf("%020d", math.MaxUint64-seq) + ".json"
}

// ErrCorrupt is wrapped by errors about a manifest or file that is not what
// the chain says.
var ErrCorrupt = errors.New("export corrupt")

func decodeManifest(key string, obj []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(obj, &m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w: %v", key, ErrCorrupt, err)
	}
	if m.Version > manifestVersion {
		return nil, fmt.Errorf("manifest %s: format version %d is newer than this build's %d: upgrade silt", key, m.Version, manifestVersion)
	}
	if m.Seq == 0 || manifestKey(m.Name, m.Seq) != key {
		return nil, fmt.Errorf("manifest %s: %w: names seq %d of %q", key, ErrCorrupt, m.Seq, m.Name)
	}
	m.raw, m.key = obj, key
	if _, _, err := m.Covered(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return &m, nil
}

// Head returns the newest manifest of the export named name in store, or
// ok false when nothing was exported there yet. One LIST of one key and one
// GET.
func Head(ctx context.Context, store fence.Store, name string) (m *Manifest, ok bool, err error) {
	keys, err := store.List(ctx, manifestDir(name), "", 1)
	if err != nil {
		return nil, false, fmt.Errorf("list export manifests of %s: %w", name, err)
	}
	if len(keys) == 0 {
		return nil, false, nil
	}
	m, err = getManifest(ctx, store, keys[0])
	return m, err == nil, err
}

func getManifest(ctx context.Context, store fence.Store, key string) (*Manifest, error) {
	obj, err := store.Get(ctx, key, fence.Range{})
	if err != nil {
		return nil, fmt.Errorf("read export manifest %s: %w", key, err)
	}
	return decodeManifest(key, obj)
}

// Manifests yields every manifest of the export named name, oldest first.
// It lists the whole chain: for verification, not for a run.
func Manifests(ctx context.Context, store fence.Store, name string) iter.Seq2[*Manifest, error] {
	return func(yield func(*Manifest, error) bool) {
		var keys []string
		after := ""
		for {
			page, err := store.List(ctx, manifestDir(name), after, 1000)
			if err != nil {
				yield(nil, fmt.Errorf("list export manifests of %s: %w", name, err))
				return
			}
			keys = append(keys, page...)
			if len(page) < 1000 {
				break
			}
			after = page[len(page)-1]
		}
		for i := len(keys) - 1; i >= 0; i-- { // newest first in the store
			if !strings.HasSuffix(keys[i], ".json") {
				continue
			}
			m, err := getManifest(ctx, store, keys[i])
			if !yield(m, err) || err != nil {
				return
			}
		}
	}
}

// create stores m as the next manifest. A taken key means another export
// committed this seq first: ErrRaced.
func (m *Manifest) create(ctx context.Context, store fence.Store) error {
	m.Version = manifestVersion
	obj, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	m.key = manifestKey(m.Name, m.Seq)
	m.raw = append(obj, '\n')
	if err := store.Create(ctx, m.key, m.raw); err != nil {
		if errors.Is(err, fence.ErrExists) {
			return fmt.Errorf("manifest %s (seq %d): %w", m.key, m.Seq, ErrRaced)
		}
		return fmt.Errorf("create export manifest %s: %w", m.key, err)
	}
	return nil
}

// ErrRaced is wrapped when another export of the same stream to the same
// target committed the manifest this one was about to: nothing of this
// run's last file was written; run again to continue after it.
var ErrRaced = errors.New("another export of this stream committed first")

// fileKey names the file of the rows first..last: deterministic from the
// range, in the partition of first's mint hour.
func fileKey(name string, f Format, first, last brand.StreamID) string {
	t := first.Time().UTC()
	return "stream=" + name + "/date=" + t.Format("2006-01-02") + "/hour=" + fmt.Sprintf("%02d", t.Hour()) +
		"/" + first.String() + "_" + last.String() + "." + string(f)
}

func hourOf(s brand.StreamID) uint64 { return s.MS / uint64(time.Hour/time.Millisecond) }

// Verify checks the export named name in store: the manifests form one
// chain (seq 1, 2, ... each naming its predecessor's hash), their ranges
// ascend without overlap, and every file is there with the size and SHA-256
// its manifest announces; a target holding no export of name is ErrNoExport.
// It reads every object: an audit, not a run's step.
func Verify(ctx context.Context, store fence.Store, name string) error {
	_, err := VerifyReport(ctx, store, name)
	return err
}

// VerifyReport is Verify, with what the verified export holds: its files,
// rows, bytes and the last stream id it covers.
func VerifyReport(ctx context.Context, store fence.Store, name string) (Result, error) {
	var res Result
	err := verifyChain(ctx, store, name, func(m *Manifest) {
		res.Files, res.Rows, res.Bytes, res.UpTo = res.Files+1, res.Rows+m.Rows, res.Bytes+m.Bytes, m.To
	})
	return res, err
}

// verifyChain checks the manifest chain of name and each file, calling
// seen with each manifest that checked out.
func verifyChain(ctx context.Context, store fence.Store, name string, seen func(*Manifest)) error {
	var prev *Manifest
	var prevTo brand.StreamID
	for m, err := range Manifests(ctx, store, name) {
		if err != nil {
			return err
		}
		from, to, _ := m.Covered()
		switch {
		case prev == nil && m.Seq != 1:
			return fmt.Errorf("export %s: the oldest manifest is seq %d, want 1: %w", name, m.Seq, ErrCorrupt)
		case prev != nil && (m.Seq != prev.Seq+1 || m.Prev != prev.Hash()):
			return fmt.Errorf("export %s: manifest %d does not follow manifest %d (seq or prev hash): %w", name, m.Seq, prev.Seq, ErrCorrupt)
		case prev != nil && from.Compare(prevTo) <= 0:
			return fmt.Errorf("export %s: manifest %d covers from %s, at or below manifest %d's end %s: %w", name, m.Seq, m.From, prev.Seq, prev.To, ErrCorrupt)
		case to.Compare(from) < 0:
			return fmt.Errorf("export %s: manifest %d covers %s..%s, an empty range: %w", name, m.Seq, m.From, m.To, ErrCorrupt)
		}
		body, err := store.Get(ctx, m.File, fence.Range{})
		if err != nil {
			return fmt.Errorf("export %s: manifest %d's file %s: %w", name, m.Seq, m.File, err)
		}
		sum := sha256.Sum256(body)
		if int64(len(body)) != m.Bytes || hex.EncodeToString(sum[:]) != m.SHA256 {
			return fmt.Errorf("export %s: %s holds %d bytes (sha256 %x); manifest %d announces %d (sha256 %s): %w",
				name, m.File, len(body), sum, m.Seq, m.Bytes, m.SHA256, ErrCorrupt)
		}
		prev, prevTo = m, to
		seen(m)
	}
	if prev == nil {
		return fmt.Errorf("export %s: %w", name, ErrNoExport)
	}
	return nil
}

// ErrNoExport is wrapped when the target holds no export of the name: a
// wrong target or prefix, or nothing exported yet.
var ErrNoExport = errors.New("no export of this stream under the target (wrong target or prefix?)")
