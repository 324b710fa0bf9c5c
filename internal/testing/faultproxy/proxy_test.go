package faultproxy

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echoServer answers each line with the same line.
func echoServer(t *testing.T) (string, chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan string, 100)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					got <- sc.Text()
					c.Write([]byte(sc.Text() + "\n"))
				}
			}()
		}
	}()
	return ln.Addr().String(), got
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func roundTrip(c net.Conn, line string, wait time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func TestProxy_Faults(t *testing.T) {
	addr, got := echoServer(t)
	p := newProxy(t, addr)
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if r, err := roundTrip(c, "a", time.Second); err != nil || r != "a\n" {
		t.Fatalf("forward: %q %v", r, err)
	}
	<-got

	// Dropped replies: the request lands, the answer does not come.
	p.DropReplies(true)
	if r, err := roundTrip(c, "b", 200*time.Millisecond); err == nil {
		t.Fatalf("reply %q came through DropReplies", r)
	}
	if landed := <-got; landed != "b" {
		t.Fatalf("server got %q, want b", landed)
	}
	if p.Stats().DroppedBytes.Load() == 0 {
		t.Fatal("no dropped bytes counted")
	}
	p.DropReplies(false)
	if _, err := roundTrip(c, "x", time.Second); err == nil {
		t.Fatal("a connection that lost a reply answered again")
	}

	// Cut closes the open connection; a new one works.
	c, err = net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if r, err := roundTrip(c, "y", time.Second); err != nil || r != "y\n" {
		t.Fatalf("a new connection after the drop: %q %v", r, err)
	}
	<-got
	if n := p.Cut(); n != 1 {
		t.Fatalf("Cut closed %d connections, want 1", n)
	}
	if _, err := roundTrip(c, "c", time.Second); err == nil {
		t.Fatal("a cut connection still answered")
	}
	c2, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()

	// Delay: the answer comes, late.
	p.SetDelay(150 * time.Millisecond)
	start := time.Now()
	if r, err := roundTrip(c2, "d", 2*time.Second); err != nil || r != "d\n" {
		t.Fatalf("delayed: %q %v", r, err)
	}
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Fatalf("round trip took %v with 150ms each way", took)
	}
}
