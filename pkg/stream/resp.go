package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/redis/go-redis/v9"
	"github.com/silt-dev/silt/pkg/brand"
)

// The replies silt reads in bulk, XRANGE's and XREADGROUP's, are read from
// the bytes the server sent (go-redis's RawWriteToCmd, rawRead): the whole
// reply is read as one string and every id, name and value is cut from it,
// so a reply of a thousand entries costs no allocation per string, where a
// decoded reply's tree costs one and an interface box. A name or value
// kept after its entry is handled keeps its reply's bytes alive with it.
//
// go-redis does not read an error reply to such a command as an error, so
// it neither follows MOVED or ASK nor retries on one, and it retries no
// such command that fails on the network: a read answered with an error,
// or not answered, goes again through Do, whose reply is decoded as a tree
// (flat.go, message.go), and whose error is go-redis's.

// processor is what a raw command is sent or queued on: a Client or a
// pipeline.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// rawRead is a read sent (or queued on a pipeline) as a go-redis
// RawWriteToCmd, whose reply is written into a buffer of about the size
// hinted. A RawCmd's buffer grows by append, about 1.25 times a step past
// 256 bytes, so a reply of a thousand entries costs about five times its
// size in allocations; a buffer sized from the replies before is allocated
// once. go-redis never retries a command that writes into a writer (what
// it wrote cannot be taken back), nor a pipeline holding one: a read that
// fails goes again through Do (and its pipeline's other commands with it,
// readNew), which follows MOVED and ASK and retries as go-redis does. Only
// reads, which are the same sent twice, go this way.
type rawRead struct {
	cmd *redis.RawWriteToCmd
	w   replyBuf
}

// sendRaw sends args on c, or queues them on a pipeline, as a rawRead.
func sendRaw(ctx context.Context, c processor, hint int, args ...any) *rawRead {
	r := &rawRead{w: replyBuf{b: make([]byte, 0, max(hint, minReplyBuf))}}
	r.cmd = redis.NewRawWriteToCmd(ctx, &r.w, args...)
	_ = c.Process(ctx, r.cmd) // its error is cmd's
	return r
}

// reply returns the read's reply to read. ok is false when the read
// failed, on the network or with an error reply: send it again through Do.
func (r *rawRead) reply() (_ *resp, ok bool) {
	b := r.w.b
	if r.cmd.Err() != nil || len(b) == 0 || b[0] == '-' || b[0] == '!' {
		return nil, false
	}
	// The reply is the read's alone and never written again: the string
	// shares its bytes instead of copying them.
	return &resp{s: unsafe.String(&b[0], len(b))}, true
}

// minReplyBuf is the least a raw read's buffer starts with: a reply of
// an entry or two of a few fields.
const minReplyBuf = 1 << 10

// replyBuf is the writer a raw read's reply goes into.
type replyBuf struct{ b []byte }

func (w *replyBuf) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

// ReadFrom reads a bulk string's bytes (go-redis copies each with
// io.CopyN) straight into the buffer's spare room.
func (w *replyBuf) ReadFrom(r io.Reader) (int64, error) {
	var n int64
	for {
		if len(w.b) == cap(w.b) {
			w.b = slices.Grow(w.b, 512)
		}
		m, err := r.Read(w.b[len(w.b):cap(w.b)])
		w.b, n = w.b[:len(w.b)+m], n+int64(m)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// replyHint sizes a raw read's buffer from the replies read with it
// before: the bytes per entry of the last one, with an eighth to spare,
// times the entries asked for (size) or likely to come (sizeLikeLast).
type replyHint struct {
	perEntry atomic.Int64
	entries  atomic.Int64 // how many entries the last reply that held any held
}

// size is the buffer for a reply of up to count entries.
func (h *replyHint) size(count int64) int {
	count = min(max(count, 0), maxReplyHint) // no overflow below
	return int(min(h.perEntry.Load()*count*9/8, maxReplyHint))
}

// sizeLikeLast is the buffer for a read of up to count entries that will
// likely get about as many as the last reply held: twice those, at most
// count. A consumer that has caught up asks for a batch and gets an entry
// or a few; a buffer sized for the batch was some 23 KB of garbage per
// entry at a thousand entries a second, about seven collections a second.
// A larger reply grows its buffer as it comes. Log's XRANGE paging keeps
// size: its pages are full, and a short last page must not shrink the
// next slice's first one.
func (h *replyHint) sizeLikeLast(count int64) int {
	if last := h.entries.Load(); last > 0 {
		count = min(count, 2*last)
	}
	return h.size(count)
}

// learn takes a reply of size bytes holding entries entries.
func (h *replyHint) learn(size, entries int) {
	if entries > 0 {
		h.perEntry.Store(int64(size/entries + 1))
		h.entries.Store(int64(entries))
	}
}

// maxReplyHint bounds what a hint allocates ahead of a reply: a larger one
// grows as it comes.
const maxReplyHint = 64 << 20

// resp reads one RESP2 or RESP3 reply.
type resp struct {
	s   string
	at  int
	err error // a malformed header, once met
}

var errShortReply = errors.New("reply ends early")

// header reads the next value's type byte and its count: the elements of
// an array, set or push, the pairs of a map, the bytes of a bulk string;
// -1 for a null. Other types' text is in text.
func (r *resp) header() (kind byte, n int, text string, err error) {
	if r.at >= len(r.s) {
		return 0, 0, "", errShortReply
	}
	kind = r.s[r.at]
	switch kind {
	case '*', '%', '~', '>', '$', '=', '!':
		return kind, r.count(), "", r.err
	case '_':
		r.at += 3 // "_\r\n"
		if r.at > len(r.s) {
			return 0, 0, "", errShortReply
		}
		return kind, -1, "", nil
	}
	end := strings.Index(r.s[r.at:], "\r\n")
	if end < 1 {
		return 0, 0, "", errShortReply
	}
	text = r.s[r.at+1 : r.at+end]
	r.at += end + 2
	return kind, 0, text, nil
}

// count reads the decimal count of a header line (its type byte first)
// and the line's end: -1, or up to nine digits (a reply of a billion values
// is not one to read). A malformed line sets r.err.
func (r *resp) count() int {
	i, n, neg := r.at+1, 0, false
	if i < len(r.s) && r.s[i] == '-' {
		neg, i = true, i+1
	}
	digits := i
	for ; i < len(r.s) && r.s[i] >= '0' && r.s[i] <= '9' && i-digits < 9; i++ {
		n = n*10 + int(r.s[i]-'0')
	}
	if i == digits || i+1 >= len(r.s) || r.s[i] != '\r' || r.s[i+1] != '\n' || (neg && n != 1) {
		r.err = fmt.Errorf("reply header %q", r.s[r.at:min(i+2, len(r.s))])
		return 0
	}
	r.at = i + 2
	if neg {
		return -1
	}
	return n
}

// array reads an aggregate's header and returns how many values follow (a
// map's pairs count twice); -1 for a null.
func (r *resp) array() (int, error) {
	kind, n, _, err := r.header()
	switch {
	case err != nil:
		return 0, err
	case n > len(r.s)-r.at: // each value takes 3 bytes at least
		return 0, errShortReply
	case kind == '%' && n > 0:
		return 2 * n, nil
	case kind == '*' || kind == '%' || kind == '~' || kind == '_' || (kind == '$' && n == -1): // RESP2 nulls: *-1, $-1
		return n, nil
	}
	return 0, fmt.Errorf("reply has %q where an array belongs", kind)
}

// str reads a string value (bulk, verbatim, simple, or a number's text);
// ok is false for a null.
func (r *resp) str() (s string, ok bool, err error) {
	kind, n, text, err := r.header()
	if err != nil {
		return "", false, err
	}
	switch kind {
	case '$', '=':
		if n < 0 {
			return "", false, nil
		}
		if r.at+n+2 > len(r.s) {
			return "", false, errShortReply
		}
		s = r.s[r.at : r.at+n]
		r.at += n + 2
		if kind == '=' && len(s) >= 4 { // "txt:" or "mkd:"
			s = s[4:]
		}
		return s, true, nil
	case '_':
		return "", false, nil
	case '+', ':', ',', '(', '#':
		return text, true, nil
	}
	return "", false, fmt.Errorf("reply has %q where a string belongs", kind)
}

// entry reads one [id, [name, value, ...]] of a stream reply: the id and
// how many names and values follow (-1: the entry was deleted while
// pending, its fields are null).
func (r *resp) entry() (id string, pairs int, err error) {
	n, err := r.array()
	if err != nil || n != 2 {
		return "", 0, cmp.Or(err, fmt.Errorf("stream reply has an entry of %d values, not [id, fields]", n))
	}
	if id, _, err = r.str(); err != nil {
		return "", 0, err
	}
	if pairs, err = r.array(); err != nil {
		return "", 0, err
	}
	if pairs > 0 && pairs%2 != 0 {
		return "", 0, fmt.Errorf("entry %s: %d field names and values, not pairs", id, pairs)
	}
	return id, pairs, nil
}

// flat reads an XRANGE reply into entries whose pairs share one array.
func (r *resp) flat(key string) ([]FlatEntry, error) {
	n, err := r.array()
	if err != nil || n <= 0 {
		return nil, err
	}
	out := make([]FlatEntry, n)
	var all []string
	for i := range out {
		id, pairs, err := r.entry()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		sid, err := brand.ParseStreamID(id)
		if err != nil {
			return nil, fmt.Errorf("%s: server returned entry id %q: %w", key, id, err)
		}
		if all == nil { // room for as many pairs as the first entry has, for each
			all = make([]string, 0, min(max(pairs, 0)*n, len(r.s)-r.at))
		}
		start := len(all)
		for range max(pairs, 0) {
			s, _, err := r.str()
			if err != nil {
				return nil, fmt.Errorf("%s: entry %s: %w", key, id, err)
			}
			all = append(all, s)
		}
		out[i] = FlatEntry{StreamID: sid, Pairs: all[start:len(all):len(all)]}
	}
	return out, nil
}

// messages reads an XREADGROUP reply of one stream, RESP2 ([[key,
// entries]]) or RESP3 ({key: entries}); a null is no entries.
func (r *resp) messages() ([]message, error) {
	n, err := r.array()
	if err != nil || n <= 0 {
		return nil, err
	}
	if r.s[0] == '*' { // RESP2: the stream's [key, entries]
		if n, err = r.array(); err != nil || n != 2 {
			return nil, cmp.Or(err, fmt.Errorf("XREADGROUP reply has a stream of %d values, not [key, entries]", n))
		}
	}
	if _, _, err := r.str(); err != nil { // the key
		return nil, err
	}
	if n, err = r.array(); err != nil || n <= 0 {
		return nil, err
	}
	out := make([]message, n)
	for i := range out {
		id, pairs, err := r.entry()
		if err != nil {
			return nil, err
		}
		out[i].ID = id
		if pairs < 0 {
			continue // deleted while pending
		}
		f := make(Fields, pairs/2)
		for range pairs / 2 {
			k, _, err := r.str()
			if err != nil {
				return nil, err
			}
			v, _, err := r.str()
			if err != nil {
				return nil, err
			}
			f[k] = v
			out[i].bytes += len(k) + len(v)
		}
		out[i].Fields = f
	}
	return out, nil
}
