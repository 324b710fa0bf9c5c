package stream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/silt-dev/silt/pkg/brand"
)

// FlatEntry is an entry as the server sent it: its stream id and its
// fields as name, value pairs in the order they were added, "id" included.
// A name added twice is there twice (a map keeps the last).
type FlatEntry struct {
	StreamID brand.StreamID
	Pairs    []string // name, value, name, value, ...
}

// Get returns the value of the last field called name.
func (e FlatEntry) Get(name string) (string, bool) {
	for i := len(e.Pairs) - 2; i >= 0; i -= 2 {
		if e.Pairs[i] == name {
			return e.Pairs[i+1], true
		}
	}
	return "", false
}

// Fields returns the entry's fields as a map: a name added twice keeps its
// last value.
func (e FlatEntry) Fields() Fields {
	f := make(Fields, len(e.Pairs)/2)
	for i := 0; i+1 < len(e.Pairs); i += 2 {
		f[e.Pairs[i]] = e.Pairs[i+1]
	}
	return f
}

// Bytes is the entry's size as EntryBytes counts it: names and values.
func (e FlatEntry) Bytes() int {
	n := 0
	for _, s := range e.Pairs {
		n += len(s)
	}
	return n
}

// ReadFlat returns up to count entries with from <= stream id <= to, as
// stored, read once from the bytes of the server's reply (resp.go): the
// entries' Pairs share one backing array and are cut from one string, with
// no map per entry. Read and ReadRaw make their maps from it; the archive's
// fold encodes straight from the pairs.
func (l *Log) ReadFlat(ctx context.Context, from, to brand.StreamID, count int64) ([]FlatEntry, error) {
	args := []any{"XRANGE", l.key, from.String(), to.String(), "COUNT", count}
	if r, ok := sendRaw(ctx, l.rdb, l.replies.size(count), args...).reply(); ok {
		out, err := r.flat(l.key)
		l.replies.learn(len(r.s), len(out))
		return out, err
	}
	// Failed, on the network or with an error reply: again through Do.
	reply, err := l.rdb.Do(ctx, args...).Slice()
	if err == nil || errors.Is(err, redis.Nil) {
		return l.flatEntries(reply)
	}
	return nil, fmt.Errorf("xrange %s %s %s: %w", l.key, from, to, err)
}

// FlatReader reads entries as ReadFlat does, for a caller that may read
// page after page (an archive run's folds, a long read): the first page
// through ReadFlat, the pages after it on a connection of its own
// (ownConn), dialled at the second read, each reply read off the socket
// straight into the buffer its entries are cut from. A read of one page
// dials nothing. Where no such connection can be had (a cluster client) or
// while one that failed waits to be dialled again (ownSlot), it reads
// through ReadFlat. One goroutine reads at a time; Close releases the
// connection.
type FlatReader struct {
	l      *Log
	own    ownSlot
	reads  int
	closed bool
}

// FlatReader returns a reader of l's entries; Close it when done.
func (l *Log) FlatReader() *FlatReader { return &FlatReader{l: l} }

// Read returns up to count entries with from <= stream id <= to, as
// ReadFlat does.
func (r *FlatReader) Read(ctx context.Context, from, to brand.StreamID, count int64) ([]FlatEntry, error) {
	if r.reads++; r.reads == 1 || r.closed {
		return r.l.ReadFlat(ctx, from, to, count)
	}
	if own := r.own.get(ctx, r.l.rdb); own != nil { // none: ReadFlat's way
		replies, err := own.do(ctx, 0, r.l.replies.size(count), []string{"XRANGE", r.l.key, from.String(), to.String(), "COUNT", strconv.FormatInt(count, 10)})
		switch {
		case err != nil: // the connection is done with; ReadFlat reads it again
			r.own.fail()
			if cerr := ctx.Err(); cerr != nil {
				return nil, fmt.Errorf("xrange %s %s %s: %w", r.l.key, from, to, cerr)
			}
		case replies[0][0] != '-': // an error reply is read again through go-redis, which says it
			b := replies[0]
			rs := &resp{s: unsafe.String(&b[0], len(b))}
			out, err := rs.flat(r.l.key)
			r.l.replies.learn(len(b), len(out))
			return out, err
		}
	}
	return r.l.ReadFlat(ctx, from, to, count)
}

// Close releases the reader's connection.
func (r *FlatReader) Close() {
	r.own.drop()
	r.closed = true
}

// flatEntries turns an XRANGE reply that go-redis decoded, [[id, [name,
// value, ...]], ...], into entries.
func (l *Log) flatEntries(reply []any) ([]FlatEntry, error) {
	out := make([]FlatEntry, len(reply))
	pairs := 0
	for i, r := range reply {
		msg, ok := r.([]any)
		if !ok || len(msg) != 2 {
			return nil, fmt.Errorf("%s: xrange reply %d is %T of %d, not [id, fields]", l.key, i, r, len(msg))
		}
		fields, _ := msg[1].([]any)
		pairs += len(fields)
	}
	all := make([]string, 0, pairs)
	for i, r := range reply {
		msg := r.([]any)
		id, _ := msg[0].(string)
		sid, err := brand.ParseStreamID(id)
		if err != nil {
			return nil, fmt.Errorf("%s: server returned entry id %q: %w", l.key, msg[0], err)
		}
		fields, _ := msg[1].([]any)
		if len(fields)%2 != 0 {
			return nil, fmt.Errorf("%s: entry %s: %d field names and values, not pairs", l.key, sid, len(fields))
		}
		start := len(all)
		for _, f := range fields {
			all = append(all, str(f))
		}
		out[i] = FlatEntry{StreamID: sid, Pairs: all[start:len(all):len(all)]}
	}
	return out, nil
}

// CheckFlat reports what Decode would about e's "id" field: nil, or a
// *MalformedError.
func (l *Log) CheckFlat(e FlatEntry) error {
	rawID, hasID := e.Get(IDField)
	_, err := l.checkID(e.StreamID, rawID, hasID)
	return err
}
