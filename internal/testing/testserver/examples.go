package testserver

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// RunWithRedis is the TestMain of a package whose runnable examples talk to
// Redis: it starts a redis-server without a password (an example reads as a
// program would, with a plain client of *addr), runs the package's tests
// and examples, and stops it. Without a redis-server the package fails, or
// with -short is skipped whole, as Absent does for one test.
func RunWithRedis(m *testing.M, addr *string) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	bin := os.Getenv("SILT_REDIS_SERVER")
	if bin == "" {
		bin, _ = exec.LookPath("redis-server")
	}
	if bin == "" {
		msg := "redis-server is not available: run scripts/servers.sh install redis (or go test -short to skip tests that need it)"
		if testing.Short() {
			fmt.Println("skipped: " + msg)
			return 0
		}
		fmt.Println(msg)
		return 1
	}
	dir, err := os.MkdirTemp("", "silt-examples-redis")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer os.RemoveAll(dir)
	s := &RedisServer{Dir: dir}
	s.Args = []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--logfile", dir + "/redis.log"}
	for range 5 { // a free port can be taken between choosing and binding it
		if err = s.start(bin); err == nil {
			break
		}
	}
	if err != nil {
		fmt.Println("start redis-server:", err)
		return 1
	}
	defer s.Stop()
	*addr = s.Addr
	return m.Run()
}
