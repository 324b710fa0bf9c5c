package brand

import (
	"time"
)

// crockford is Crockford's base32 alphabet; its ASCII order is its numeric order.
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// decode maps an ASCII byte to its base32 value, or 0xFF when it is not a digit.
var decode = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xFF
	}
	for i := 0; i < len(crockford); i++ {
		t[crockford[i]] = byte(i)
	}
	return t
}()

// ID is a branded id: a kind and the stream id it corresponds to.
type ID struct {
	Kind Kind
	StreamID
}

// New returns the branded id of kind for a stream id. It fails when the kind is
// malformed or the milliseconds exceed MaxMS.
func New(kind Kind, sid StreamID) (ID, error) {
	if _, err := ParseKind(string(kind)); err != nil {
		return ID{}, err
	}
	if sid.MS > MaxMS {
		return ID{}, invalid(sid.String(), "milliseconds exceed %d", uint64(MaxMS))
	}
	return ID{Kind: kind, StreamID: sid}, nil
}

// FromStreamID parses a Redis stream id and brands it with kind.
func FromStreamID(kind Kind, s string) (ID, error) {
	sid, err := ParseStreamID(s)
	if err != nil {
		return ID{}, err
	}
	return New(kind, sid)
}

// String returns the textual form KIND_body.
func (id ID) String() string {
	var b [Len]byte
	copy(b[:], id.Kind)
	b[KindLen] = '_'
	encode(b[KindLen+1:KindLen+1+msLen], id.MS)
	encode(b[KindLen+1+msLen:], id.Seq)
	return string(b[:])
}

// encode writes v as fixed-width base32, most significant digit first.
func encode(dst []byte, v uint64) {
	for i := len(dst) - 1; i >= 0; i-- {
		dst[i] = crockford[v&31]
		v >>= 5
	}
}

// MarshalText implements encoding.TextMarshaler.
func (id ID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with the rules of Parse.
func (id *ID) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

// Compare orders ids by kind, then mint order.
func (id ID) Compare(o ID) int {
	switch {
	case id.Kind < o.Kind:
		return -1
	case id.Kind > o.Kind:
		return 1
	}
	return id.StreamID.Compare(o.StreamID)
}

// Parse parses a branded id strictly: exact length, an upper-case
// kind, an underscore, and 23 upper-case Crockford digits in range.
func Parse(s string) (ID, error) {
	if len(s) != Len {
		return ID{}, invalid(s, "length %d, want %d (KIND_ and %d base32 digits)", len(s), Len, BodyLen)
	}
	kind := Kind(s[:KindLen])
	if checkKindSyntax(string(kind)) != nil {
		return ID{}, invalid(s, "kind %q must be %d upper-case letters", kind, KindLen)
	}
	if s[KindLen] != '_' {
		return ID{}, invalid(s, "want '_' after the kind")
	}
	body := s[KindLen+1:]
	ms, ok := decodeDigits(body[:msLen])
	if !ok {
		return ID{}, invalid(s, "body must be upper-case Crockford base32 (0-9, A-Z without I, L, O, U)")
	}
	seq, ok := decodeDigits(body[msLen:])
	if !ok {
		return ID{}, invalid(s, "body must be upper-case Crockford base32 (0-9, A-Z without I, L, O, U)")
	}
	// The sequence's 13 digits hold 65 bits; the top one may carry only 4 of them.
	if decode[body[msLen]] > 0x0F {
		return ID{}, invalid(s, "sequence exceeds %d", uint64(MaxSeq))
	}
	return ID{Kind: kind, StreamID: StreamID{MS: ms, Seq: seq}}, nil
}

// MustParse is Parse that panics on error, for tests and constants.
func MustParse(s string) ID {
	id, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return id
}

func decodeDigits(s string) (uint64, bool) {
	var v uint64
	for i := 0; i < len(s); i++ {
		d := decode[s[i]]
		if d == 0xFF {
			return 0, false
		}
		v = v<<5 | uint64(d)
	}
	return v, true
}

// WindowStart returns the smallest stream id of t's millisecond: t0 of an
// inclusive time window.
func WindowStart(t time.Time) StreamID { return StreamID{MS: uint64(t.UnixMilli()), Seq: 0} }

// WindowEnd returns the largest stream id of t's millisecond: t1 of an
// inclusive time window.
func WindowEnd(t time.Time) StreamID { return StreamID{MS: uint64(t.UnixMilli()), Seq: MaxSeq} }
