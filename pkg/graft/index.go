package graft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// The commit index is a local cache of the slimmed commits (see
// Volume.KeepMeta): opening a volume then reads one small file instead of
// decoding every commit object, so a reader's start-up stays about the same
// whatever the archive's length. Only volumes with KeepMeta keep one.
//
// Layout: the magic "SILTIDX\x01", then one record per commit in LSN order
// from 1, each: uvarint length, payload, CRC-32C of the payload (u32,
// big-endian). A payload is, in uvarints and length-prefixed strings:
// version, LSN, hash, prev, segment key, segment size, segment SHA-256, pages,
// range count and the ranges (lo, hi), time (Unix ns, varint), meta count
// and the meta pairs sorted by key.
//
// The index is a cache, never the truth: it is written without fsync, a
// record that fails its checksum, its LSN or its prev hash ends it, the first
// commit file after it must chain to its last record, and the latest commit
// always comes from its file, so the hash chain covers the index too. When
// the files disagree with it, the volume loads the commit files as it would
// without an index. Whenever the index was damaged or behind, the open
// rewrites it whole (temp file and rename); a handle then appends a record
// per commit it slims.
const (
	indexName  = "commit-index"
	indexMagic = "SILTIDX\x01"
)

func (v *Volume) indexPath() string { return filepath.Join(v.dir, indexName) }

// loadIndex reads the valid prefix of the index into v.commits and reports
// whether the file is exactly that prefix. It reports nothing else: a missing
// or bad index just means more commit files to read. The file is left as it
// is (another process may be appending to it); writeIndex replaces it.
func (v *Volume) loadIndex() (clean bool) {
	v.indexed, v.indexOK = 0, false
	b, err := os.ReadFile(v.indexPath())
	if err != nil || len(b) < len(indexMagic) || string(b[:len(indexMagic)]) != indexMagic {
		return false
	}
	off := len(indexMagic)
	for off < len(b) {
		n, k := binary.Uvarint(b[off:])
		if k <= 0 || n > uint64(len(b)-off-k) || uint64(len(b)-off-k)-n < 4 {
			break
		}
		payload := b[off+k : off+k+int(n)]
		if crc(payload) != binary.BigEndian.Uint32(b[off+k+int(n):]) {
			break
		}
		c, prev, err := decodeIndexRecord(payload)
		if err != nil || c.LSN != uint64(len(v.commits))+1 || prev != v.headHash() {
			break
		}
		c.Volume = v.name
		v.commits = append(v.commits, c)
		off += k + int(n) + 4
	}
	v.indexed = len(v.commits)
	return off == len(b)
}

// writeIndex replaces the index with records of every commit but the
// latest, written to a temp file and renamed into place. A failure leaves
// the index unused by this handle; the next open tries again.
func (v *Volume) writeIndex() {
	v.indexed, v.indexOK = 0, false
	b := []byte(indexMagic)
	for _, c := range v.commits[:max(len(v.commits)-1, 0)] {
		b = v.appendIndexRecord(b, c)
	}
	f, err := os.CreateTemp(filepath.Join(v.dir, "tmp"), "index-*")
	if err != nil {
		return
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), v.indexPath())
	}
	if err != nil {
		os.Remove(f.Name())
		return
	}
	v.indexed, v.indexOK = max(len(v.commits)-1, 0), true
}

// appendIndex adds slim commit c, the next LSN of the index, at its end. A
// failure stops the index from growing for this handle; the next open reads
// the commit files beyond it and rewrites it.
func (v *Volume) appendIndex(c *Commit) {
	if c.LSN <= uint64(v.indexed) { // already there
		return
	}
	if !v.indexOK || c.LSN != uint64(v.indexed)+1 {
		v.indexOK = false
		return
	}
	f, err := os.OpenFile(v.indexPath(), os.O_WRONLY|os.O_APPEND, 0)
	if err == nil {
		_, err = f.Write(v.appendIndexRecord(nil, c))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		v.indexOK = false
		return
	}
	v.indexed++
}

// appendIndexRecord appends the record of loaded commit c to b.
func (v *Volume) appendIndexRecord(b []byte, c *Commit) []byte {
	prev := ""
	if c.LSN > 1 {
		prev = v.commits[c.LSN-2].Hash()
	}
	payload := encodeIndexRecord(c, prev)
	b = binary.AppendUvarint(b, uint64(len(payload)))
	b = append(b, payload...)
	return binary.BigEndian.AppendUint32(b, crc(payload))
}

func encodeIndexRecord(c *Commit, prev string) []byte {
	b := make([]byte, 0, 256)
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, uint64(c.Version))
	b = binary.AppendUvarint(b, c.LSN)
	str(c.hash)
	str(prev)
	str(c.Segment.Key)
	b = binary.AppendUvarint(b, uint64(c.Segment.Size))
	str(c.Segment.SHA256)
	b = binary.AppendUvarint(b, c.Pages)
	b = binary.AppendUvarint(b, uint64(len(c.Ranges)))
	for _, r := range c.Ranges {
		b = binary.AppendUvarint(b, r.Lo)
		b = binary.AppendUvarint(b, r.Hi)
	}
	b = binary.AppendVarint(b, c.Time.UnixNano())
	keys := make([]string, 0, len(c.Meta))
	for k := range c.Meta {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		str(k)
		str(c.Meta[k])
	}
	return b
}

var errIndexRecord = errors.New("bad commit index record")

// decodeIndexRecord returns the slim commit of a record and its prev hash.
func decodeIndexRecord(b []byte) (*Commit, string, error) {
	d := indexDecoder{b: b}
	c := &Commit{Version: int(d.uvarint()), LSN: d.uvarint()}
	c.hash = d.str()
	prev := d.str()
	c.Segment = SegmentRef{Key: d.str(), Size: int64(d.uvarint()), SHA256: d.str()}
	c.Pages = d.uvarint()
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		return nil, "", errIndexRecord
	}
	c.Ranges = make([]PageRange, n)
	for i := range c.Ranges {
		c.Ranges[i] = PageRange{Lo: d.uvarint(), Hi: d.uvarint()}
	}
	ns, k := binary.Varint(d.b)
	if k <= 0 {
		return nil, "", errIndexRecord
	}
	d.b = d.b[k:]
	c.Time = time.Unix(0, ns).UTC()
	n = d.uvarint()
	if n > uint64(len(d.b)) {
		return nil, "", errIndexRecord
	}
	c.Meta = make(map[string]string, n)
	for range n {
		k := d.str()
		c.Meta[k] = d.str()
	}
	if d.bad || len(d.b) != 0 || len(c.hash) != 64 {
		return nil, "", errIndexRecord
	}
	full := *c
	full.Prev = prev
	if err := full.Validate(); err != nil {
		return nil, "", err
	}
	return c, prev, nil
}

type indexDecoder struct {
	b   []byte
	bad bool
}

func (d *indexDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *indexDecoder) str() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.bad = true
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// headHash is the hash of the latest commit loaded ("" for none).
func (v *Volume) headHash() string {
	if len(v.commits) == 0 {
		return ""
	}
	return v.commits[len(v.commits)-1].Hash()
}

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
