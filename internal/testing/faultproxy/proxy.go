// Package faultproxy is a TCP proxy for fault tests: it forwards loopback
// connections to a target and, on command, cuts them, delays them, or drops
// the replies (the request reaches the server, the answer never comes back).
package faultproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards every connection accepted on Addr to Target. Its zero
// faults forward bytes as they come; Cut, SetDelay and DropReplies change
// that while connections are open. It is safe for concurrent use.
type Proxy struct {
	Addr   string // host:port the proxy listens on (127.0.0.1)
	Target string // host:port it forwards to

	ln    net.Listener
	delay atomic.Int64 // nanoseconds added before forwarding each chunk
	drop  atomic.Bool  // discard server-to-client bytes
	tear  atomic.Int64 // > 0: reply bytes still forwarded before a cut (CutReplyAfter)
	stats Stats

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	poisoned map[net.Conn]bool // server sides that lost a reply: they never answer again
	closed   bool
	wg       sync.WaitGroup
}

// Stats counts what the proxy did.
type Stats struct {
	Accepted     atomic.Int64 // connections accepted
	Cut          atomic.Int64 // connections closed by Cut
	DroppedBytes atomic.Int64 // reply bytes discarded by DropReplies
}

// Start listens on a free loopback port and forwards to target.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), Target: target, ln: ln, conns: map[net.Conn]struct{}{}, poisoned: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() *Stats { return &p.stats }

// SetDelay adds d before each forwarded chunk, both ways (0 removes it).
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// DropReplies, while on, forwards requests to the target but discards what
// the target answers, so clients wait for replies that never come. A
// connection that lost a reply never answers again (a byte stream cannot
// skip a reply and stay in step); turning DropReplies off resets those
// connections, as a peer would after its timeout.
func (p *Proxy) DropReplies(on bool) {
	p.drop.Store(on)
	if on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.poisoned {
		c.Close()
		delete(p.poisoned, c)
	}
}

func (p *Proxy) lostReply(server net.Conn) bool {
	if p.drop.Load() {
		p.mu.Lock()
		p.poisoned[server] = true
		p.mu.Unlock()
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.poisoned[server]
}

// Cut closes every open connection (both sides) at once; new ones are accepted.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
		n++
	}
	p.stats.Cut.Add(int64(n / 2))
	return n / 2
}

// CutReplyAfter forwards n more bytes of what the target answers, then
// cuts the connection they went on: a reply torn part way, as a server or
// network that fails mid-reply leaves it. It fires once.
func (p *Proxy) CutReplyAfter(n int64) { p.tear.Store(n) }

// torn returns how many of n reply bytes to forward, and whether the
// connection is cut after them.
func (p *Proxy) torn(n int) (int, bool) {
	for {
		left := p.tear.Load()
		if left <= 0 {
			return n, false
		}
		if int64(n) < left {
			if p.tear.CompareAndSwap(left, left-int64(n)) {
				return n, false
			}
			continue
		}
		if p.tear.CompareAndSwap(left, 0) {
			return int(left), true
		}
	}
}

// Close stops listening, cuts every connection and waits for the copiers.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.stats.Accepted.Add(1)
		server, err := net.DialTimeout("tcp", p.Target, 3*time.Second)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			client.Close()
			server.Close()
			return
		}
		p.wg.Add(2)
		go p.pipe(server, client, false)
		go p.pipe(client, server, true)
	}
}

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.poisoned, c)
	p.mu.Unlock()
	c.Close()
}

// pipe copies src to dst; reply says src is the server side.
func (p *Proxy) pipe(dst, src net.Conn, reply bool) {
	defer p.wg.Done()
	defer p.untrack(dst)
	defer p.untrack(src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := time.Duration(p.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			cut := false
			if reply {
				n, cut = p.torn(n)
			}
			if reply && p.lostReply(src) {
				p.stats.DroppedBytes.Add(int64(n))
			} else if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if cut {
				p.stats.Cut.Add(1)
				return
			}
		}
		if err != nil { // EOF or a cut: close both sides
			return
		}
	}
}
