package stream

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// sendWindow is recordWindow written on the sender (groupWriter). The
// sender is made by the first call of a run and closed by release.
func (g *redisGroup) sendWindow(ctx context.Context, cancel func(), lo, hi string) (<-chan struct{}, <-chan error, bool) {
	g.senderMu.Lock()
	if g.sender == nil && !g.noSender {
		g.sender = newStartSender(g.rdb)
		g.noSender = g.sender == nil
	}
	s := g.sender
	g.senderMu.Unlock()
	if s == nil {
		return nil, nil, false
	}
	sent, reply := s.hset(ctx, cancel, g.windows, g.consumer, lo+" "+hi, func(err error) error {
		return fmt.Errorf("record first handler starts %s..%s in %s: %w", lo, hi, g.windows, err)
	})
	return sent, reply, true
}

func (g *redisGroup) release() {
	g.senderMu.Lock()
	defer g.senderMu.Unlock()
	if g.sender != nil {
		g.sender.close()
		g.sender = nil
	}
}

// startSender writes start records on a connection of its own and says
// when a record's bytes are written, before its reply is back: a handler
// may start then, one round trip sooner, and its start still counts if the
// worker is killed the next instant. What write() has handed to the kernel
// reaches Redis after the process is gone: the kernel sends a closed
// socket's unsent data before its FIN, and turns the close into a reset
// (dropping that data) only when received data was left unread, which a
// connection that reads each reply before its next record never leaves.
//
// It needs a *redis.Client, whose options make a second client with one
// connection; on other clients (a cluster's) records wait for their reply.
type startSender struct {
	rdb   *redis.Client
	mu    sync.Mutex // one record at a time: one connection, each reply read
	armed atomic.Pointer[pendingWrite]
}

// pendingWrite is the record being sent: sent is closed when a write to
// the connection held marker (the record's value, which no handshake
// command holds), or when the call ended without one.
type pendingWrite struct {
	marker []byte
	sent   chan struct{}
	once   sync.Once
}

func (p *pendingWrite) done() { p.once.Do(func() { close(p.sent) }) }

// newStartSender returns a sender on a connection of its own to the server
// c talks to, or nil when c is not a *redis.Client.
func newStartSender(c Client) *startSender {
	base, ok := c.(*redis.Client)
	if !ok {
		return nil
	}
	opt := *base.Options()
	opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns = 1, 0, 1
	s := &startSender{rdb: redis.NewClient(&opt)}
	s.rdb.AddHook(sentHook{s})
	return s
}

// hset sets field of key to value. sent is closed once the command is
// written, or once the call failed without writing it; reply then holds
// the outcome (an error passed through wrap), and is always sent before
// sent closes on a failure. ctx is released once the reply is in.
func (s *startSender) hset(ctx context.Context, cancel func(), key, field, value string, wrap func(error) error) (sent <-chan struct{}, reply <-chan error) {
	p := &pendingWrite{marker: []byte(value), sent: make(chan struct{})}
	out := make(chan error, 1)
	go func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if sentEarly {
			p.done()
			time.Sleep(100 * time.Millisecond)
		}
		s.armed.Store(p)
		err := s.rdb.HSet(ctx, key, field, value).Err()
		s.armed.Store(nil)
		cancel()
		if err != nil {
			err = wrap(err)
		}
		out <- err
		p.done()
	}()
	return p.sent, out
}

// close closes the sender's client once a record in flight is answered
// (its context bounds the wait): closed under it, go-redis would log the
// connection it hands back.
func (s *startSender) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rdb.Close()
}

// sentHook wraps the sender's connections so that their writes are seen.
type sentHook struct{ s *startSender }

func (h sentHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &sentConn{Conn: c, s: h.s}, nil
	}
}

func (sentHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (sentHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// sentConn closes the armed record's sent once a write holding it returns.
type sentConn struct {
	net.Conn
	s *startSender
}

func (c *sentConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if p := c.s.armed.Load(); p != nil && err == nil && bytes.Contains(b[:n], p.marker) {
		p.done()
	}
	return n, err
}
