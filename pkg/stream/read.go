package stream

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"time"

	"github.com/silt-dev/silt/pkg/brand"
)

// ErrMalformed is wrapped by every MalformedError.
var ErrMalformed = errors.New("malformed entry")

// Entry is one stream entry read back.
type Entry struct {
	ID       brand.ID       // the branded id; zero when the entry is malformed
	StreamID brand.StreamID // the entry's id in the stream
	Fields   Fields         // the payload, without the "id" field
}

// MalformedError describes an entry whose "id" field is missing, unparsable,
// of the wrong kind, or names another stream id than the entry's own. The
// entry comes with it, so nothing is silently dropped.
type MalformedError struct {
	Key      string         // the stream key
	StreamID brand.StreamID // the entry's raw stream id
	RawID    string         // the "id" field as stored ("" when missing)
	Reason   string
}

func (e *MalformedError) Error() string {
	return fmt.Sprintf("%s: entry %s: %s", e.Key, e.StreamID, e.Reason)
}

// Unwrap returns ErrMalformed.
func (e *MalformedError) Unwrap() error { return ErrMalformed }

// Bounds for reads: the first and the last possible stream id.
var (
	First = brand.StreamID{}
	Last  = brand.StreamID{MS: math.MaxUint64, Seq: math.MaxUint64}
)

// Read yields the entries with from <= stream id <= to in mint order, fetching
// PageSize entries per XRANGE, so memory stays bounded whatever the range. A
// malformed entry is yielded with a *MalformedError and iteration goes on; a
// Redis error is yielded once and ends the iteration.
func (l *Log) Read(ctx context.Context, from, to brand.StreamID) iter.Seq2[Entry, error] {
	return func(yield func(Entry, error) bool) {
		r := l.FlatReader()
		defer r.Close()
		for from.Compare(to) <= 0 {
			page, err := r.Read(ctx, from, to, l.PageSize)
			if err != nil {
				yield(Entry{}, err)
				return
			}
			for _, raw := range page {
				e, err := l.decodeFields(raw.StreamID, raw.Fields())
				if !yield(e, err) {
					return
				}
				from = e.StreamID
			}
			if int64(len(page)) < l.PageSize {
				return
			}
			var more bool
			if from, more = from.Next(); !more {
				return
			}
		}
	}
}

// ReadWindow yields the entries minted from t0 to t1, both milliseconds included.
func (l *Log) ReadWindow(ctx context.Context, t0, t1 time.Time) iter.Seq2[Entry, error] {
	return l.Read(ctx, brand.WindowStart(t0), brand.WindowEnd(t1))
}

// ReadSince yields the entries minted at or after t0.
func (l *Log) ReadSince(ctx context.Context, t0 time.Time) iter.Seq2[Entry, error] {
	return l.Read(ctx, brand.WindowStart(t0), Last)
}

// RawEntry is an entry exactly as stored: its stream id and every field,
// "id" included.
type RawEntry struct {
	StreamID brand.StreamID
	Fields   map[string]string
}

// ReadRaw returns up to count entries with from <= stream id <= to, as stored.
func (l *Log) ReadRaw(ctx context.Context, from, to brand.StreamID, count int64) ([]RawEntry, error) {
	page, err := l.ReadFlat(ctx, from, to, count)
	if err != nil {
		return nil, err
	}
	out := make([]RawEntry, len(page))
	for i, e := range page {
		out[i] = RawEntry{StreamID: e.StreamID, Fields: e.Fields()}
	}
	return out, nil
}

// Decode checks a raw entry as Read does: the Entry, and a *MalformedError
// when its "id" field is missing, bad, of another kind or names another id.
func (l *Log) Decode(raw RawEntry) (Entry, error) {
	e := Entry{StreamID: raw.StreamID, Fields: make(Fields, len(raw.Fields))}
	for k, v := range raw.Fields {
		if k != IDField {
			e.Fields[k] = v
		}
	}
	rawID, hasID := raw.Fields[IDField]
	id, err := l.checkID(raw.StreamID, rawID, hasID)
	e.ID = id
	return e, err
}

// CheckRaw reports what Decode would about raw's "id" field, without copying
// its fields: nil, or a *MalformedError.
func (l *Log) CheckRaw(raw RawEntry) error {
	rawID, hasID := raw.Fields[IDField]
	_, err := l.checkID(raw.StreamID, rawID, hasID)
	return err
}

// decodeFields checks an entry decoded into f, "id" included, against the
// stream id and the log's kind: the "id" field is taken out of f, which
// becomes the Entry's.
func (l *Log) decodeFields(sid brand.StreamID, f Fields) (Entry, error) {
	raw, hasID := f[IDField]
	if hasID {
		delete(f, IDField)
	}
	id, err := l.checkID(sid, raw, hasID)
	return Entry{ID: id, StreamID: sid, Fields: f}, err
}

// checkID parses an entry's "id" field and checks it against the entry's
// stream id and the log's kind. An entry without one gets the branded id its
// stream id maps to (a producer that is not silt); only one whose stream id
// is beyond a branded id's range is malformed. An "id" field that disagrees
// with the stream id stays refused: that is tampering, not another producer.
func (l *Log) checkID(sid brand.StreamID, raw string, hasID bool) (brand.ID, error) {
	bad := func(reason string) (brand.ID, error) {
		return brand.ID{}, &MalformedError{Key: l.key, StreamID: sid, RawID: raw, Reason: reason}
	}
	if !hasID {
		// An entry another producer wrote (XADD key * ...): its branded id
		// is its stream id under the stream's kind, field by field.
		id, err := brand.New(l.Kind(), sid)
		if err != nil {
			return bad(fmt.Sprintf(`no "id" field, and its stream id %s cannot be a branded id: %v`, sid, err))
		}
		return id, nil
	}
	id, err := brand.Parse(raw)
	switch {
	case err != nil:
		return bad(err.Error())
	case id.Kind != l.Kind():
		return bad(fmt.Sprintf("id %s is of kind %s, the stream holds %s", raw, id.Kind, l.Kind()))
	case id.StreamID != sid:
		return bad(fmt.Sprintf("id %s names %s, not the entry's own id", raw, id.StreamID))
	}
	return id, nil
}
