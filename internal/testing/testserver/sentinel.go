package testserver

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinels is a replicated Redis watched by Redis Sentinel, on loopback:
// a master, its replicas and three sentinels (redis-server --sentinel,
// which is what Debian's redis-sentinel runs), quorum two, a master taken
// for down after DownAfter.
type Sentinels struct {
	Master    *RedisServer
	Replicas  []*RedisServer
	Sentinels []*RedisServer
	Name      string // the master's name: mymaster
}

// DownAfter is how long the sentinels wait for a silent master before they
// fail it over.
const DownAfter = 1 * time.Second

// WithSentinels starts a master, n replicas of it and three sentinels
// monitoring it, all stopped when tb ends.
func WithSentinels(tb testing.TB, replicas int) *Sentinels {
	tb.Helper()
	s := &Sentinels{Name: "mymaster"}
	s.Master = Redis(tb, "--repl-diskless-sync-delay", "0")
	_, mport, _ := net.SplitHostPort(s.Master.Addr)
	for range replicas {
		// Each replica may become the master: it syncs its own replicas fast too.
		r := Redis(tb, "--replicaof", "127.0.0.1", mport, "--repl-diskless-sync-delay", "0")
		// One password for user silt on every node: a promoted replica
		// takes the master's clients.
		if err := r.Client(tb).Do(context.Background(), "ACL", "SETUSER", SiltUser, "resetpass", ">"+s.Master.Password).Err(); err != nil {
			tb.Fatalf("replica %s: %v", r.Addr, err)
		}
		r.Password = s.Master.Password
		s.Replicas = append(s.Replicas, r)
	}
	bin := redisBinary(tb)
	for i := range 3 {
		dir := tb.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %s 2\nsentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s 10000\nsentinel parallel-syncs %s 1\n",
			s.Name, mport, s.Name, DownAfter.Milliseconds(), s.Name, s.Name)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			tb.Fatal(err)
		}
		sen := &RedisServer{Dir: dir}
		var err error
		for range 5 {
			port, perr := FreePort()
			if perr != nil {
				tb.Fatal(perr)
			}
			sen.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			sen.Args = []string{conf, "--sentinel", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
				"--logfile", filepath.Join(dir, "redis.log")}
			if err = sen.launch(bin, sen.Args...); err == nil {
				if err = sen.waitReady(10 * time.Second); err == nil {
					break
				}
				sen.Stop()
			}
		}
		if err != nil {
			tb.Fatalf("start sentinel %d: %v", i, err)
		}
		tb.Cleanup(sen.Stop)
		s.Sentinels = append(s.Sentinels, sen)
	}
	s.waitWatching(tb)
	return s
}

// waitWatching waits until every sentinel knows the master and its replicas.
func (s *Sentinels) waitWatching(tb testing.TB) {
	tb.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for _, sen := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr})
		for {
			m, err := c.Master(ctx, s.Name).Result()
			if err == nil && m["num-slaves"] == strconv.Itoa(len(s.Replicas)) && m["num-other-sentinels"] == strconv.Itoa(len(s.Sentinels)-1) {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				tb.Fatalf("sentinel %s does not see the master with %d replicas and %d other sentinels: %v %v", sen.Addr, len(s.Replicas), len(s.Sentinels)-1, m, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.Close()
	}
}

// URL is the failover URL silt connects with (go-redis's form): the first
// sentinel's address, the others as addr, the master's name, user silt and
// its password as parameters.
func (s *Sentinels) URL() string {
	q := url.Values{}
	q.Set("master_name", s.Name)
	for _, sen := range s.Sentinels[1:] {
		q.Add("addr", sen.Addr)
	}
	q.Set("username", SiltUser)
	q.Set("password", s.Master.Password)
	return "redis://" + s.Sentinels[0].Addr + "/0?" + q.Encode()
}

// MasterAddr asks a sentinel which address is the master now.
func (s *Sentinels) MasterAddr(tb testing.TB) string {
	tb.Helper()
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinels[0].Addr})
	defer c.Close()
	addr, err := c.GetMasterAddrByName(context.Background(), s.Name).Result()
	if err != nil {
		tb.Fatalf("sentinel: master of %s: %v", s.Name, err)
	}
	return net.JoinHostPort(addr[0], addr[1])
}

// Server returns the server (master or replica) listening on addr.
func (s *Sentinels) Server(addr string) *RedisServer {
	for _, r := range append([]*RedisServer{s.Master}, s.Replicas...) {
		if r.Addr == addr || strings.HasSuffix(r.Addr, ":"+portOf(addr)) {
			return r
		}
	}
	return nil
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// Universal returns a failover client of the master, closed when tb ends.
func (s *Sentinels) Universal(tb testing.TB) redis.UniversalClient {
	addrs := make([]string, len(s.Sentinels))
	for i, sen := range s.Sentinels {
		addrs[i] = sen.Addr
	}
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Name, SentinelAddrs: addrs})
	tb.Cleanup(func() { c.Close() })
	return c
}

// Signal sends sig to the server's process (SIGSTOP and SIGCONT freeze and
// resume it, as a stalled VM or a long fork would).
func (s *RedisServer) Signal(sig os.Signal) error {
	if s.cmd == nil || s.cmd.Process == nil {
		return fmt.Errorf("redis-server on %s is not running", s.Addr)
	}
	return s.cmd.Process.Signal(sig)
}
