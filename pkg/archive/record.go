package archive

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/silt-dev/silt/pkg/brand"
)

// RecordBase is the first page number of the archive's reserved range;
// pages below it are free for other ("business") use of the volume.
const RecordBase = 1 << 62

// recordVersion is the version byte of every encoded record.
const recordVersion = 1

// Record flags.
const (
	flagMalformed = 1 << iota // the entry's "id" field was missing or bad; archived as is
)

// Record is one archived stream entry, with every field as stored
// (the "id" field included).
type Record struct {
	StreamID  brand.StreamID
	Fields    map[string]string
	Malformed bool
}

// ErrBadRecord is wrapped by errors decoding a record page.
var ErrBadRecord = errors.New("bad archive record")

// encodeRecord lays a record out as: version, flags, ms, seq, field count,
// then length-prefixed names and values (uvarints), names in sorted order.
func encodeRecord(r Record) []byte {
	pairs := make([]string, 0, 2*len(r.Fields))
	for k, v := range r.Fields {
		pairs = append(pairs, k, v)
	}
	b, _ := appendRecord(make([]byte, 0, maxRecordSize(pairs)), r.StreamID, r.Malformed, pairs, nil)
	return b
}

// maxRecordSize bounds the encoded size of a record of these fields
// (name, value pairs).
func maxRecordSize(pairs []string) int {
	n := 2 + 3*binary.MaxVarintLen64
	for _, s := range pairs {
		n += binary.MaxVarintLen64 + len(s)
	}
	return n
}

// appendRecord appends the encoding of entry sid, whose fields are pairs
// (name, value, ...; a name given twice keeps its last value, as a map
// would), to b. order is scratch space (may be nil), returned for reuse.
func appendRecord(b []byte, sid brand.StreamID, malformed bool, pairs []string, order []int) ([]byte, []int) {
	order = sortedNames(pairs, order)
	flags := byte(0)
	if malformed {
		flags |= flagMalformed
	}
	b = append(b, recordVersion, flags)
	b = binary.AppendUvarint(b, sid.MS)
	b = binary.AppendUvarint(b, sid.Seq)
	b = binary.AppendUvarint(b, uint64(len(order)))
	for _, i := range order {
		b = binary.AppendUvarint(b, uint64(len(pairs[i])))
		b = append(b, pairs[i]...)
		b = binary.AppendUvarint(b, uint64(len(pairs[i+1])))
		b = append(b, pairs[i+1]...)
	}
	return b, order
}

// sortedNames returns the indexes in pairs of the names, sorted, each name
// once: the index of its last occurrence.
func sortedNames(pairs []string, order []int) []int {
	order = order[:0]
	for i := 0; i+1 < len(pairs); i += 2 {
		order = append(order, i)
	}
	byName := func(i, j int) bool { return pairs[i] < pairs[j] }
	if len(order) <= 12 { // an entry's few fields: insertion sort, stable
		for i := 1; i < len(order); i++ {
			for j := i; j > 0 && byName(order[j], order[j-1]); j-- {
				order[j], order[j-1] = order[j-1], order[j]
			}
		}
	} else {
		slices.SortStableFunc(order, func(i, j int) int { return strings.Compare(pairs[i], pairs[j]) })
	}
	kept := order[:0]
	for n, i := range order {
		if n+1 < len(order) && pairs[order[n+1]] == pairs[i] {
			continue // a later value of the same name follows
		}
		kept = append(kept, i)
	}
	return kept
}

// decodeRecord parses a record page.
func decodeRecord(b []byte) (Record, error) {
	var r Record
	if len(b) < 2 {
		return r, fmt.Errorf("%w: %d bytes", ErrBadRecord, len(b))
	}
	if b[0] != recordVersion {
		return r, fmt.Errorf("%w: version %d, this build reads %d", ErrBadRecord, b[0], recordVersion)
	}
	r.Malformed = b[1]&flagMalformed != 0
	d := decoder{b: b[2:]}
	r.StreamID.MS, r.StreamID.Seq = d.uvarint(), d.uvarint()
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) {
		d.err = fmt.Errorf("%d fields in %d bytes", n, len(d.b))
	}
	r.Fields = make(map[string]string, min(n, 1024))
	for i := uint64(0); i < n && d.err == nil; i++ {
		k := d.bytes()
		r.Fields[k] = d.bytes()
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return r, fmt.Errorf("%w: %v", ErrBadRecord, d.err)
	}
	return r, nil
}

// streamIDOf reads only the stream id of a record page.
func streamIDOf(b []byte) (brand.StreamID, error) {
	if len(b) < 2 || b[0] != recordVersion {
		return brand.StreamID{}, fmt.Errorf("%w: bad header", ErrBadRecord)
	}
	d := decoder{b: b[2:]}
	sid := brand.StreamID{MS: d.uvarint(), Seq: d.uvarint()}
	return sid, d.err
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("truncated number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("string of %d bytes in %d", n, len(d.b))
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
