package brand

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ErrInvalid is wrapped by every parse error of this package; match it with errors.Is.
var ErrInvalid = errors.New("invalid id")

// ParseError reports why an input is not a branded id or a stream id.
type ParseError struct {
	Input  string // the rejected input, as given
	Reason string // what is wrong with it
	Err    error  // ErrInvalid
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("brand: %q: %s", e.Input, e.Reason)
}

// Unwrap returns the sentinel the error belongs to.
func (e *ParseError) Unwrap() error { return e.Err }

func invalid(input, format string, args ...any) error {
	return &ParseError{Input: input, Reason: fmt.Sprintf(format, args...), Err: ErrInvalid}
}

// Kind is the three-letter upper-case type of a branded id, such as EVT.
type Kind string

// The built-in kinds. Any other three upper-case letters are a kind too.
const (
	USR Kind = "USR" // users
	RMM Kind = "RMM" // rooms
	RND Kind = "RND" // rounds
	JOB Kind = "JOB" // jobs
	GES Kind = "GES" // gestures
	EVT Kind = "EVT" // events
)

// builtIn are the kinds silt knows by name.
var builtIn = [...]Kind{USR, RMM, RND, JOB, GES, EVT}

// ParseKind returns s as a Kind if it is well formed: three upper-case
// letters. Any such kind is a kind; which ones a stream may hold is the
// stream's business (pkg/stream records each stream's kind), not a
// process-wide list's.
func ParseKind(s string) (Kind, error) {
	if err := checkKindSyntax(s); err != nil {
		return "", err
	}
	return Kind(s), nil
}

// BuiltIn reports whether k is one of the built-in kinds (USR RMM RND JOB
// GES EVT): the CLI asks for --new-kind before starting a stream of another.
func (k Kind) BuiltIn() bool {
	for _, b := range builtIn {
		if k == b {
			return true
		}
	}
	return false
}

func checkKindSyntax(s string) error {
	if len(s) != KindLen {
		return invalid(s, "kind must be %d upper-case letters", KindLen)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return invalid(s, "kind must be %d upper-case letters", KindLen)
		}
	}
	return nil
}

// Sizes of the textual form.
const (
	KindLen = 3                     // letters in a kind
	msLen   = 10                    // base32 digits of the milliseconds
	seqLen  = 13                    // base32 digits of the sequence
	BodyLen = msLen + seqLen        // base32 digits after the underscore
	Len     = KindLen + 1 + BodyLen // length of a branded id
)

// MaxMS is the largest millisecond a branded id can carry (2^50-1, year 37648).
const MaxMS = 1<<(5*msLen) - 1

// MaxSeq is the largest sequence number (the full range of a stream id's seq).
const MaxSeq = math.MaxUint64

// StreamID is a Redis stream entry id <ms>-<seq>.
type StreamID struct {
	MS  uint64
	Seq uint64
}

// String returns the Redis form <ms>-<seq>.
func (s StreamID) String() string {
	return strconv.FormatUint(s.MS, 10) + "-" + strconv.FormatUint(s.Seq, 10)
}

// Compare returns -1, 0 or +1 as s is before, equal to or after o.
func (s StreamID) Compare(o StreamID) int {
	switch {
	case s.MS != o.MS:
		return cmp(s.MS, o.MS)
	default:
		return cmp(s.Seq, o.Seq)
	}
}

// Next returns the smallest stream id after s, and false if s is the largest.
func (s StreamID) Next() (StreamID, bool) {
	switch {
	case s.Seq < MaxSeq:
		return StreamID{s.MS, s.Seq + 1}, true
	case s.MS < math.MaxUint64:
		return StreamID{s.MS + 1, 0}, true
	}
	return s, false
}

// Prev returns the largest stream id before s, and false if s is 0-0.
func (s StreamID) Prev() (StreamID, bool) {
	switch {
	case s.Seq > 0:
		return StreamID{s.MS, s.Seq - 1}, true
	case s.MS > 0:
		return StreamID{s.MS - 1, MaxSeq}, true
	}
	return s, false
}

// Time returns the stream id's milliseconds as a UTC time.
func (s StreamID) Time() time.Time { return time.UnixMilli(int64(s.MS)).UTC() }

// IsZero reports whether s is 0-0, which Redis never assigns to an entry.
func (s StreamID) IsZero() bool { return s == StreamID{} }

func cmp(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ParseStreamID parses a complete Redis stream id <ms>-<seq>.
func ParseStreamID(s string) (StreamID, error) {
	msPart, seqPart, ok := strings.Cut(s, "-")
	if !ok {
		return StreamID{}, invalid(s, "stream id must be <ms>-<seq>")
	}
	ms, err := parseDecimal(msPart)
	if err != nil {
		return StreamID{}, invalid(s, "stream id milliseconds: %v", err)
	}
	seq, err := parseDecimal(seqPart)
	if err != nil {
		return StreamID{}, invalid(s, "stream id sequence: %v", err)
	}
	return StreamID{ms, seq}, nil
}

// parseDecimal accepts only plain decimal digits: no sign, no spaces.
func parseDecimal(s string) (uint64, error) {
	if s == "" {
		return 0, errors.New("empty")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%q is not a decimal number", s)
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	return n, nil
}
