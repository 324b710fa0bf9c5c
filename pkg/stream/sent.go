package stream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// sendWindow is recordWindow written on the sender (startSender). The
// sender is made by the first call of a run and closed by release.
func (g *redisGroup) sendWindow(ctx context.Context, cancel func(), lo, hi string) (func() error, bool) {
	g.senderMu.Lock()
	if g.sender == nil && !g.noSender {
		g.sender = newStartSender(ctx, g.rdb)
		g.noSender = g.sender == nil
	}
	s := g.sender
	g.senderMu.Unlock()
	if s == nil {
		return nil, false
	}
	return s.hset(ctx, cancel, g.windows, g.consumer, lo+" "+hi, func(err error) error {
		return fmt.Errorf("record first handler starts %s..%s in %s: %w", lo, hi, g.windows, err)
	})
}

// startSender writes start records on a connection of its own, from the
// caller's goroutine, straight to the socket: a handler may start once
// write() has returned, one round trip sooner than waiting for the reply,
// and no goroutine stands between the read and the handler. Each reply is
// read when it is asked for, or before the next record is written; no
// goroutine wakes for it while the handlers run.
//
// What write() has handed to the kernel reaches Redis after the process
// is gone: the kernel sends a closed socket's unsent data before its FIN,
// and turns the close into a reset (dropping that data) only when received
// data was left unread, which never happens here to a record not yet
// delivered: a record is written only once the reply to the one before it
// has been read off the socket.
//
// The connection is an ownConn (go-redis dials it and runs its
// handshake); the sender writes each HSET and reads its reply itself. It
// needs a *redis.Client; on other clients (a cluster's) records wait for
// their reply.
type startSender struct {
	own *ownConn // the dialled connection, held until close
	nc  net.Conn // its socket, written and read by the sender alone

	mu      sync.Mutex
	br      *bufio.Reader
	buf     []byte
	waiting *sentRecord // written, its reply not read yet
	broken  error       // the connection failed: no more records on it
}

// sentRecord is a record written; its outcome once its reply is read.
type sentRecord struct {
	deadline time.Time // its write timeout, which bounds its reply
	err      error
	wrap     func(error) error
	cancel   func()
}

// lateRead is how long a reply asked for after its record's write timeout
// is waited for: Go refuses to read a socket past its deadline, even a
// reply that came in time and waits in the kernel's buffer.
const lateRead = 100 * time.Millisecond

// newStartSender returns a sender on a connection of its own to the server
// c talks to, or nil when c is not a *redis.Client or the connection
// cannot be made within ctx.
func newStartSender(ctx context.Context, c Client) *startSender {
	o, err := dialOwn(ctx, c)
	if err != nil {
		return nil
	}
	return &startSender{own: o, nc: o.nc, br: bufio.NewReaderSize(o.nc, 512)}
}

// hset writes HSET key field value and returns once it is written. reply
// reads the reply (at most once; its error passed through wrap) and then
// releases ctx through cancel. ok is false when the connection has failed:
// record the usual way.
func (s *startSender) hset(ctx context.Context, cancel func(), key, field, value string, wrap func(error) error) (reply func() error, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Never write with a reply unread (see startSender).
	s.readReply()
	if s.broken != nil {
		return nil, false
	}
	deadline, _ := ctx.Deadline()
	rec := &sentRecord{deadline: deadline, wrap: wrap, cancel: cancel}
	s.buf = appendCommand(s.buf[:0], "HSET", key, field, value)
	s.nc.SetDeadline(deadline) // bounds this write and the read of its reply
	if sentEarly {
		// Negative control: says the record is written before it is.
		go func() {
			time.Sleep(100 * time.Millisecond)
			s.mu.Lock()
			defer s.mu.Unlock()
			s.nc.Write(s.buf)
		}()
	} else if _, err := s.nc.Write(s.buf); err != nil {
		// The connection is given up; the caller records the usual way
		// (the same HSET again, should part of this one have arrived).
		s.fail(err)
		return nil, false
	}
	s.waiting = rec
	return func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.waiting == rec {
			s.readReply()
		}
		return rec.err
	}, true
}

// readReply reads the reply to the record waiting, if there is one: a
// single line (RESP2: an integer, or an error). Called with s.mu held.
func (s *startSender) readReply() {
	w := s.waiting
	if w == nil {
		return
	}
	if !w.deadline.IsZero() && time.Now().After(w.deadline) {
		// Asked for after its timeout (the handlers ran longer).
		s.nc.SetReadDeadline(time.Now().Add(lateRead))
	}
	line, err := s.br.ReadSlice('\n')
	if err != nil {
		s.fail(err)
		return
	}
	s.waiting = nil
	w.answer(replyError(line))
}

// replyError is the error a one-line RESP2 reply carries, nil for an
// integer or a status.
func replyError(line []byte) error {
	text := string(line[1 : len(line)-min(len(line)-1, 2)])
	switch line[0] {
	case ':', '+':
		return nil
	case '-':
		return serverError(text)
	}
	return fmt.Errorf("start record connection: unexpected reply %q", line)
}

// serverError is an error reply, a redis.Error as go-redis's own are.
type serverError string

func (e serverError) Error() string { return string(e) }
func (serverError) RedisError()     {}

func (r *sentRecord) answer(err error) {
	if err != nil {
		err = r.wrap(err)
	}
	r.err = err
	r.cancel()
}

// fail gives the connection up: the record waiting gets err. Called with
// s.mu held.
func (s *startSender) fail(err error) {
	if s.broken != nil {
		return
	}
	s.broken = err
	s.nc.Close()
	if w := s.waiting; w != nil {
		s.waiting = nil
		w.answer(err)
	}
}

// close reads a reply still due (its context bounds the wait) and closes
// the sender.
func (s *startSender) close() {
	s.mu.Lock()
	s.readReply()
	s.fail(errors.New("start sender closed"))
	s.mu.Unlock()
	s.own.close()
}
