package stream

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// ownConn is a connection of silt's own to the server a *redis.Client
// talks to, for the commands whose replies silt reads from their bytes
// (resp.go): each reply is read off the socket straight into a buffer of
// the caller's, where go-redis copies every bulk string of it through a
// bufio.Reader and an io.LimitedReader of its own (one allocation a
// string, a quarter of a fold's reading in a profile).
//
// go-redis dials it and runs its handshake (TLS, AUTH, SELECT, CLIENT
// SETINFO) with a PING, in RESP2 and with no maintenance notifications:
// from then on nothing arrives on it but the replies to what silt writes.
// One goroutine uses it at a time. A connection that fails (the network, a
// deadline, a reply that does not parse) is closed and never used again:
// its caller goes the usual way, through go-redis, until its ownSlot dials
// another.
type ownConn struct {
	rdb  *redis.Client
	conn *redis.Conn // the dialled connection, held until close
	nc   net.Conn    // its socket
	opt  *redis.Options
	wbuf []byte
}

// dialOwn returns a connection of its own to the server c talks to, or an
// error when c is not a *redis.Client (a cluster's) or the connection
// cannot be made within ctx.
func dialOwn(ctx context.Context, c Client) (*ownConn, error) {
	base, ok := c.(*redis.Client)
	if !ok {
		return nil, fmt.Errorf("own connection: a %T, not a *redis.Client", c)
	}
	opt := *base.Options()
	opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns = 1, 0, 1
	opt.Protocol = 2
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	opt.ClientSideCache, opt.ClientSideCacheConfig = nil, nil
	o := &ownConn{rdb: redis.NewClient(&opt), opt: &opt}
	var dialled net.Conn
	o.rdb.AddHook(dialHook(func(nc net.Conn) { dialled = nc }))
	o.conn = o.rdb.EphemeralConn()
	if err := o.conn.Ping(ctx).Err(); err != nil || dialled == nil {
		o.conn.Close()
		o.rdb.Close()
		return nil, fmt.Errorf("own connection: %w", cmp.Or(err, errors.New("no connection dialled")))
	}
	o.nc = dialled
	return o, nil
}

// close closes the connection.
func (o *ownConn) close() {
	o.nc.Close()
	o.conn.Close()
	o.rdb.Close()
}

// ownSlot holds a connection of its own for one reader: dialled at first
// use; one that failed is closed, and the next is dialled no sooner than
// ownRedial after (until then the reader goes through go-redis), so a
// network blip costs a long reader its own connection for a moment, not
// for good, and a server that refuses connections is not dialled at
// every read.
type ownSlot struct {
	conn    *ownConn
	retryAt time.Time // the next dial; zero: at first use
}

// ownRedial is how long after a failure an ownSlot dials again.
var ownRedial = 5 * time.Second

// get returns the connection, dialling it when it is due; nil when there
// is none to be had now.
func (s *ownSlot) get(ctx context.Context, c Client) *ownConn {
	if s.conn == nil && !time.Now().Before(s.retryAt) {
		var err error
		if s.conn, err = dialOwn(ctx, c); err != nil {
			s.retryAt = time.Now().Add(ownRedial)
		}
	}
	return s.conn
}

// fail closes the connection after a failure.
func (s *ownSlot) fail() {
	s.drop()
	s.retryAt = time.Now().Add(ownRedial)
}

// drop closes the connection; the next get dials again.
func (s *ownSlot) drop() {
	if s.conn != nil {
		s.conn.close()
		s.conn = nil
	}
	s.retryAt = time.Time{}
}

// do writes cmds in one write and reads their replies, in order, each
// into a new buffer of its own: the last (a read's) of at least hint
// bytes. wait is how long the server may hold the last reply (a blocking
// read's BLOCK) beyond the connection's read timeout. A reply is its
// buffer's alone. Error replies come back as they are (the caller judges
// them); any other error leaves the connection unusable: close it.
func (o *ownConn) do(ctx context.Context, wait time.Duration, hint int, cmds ...[]string) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	deadline, ok := ctx.Deadline()
	if t := time.Now().Add(o.timeout() + max(wait, 0)); !ok || t.Before(deadline) {
		deadline = t
	}
	o.nc.SetDeadline(deadline)
	// A cancelled ctx ends a read under way at once.
	stop := context.AfterFunc(ctx, func() { o.nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	o.wbuf = o.wbuf[:0]
	for _, args := range cmds {
		o.wbuf = appendCommand(o.wbuf, args...)
	}
	if _, err := o.nc.Write(o.wbuf); err != nil {
		return nil, cmp.Or(ctx.Err(), err)
	}
	replies := make([][]byte, len(cmds))
	var surplus []byte // read past the reply before: the next one's start
	for i := range replies {
		size := 64
		if i == len(cmds)-1 {
			size = max(hint, minReplyBuf)
		}
		b, next, err := readWhole(o.nc, append(make([]byte, 0, max(size, len(surplus))), surplus...))
		if err != nil {
			return nil, cmp.Or(ctx.Err(), err)
		}
		replies[i], surplus = b, next
	}
	if len(surplus) > 0 { // nothing is ever due but the replies to cmds
		return nil, fmt.Errorf("own connection: %d bytes past the end of the last reply", len(surplus))
	}
	return replies, nil
}

// timeout bounds one command: go-redis's read timeout, its default when
// not set (a negative one is none).
func (o *ownConn) timeout() time.Duration {
	switch t := o.opt.ReadTimeout; {
	case t > 0:
		return t
	case t < 0:
		return 24 * time.Hour
	}
	return 3 * time.Second
}

// readWhole reads one whole RESP reply from r into b, after what b holds
// already, and returns it, and what it read past its end (the start of a
// pipeline's next reply), cut from b's spare room. It reads what the
// socket has, as much as b has room for, and frames the reply as it
// comes: elements tells how many values are still to come (an aggregate's
// header adds its elements), at is where the next one starts, so a read
// that ends part way through a value goes on from that value.
func readWhole(r io.Reader, b []byte) (reply, surplus []byte, err error) {
	at, elements := 0, 1
	for {
		for elements > 0 {
			next, more, ok, err := frame(b, at)
			if err != nil {
				return nil, nil, err
			}
			if !ok {
				break
			}
			at, elements = next, elements-1+more
		}
		if elements == 0 {
			return b[:at:at], b[at:], nil
		}
		if len(b) == cap(b) {
			b = slices.Grow(b, max(cap(b), 16<<10))
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil && n == 0 {
			return nil, nil, err
		}
	}
}

// frame reads the value that starts at b[at]: where the next begins and
// how many values its header announces (an aggregate's elements, twice a
// map's pairs). ok is false when b ends before the value does.
func frame(b []byte, at int) (next, more int, ok bool, err error) {
	eol := bytes.IndexByte(b[at:], '\n')
	if eol < 0 {
		return 0, 0, false, nil
	}
	line := b[at : at+eol+1]
	next = at + eol + 1
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return 0, 0, false, fmt.Errorf("own connection: malformed reply line %q", line)
	}
	kind, text := line[0], line[1:len(line)-2]
	switch kind {
	case '+', '-', ':', ',', '#', '_', '(':
		return next, 0, true, nil
	case '$', '!', '=', '*', '~', '>', '%':
		n, err := strconv.Atoi(string(text))
		if err != nil || n < -1 {
			return 0, 0, false, fmt.Errorf("own connection: malformed reply header %q", line)
		}
		switch {
		case n == -1: // a null
			return next, 0, true, nil
		case kind == '*' || kind == '~' || kind == '>':
			return next, n, true, nil
		case kind == '%':
			return next, 2 * n, true, nil
		}
		if len(b)-next < n+2 {
			return 0, 0, false, nil
		}
		if b[next+n] != '\r' || b[next+n+1] != '\n' {
			return 0, 0, false, fmt.Errorf("own connection: a string of %d bytes not ended by CRLF", n)
		}
		return next + n + 2, 0, true, nil
	}
	return 0, 0, false, fmt.Errorf("own connection: unknown reply type %q", kind)
}

// appendCommand appends args as a RESP array of bulk strings.
func appendCommand(b []byte, args ...string) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, '\r', '\n')
		b = append(b, a...)
		b = append(b, '\r', '\n')
	}
	return b
}

// dialHook hands each connection the client dials to seen.
type dialHook func(net.Conn)

func (h dialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err == nil {
			h(c)
		}
		return c, err
	}
}

func (dialHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
