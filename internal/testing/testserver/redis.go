package testserver

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is one redis-server process owned by a test. Besides the
// default user (for the test's own clients), it has the user silt runs as
// (SiltACL), with Password.
type RedisServer struct {
	Addr     string // host:port on loopback
	Dir      string // data directory
	Args     []string
	Password string      // of SiltUser: a canary, never to be printed
	tls      *tls.Config // the clients' TLS settings, for a TLS server

	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// launch starts redis-server with args and watches for its exit.
func (s *RedisServer) launch(bin string, args ...string) error {
	s.cmd = exec.Command(bin, args...)
	s.cmd.SysProcAttr = childAttr()
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		cmd.Wait()
		close(exited)
	}(s.cmd, s.exited)
	return nil
}

// URL returns the URL silt connects with: user silt (SiltACL), database 0,
// rediss:// for a TLS server.
func (s *RedisServer) URL() string {
	if s.tls != nil {
		return userURL("rediss", s.Addr, s.Password)
	}
	return userURL("redis", s.Addr, s.Password)
}

// Client returns a client of the server, closed when the test ends.
func (s *RedisServer) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: s.tls})
	tb.Cleanup(func() { c.Close() })
	return c
}

// Redis starts a fresh redis-server for tb and stops it when tb ends. Extra
// arguments are passed to redis-server (for example "--appendonly", "yes").
// Each test gets its own server, so tests never see each other's keys.
func Redis(tb testing.TB, extra ...string) *RedisServer {
	tb.Helper()
	bin := redisBinary(tb)
	s := &RedisServer{Dir: tb.TempDir(), Password: newPassword()}
	s.Args = append([]string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.Dir, "--logfile", filepath.Join(s.Dir, "redis.log")}, userArgs(s.Password)...)
	s.Args = append(s.Args, extra...)
	var err error
	for range 5 { // a free port can be taken between choosing and binding it
		if err = s.start(bin); err == nil {
			tb.Cleanup(s.Stop)
			return s
		}
	}
	tb.Fatalf("start redis-server: %v", err)
	return nil
}

func redisBinary(tb testing.TB) string {
	tb.Helper()
	if bin := os.Getenv("SILT_REDIS_SERVER"); bin != "" {
		return bin
	}
	bin, err := exec.LookPath("redis-server")
	if err == nil {
		return bin
	}
	Absent(tb, "redis-server", "scripts/servers.sh install redis")
	return ""
}

// Absent fails tb because a server it needs is missing, naming the script that
// provides it; with -short it skips instead.
func Absent(tb testing.TB, what, script string) {
	tb.Helper()
	msg := fmt.Sprintf("%s is not available: run %s (or go test -short to skip tests that need it)", what, script)
	if testing.Short() {
		tb.Skip(msg)
	}
	tb.Fatal(msg)
}

func (s *RedisServer) start(bin string) error {
	port, err := FreePort()
	if err != nil {
		return err
	}
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := s.launch(bin, append([]string{"--port", strconv.Itoa(port)}, s.Args...)...); err != nil {
		return err
	}
	if err := s.waitReady(10 * time.Second); err != nil {
		s.Stop()
		return err
	}
	return nil
}

func (s *RedisServer) waitReady(limit time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		err := c.Ping(ctx).Err()
		if err == nil || strings.Contains(err.Error(), "NOAUTH") { // a server with a password is up too
			return nil
		}
		select {
		case <-ctx.Done():
			log, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
			return fmt.Errorf("redis-server on %s not ready: %v\n%s", s.Addr, err, log)
		case <-s.exited:
			log, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
			return fmt.Errorf("redis-server on %s exited at start:\n%s", s.Addr, log)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// startArgs starts the server with s.Args as they are and waits until its
// port accepts connections (TLS servers cannot answer a plain PING).
func (s *RedisServer) startArgs(bin string) error {
	if err := s.launch(bin, s.Args...); err != nil {
		return err
	}
	for range 200 {
		if c, err := net.Dial("tcp", s.Addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Stop()
	return fmt.Errorf("redis-server with TLS on %s did not listen", s.Addr)
}

// Stop kills the server and waits for it to exit. It is safe to call twice.
func (s *RedisServer) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart stops the server and starts it again on the same port and directory.
func (s *RedisServer) Restart(tb testing.TB) {
	tb.Helper()
	s.Stop()
	_, port, _ := net.SplitHostPort(s.Addr)
	if err := s.launch(redisBinary(tb), append([]string{"--port", port}, s.Args...)...); err != nil {
		tb.Fatalf("restart redis-server: %v", err)
	}
	if err := s.waitReady(10 * time.Second); err != nil {
		tb.Fatalf("restart redis-server: %v", err)
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Universal returns a client of the server as a redis.UniversalClient.
func (s *RedisServer) Universal(tb testing.TB) redis.UniversalClient { return s.Client(tb) }
