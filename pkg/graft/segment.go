package graft

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"slices"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc(b ...[]byte) uint32 {
	var c uint32
	for _, p := range b {
		c = crc32.Update(c, castagnoli, p)
	}
	return c
}

// Segment file layout (all integers big-endian):
//
//	header   magic "SILTSEG\x00", version u16, flags u16, pages u32, lsn u64, crc u32, reserved u32   (32 bytes)
//	pages    per page: pgno u64, len u32, crc u32 (over pgno, len and data), data
//	index    per page, ascending pgno: pgno u64, offset of its record u64, len u32
//	trailer  index offset u64, index length u64, crc u32 (of everything before it), magic "SEGE"  (24 bytes)
const (
	segMagic      = "SILTSEG\x00"
	segVersion    = 1
	headerSize    = 32
	pageHeadSize  = 16
	indexItemSize = 20
	trailerSize   = 24
	trailerMagic  = "SEGE"
)

// SegmentHeader is the fixed-size start of a segment file.
type SegmentHeader struct {
	Version uint16
	Flags   uint16
	Pages   uint32
	LSN     uint64
}

// Validate checks what a header alone can tell.
func (h SegmentHeader) Validate() error {
	switch {
	case h.Version == 0:
		return fmt.Errorf("%w: version 0", ErrCorrupt)
	case h.Version > segVersion:
		return fmt.Errorf("%w: segment version %d, this build reads up to %d", ErrNewerFormat, h.Version, segVersion)
	case h.LSN == 0:
		return fmt.Errorf("%w: LSN 0", ErrCorrupt)
	}
	return nil
}

// Page is one page written by a commit.
type Page struct {
	No   uint64
	Data []byte
}

// indexEntry locates one page record inside a segment.
type indexEntry struct {
	No  uint64
	Off uint64 // of the page record (its 16-byte head)
	Len uint32 // of the data
}

// EncodeSegment lays pages (sorted by number, no duplicates) out as a segment of lsn.
func EncodeSegment(lsn uint64, pages []Page) ([]byte, error) {
	return appendSegment(nil, lsn, pages)
}

// appendSegment is EncodeSegment into dst's storage when it is large
// enough: a 4 MiB segment costs 0.7 ms laid into a buffer it reuses, 2.5-3.8
// ms into a new one (zeroed, then faulted in).
func appendSegment(dst []byte, lsn uint64, pages []Page) ([]byte, error) {
	return appendSegmentTelling(dst, lsn, pages, nil)
}

// laidChunk is how many bytes of a segment appendSegmentTelling lays out,
// at least, between two reports.
const laidChunk = 256 << 10

// appendSegmentTelling is appendSegment that hands laid, when it is not
// nil, each part of the segment once it is final, in order: about
// laidChunk bytes at a time, the last part at the end. The parts are the
// segment's own bytes, not copies: laid may hash them (on another
// goroutine) while the rest is laid out, and must not change them.
func appendSegmentTelling(dst []byte, lsn uint64, pages []Page, laid func(part []byte)) ([]byte, error) {
	if !slices.IsSortedFunc(pages, func(a, b Page) int { return cmp.Compare(a.No, b.No) }) {
		return nil, errors.New("encode segment: pages not sorted")
	}
	size := segmentSize(pages)
	var buf []byte
	if cap(dst) >= size {
		buf = dst[:headerSize]
		clear(buf)
	} else {
		buf = make([]byte, headerSize, size)
	}
	putHeader(buf, lsn, uint32(len(pages)))
	told := 0 // how much of buf laid has been handed
	// Each page's head is laid in place and its CRC taken from the buffer:
	// a head built apart escapes to the heap (crc32 is assembly), one
	// allocation a page.
	for i, p := range pages {
		if i > 0 && p.No == pages[i-1].No {
			return nil, fmt.Errorf("encode segment: page %d twice", p.No)
		}
		at := len(buf)
		buf = binary.BigEndian.AppendUint64(buf, p.No)
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(p.Data)))
		buf = append(buf, 0, 0, 0, 0)
		buf = append(buf, p.Data...)
		binary.BigEndian.PutUint32(buf[at+12:], crc(buf[at:at+12], buf[at+pageHeadSize:]))
		if laid != nil && len(buf)-told >= laidChunk {
			laid(buf[told:len(buf):len(buf)])
			told = len(buf)
		}
	}
	indexOff := uint64(len(buf))
	off := uint64(headerSize)
	for _, p := range pages {
		buf = appendIndexItem(buf, indexEntry{No: p.No, Off: off, Len: uint32(len(p.Data))})
		off += pageHeadSize + uint64(len(p.Data))
	}
	indexLen := uint64(len(buf)) - indexOff
	buf = binary.BigEndian.AppendUint64(buf, indexOff)
	buf = binary.BigEndian.AppendUint64(buf, indexLen)
	buf = binary.BigEndian.AppendUint32(buf, crc(buf))
	buf = append(buf, trailerMagic...)
	if laid != nil {
		laid(buf[told:len(buf):len(buf)])
	}
	return buf, nil
}

// segmentSize is the size of the segment of pages.
func segmentSize(pages []Page) int {
	size := headerSize + trailerSize + len(pages)*(pageHeadSize+indexItemSize)
	for _, p := range pages {
		size += len(p.Data)
	}
	return size
}

// putHeader lays a segment header into b (zeroed, headerSize bytes).
func putHeader(b []byte, lsn uint64, pages uint32) {
	copy(b, segMagic)
	binary.BigEndian.PutUint16(b[8:], segVersion)
	binary.BigEndian.PutUint32(b[12:], pages)
	binary.BigEndian.PutUint64(b[16:], lsn)
	binary.BigEndian.PutUint32(b[24:], crc(b[:24]))
}

func appendIndexItem(b []byte, e indexEntry) []byte {
	b = binary.BigEndian.AppendUint64(b, e.No)
	b = binary.BigEndian.AppendUint64(b, e.Off)
	return binary.BigEndian.AppendUint32(b, e.Len)
}

// segmentWriter writes a segment as its pages come, holding none of them:
// the header (whose page count is known in advance), each page record, then
// the index, spilled to a file of its own as the records go by, and the
// trailer; the trailer's CRC and the whole segment's SHA-256 are computed on
// the way. Its bytes are EncodeSegment's for the same pages. Compaction
// merges 64 MiB of small pages through it in constant memory.
type segmentWriter struct {
	w       io.Writer     // the segment
	index   *bufio.Writer // the spill of index items
	spill   io.ReadSeeker // what index writes to, read back by finish
	sum     hash.Hash
	crc     uint32
	off     uint64
	pages   uint32 // promised by the header
	written uint32
	last    uint64
	item    []byte // scratch for one index item
	err     error
}

// newSegmentWriter writes the header of a segment of pages pages at lsn to
// w; the index goes through spill (an empty file).
func newSegmentWriter(w io.Writer, spill io.ReadWriteSeeker, lsn uint64, pages uint32) *segmentWriter {
	s := &segmentWriter{w: w, index: bufio.NewWriterSize(spill, 64<<10), spill: spill, sum: sha256.New(), pages: pages}
	var h [headerSize]byte
	putHeader(h[:], lsn, pages)
	s.write(h[:])
	return s
}

// write passes b on to the segment, through the CRC and the hash.
func (s *segmentWriter) write(b []byte) {
	if s.err != nil {
		return
	}
	s.crc = crc32.Update(s.crc, castagnoli, b)
	s.sum.Write(b)
	_, s.err = s.w.Write(b)
	s.off += uint64(len(b))
}

// add writes the record of page no: its 16-byte head and its data, as a
// segment holds it (the caller has checked it). Pages come in ascending
// order.
func (s *segmentWriter) add(no uint64, rec []byte) error {
	switch {
	case s.err != nil:
		return s.err
	case s.written == s.pages:
		s.err = fmt.Errorf("write segment: page %d is one more than the %d of its header", no, s.pages)
	case s.written > 0 && no <= s.last:
		s.err = fmt.Errorf("write segment: page %d after page %d: pages not sorted", no, s.last)
	case len(rec) < pageHeadSize:
		s.err = fmt.Errorf("write segment: record of page %d is %d bytes", no, len(rec))
	}
	if s.err != nil {
		return s.err
	}
	s.item = appendIndexItem(s.item[:0], indexEntry{No: no, Off: s.off, Len: uint32(len(rec) - pageHeadSize)})
	if _, err := s.index.Write(s.item); err != nil {
		s.err = fmt.Errorf("write segment index: %w", err)
		return s.err
	}
	s.write(rec)
	s.written, s.last = s.written+1, no
	return s.err
}

// finish writes the index and the trailer and returns the segment's size
// and SHA-256 (hex).
func (s *segmentWriter) finish() (int64, string, error) {
	if s.err == nil && s.written != s.pages {
		s.err = fmt.Errorf("write segment: %d pages written, its header says %d", s.written, s.pages)
	}
	if s.err != nil {
		return 0, "", s.err
	}
	if err := s.index.Flush(); err != nil {
		return 0, "", fmt.Errorf("write segment index: %w", err)
	}
	if _, err := s.spill.Seek(0, io.SeekStart); err != nil {
		return 0, "", fmt.Errorf("write segment index: %w", err)
	}
	indexOff := s.off
	buf := make([]byte, 64<<10)
	for s.err == nil {
		n, err := s.spill.Read(buf)
		s.write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, "", fmt.Errorf("read segment index back: %w", err)
		}
	}
	if indexLen := s.off - indexOff; s.err == nil && indexLen != uint64(s.pages)*indexItemSize {
		s.err = fmt.Errorf("write segment: index of %d bytes read back, want %d", indexLen, uint64(s.pages)*indexItemSize)
	}
	t := make([]byte, 0, trailerSize)
	t = binary.BigEndian.AppendUint64(t, indexOff)
	t = binary.BigEndian.AppendUint64(t, s.off-indexOff)
	s.write(t)
	t = binary.BigEndian.AppendUint32(t[:0], s.crc) // the checksum and magic are outside it
	t = append(t, trailerMagic...)
	if s.err == nil {
		s.sum.Write(t)
		_, s.err = s.w.Write(t)
		s.off += uint64(len(t))
	}
	if s.err != nil {
		return 0, "", s.err
	}
	return int64(s.off), hex.EncodeToString(s.sum.Sum(nil)), nil
}

// Segment is a decoded, verified segment held in memory.
type Segment struct {
	Header SegmentHeader
	data   []byte
	index  []indexEntry
	fetch  func(indexEntry) ([]byte, error) // for remote segments read by range
}

// DecodeSegment parses and verifies a whole segment: header, trailer
// checksum, index order and bounds, and every page checksum. name is the
// file or object it came from, for errors.
func DecodeSegment(name string, b []byte) (*Segment, error) {
	fail := func(format string, args ...any) (*Segment, error) {
		return nil, fmt.Errorf("segment %s: %w: %s", name, ErrCorrupt, fmt.Sprintf(format, args...))
	}
	if len(b) < headerSize+trailerSize {
		return fail("%d bytes, shorter than header and trailer", len(b))
	}
	h, err := decodeHeader(b[:headerSize])
	if err != nil {
		return nil, fmt.Errorf("segment %s: %w", name, err)
	}
	t := b[len(b)-trailerSize:]
	if string(t[20:]) != trailerMagic {
		return fail("bad trailer magic")
	}
	if crc(b[:len(b)-trailerSize+16]) != binary.BigEndian.Uint32(t[16:]) {
		return fail("trailer checksum mismatch")
	}
	indexOff, indexLen := binary.BigEndian.Uint64(t[0:]), binary.BigEndian.Uint64(t[8:])
	if indexOff < headerSize || indexOff+indexLen != uint64(len(b)-trailerSize) || indexLen != uint64(h.Pages)*indexItemSize {
		return fail("index at %d+%d does not fit %d pages", indexOff, indexLen, h.Pages)
	}
	s := &Segment{Header: h, data: b}
	if s.index, err = decodeIndex(b[indexOff:indexOff+indexLen], indexOff); err != nil {
		return fail("%v", err)
	}
	for _, e := range s.index {
		if _, err := s.page(e); err != nil {
			return nil, fmt.Errorf("segment %s: %w", name, err)
		}
	}
	return s, nil
}

func decodeHeader(b []byte) (SegmentHeader, error) {
	if string(b[:8]) != segMagic {
		return SegmentHeader{}, fmt.Errorf("%w: not a segment (bad magic)", ErrCorrupt)
	}
	h := SegmentHeader{
		Version: binary.BigEndian.Uint16(b[8:]),
		Flags:   binary.BigEndian.Uint16(b[10:]),
		Pages:   binary.BigEndian.Uint32(b[12:]),
		LSN:     binary.BigEndian.Uint64(b[16:]),
	}
	if h.Version > segVersion { // before the checksum: a newer layout may differ
		return h, h.Validate()
	}
	if crc(b[:24]) != binary.BigEndian.Uint32(b[24:]) {
		return h, fmt.Errorf("%w: header checksum mismatch", ErrCorrupt)
	}
	return h, h.Validate()
}

// decodeIndex reads index entries, checking order and that each record lies
// before the index.
func decodeIndex(b []byte, limit uint64) ([]indexEntry, error) {
	idx := make([]indexEntry, len(b)/indexItemSize)
	for i := range idx {
		p := b[i*indexItemSize:]
		e := indexEntry{No: binary.BigEndian.Uint64(p), Off: binary.BigEndian.Uint64(p[8:]), Len: binary.BigEndian.Uint32(p[16:])}
		if i > 0 && e.No <= idx[i-1].No {
			return nil, fmt.Errorf("index not ascending at page %d", e.No)
		}
		if e.Off < headerSize || e.Off+pageHeadSize+uint64(e.Len) > limit {
			return nil, fmt.Errorf("page %d record at %d+%d outside the page area", e.No, e.Off, e.Len)
		}
		idx[i] = e
	}
	return idx, nil
}

// page returns a page's data after checking its record head and checksum.
func (s *Segment) page(e indexEntry) ([]byte, error) {
	return checkPage(s.data[e.Off:e.Off+pageHeadSize+uint64(e.Len)], e)
}

// checkPage verifies one page record (head and data) against its index entry.
func checkPage(rec []byte, e indexEntry) ([]byte, error) {
	if len(rec) != pageHeadSize+int(e.Len) {
		return nil, fmt.Errorf("%w: page %d: record of %d bytes, want %d", ErrCorrupt, e.No, len(rec), pageHeadSize+int(e.Len))
	}
	no, n := binary.BigEndian.Uint64(rec), binary.BigEndian.Uint32(rec[8:])
	data := rec[pageHeadSize:]
	if no != e.No || n != e.Len || (!negativeChecksum && crc(rec[:12], data) != binary.BigEndian.Uint32(rec[12:])) {
		return nil, fmt.Errorf("%w: page %d checksum mismatch", ErrCorrupt, e.No)
	}
	return data, nil
}

// Get returns page no's data, or nil and false if the segment lacks it.
func (s *Segment) Get(no uint64) ([]byte, bool) {
	data, err := s.Lookup(no)
	return data, err == nil && data != nil
}

// Lookup returns page no's data, nil if the segment lacks it, or the error
// of fetching it (remote segments read by range).
func (s *Segment) Lookup(no uint64) ([]byte, error) {
	i, ok := slices.BinarySearchFunc(s.index, no, func(e indexEntry, no uint64) int { return cmp.Compare(e.No, no) })
	if !ok {
		return nil, nil
	}
	if s.fetch != nil {
		return s.fetch(s.index[i])
	}
	data, err := s.page(s.index[i]) // verified at decode; checked again for safety
	return bytes.Clone(data), err
}

// Pages returns the page numbers the segment holds, ascending.
func (s *Segment) Pages() []uint64 {
	out := make([]uint64, len(s.index))
	for i, e := range s.index {
		out[i] = e.No
	}
	return out
}
