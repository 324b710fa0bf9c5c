package testserver

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a local Redis Cluster of real redis-server processes.
type RedisCluster struct {
	Nodes []*RedisServer // masters first, then replicas
}

// URL returns the comma-separated redis:// URLs of every node, as --redis takes them.
func (c *RedisCluster) URL() string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = "redis://" + n.Addr
	}
	return strings.Join(urls, ",")
}

// Client returns a cluster client, closed when the test ends.
func (c *RedisCluster) Client(tb testing.TB) *redis.ClusterClient {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// Cluster starts 3 masters and 3 replicas on free loopback ports and joins
// them with redis-cli --cluster create. A failed node is noticed after 1 s.
func Cluster(tb testing.TB) *RedisCluster {
	tb.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		Absent(tb, "redis-cli", "scripts/servers.sh install redis")
	}
	c := &RedisCluster{}
	for range 6 {
		c.Nodes = append(c.Nodes, Redis(tb, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--appendonly", "yes",
			// A replica may take over however long it lost its master (tests kill masters on purpose).
			"--cluster-replica-validity-factor", "0"))
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes {
		args = append(args, n.Addr)
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitOK(tb)
	c.waitReplicas(tb)
	return c
}

// waitReplicas waits until every replica reports its link to its master up.
func (c *RedisCluster) waitReplicas(tb testing.TB) {
	tb.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for _, n := range c.Nodes {
		cl := redis.NewClient(&redis.Options{Addr: n.Addr})
		for {
			info := cl.Info(context.Background(), "replication").Val()
			if strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up") {
				break
			}
			if time.Now().After(deadline) {
				cl.Close()
				tb.Fatalf("replica %s not in sync within 60s", n.Addr)
			}
			time.Sleep(100 * time.Millisecond)
		}
		cl.Close()
	}
}

// WaitOK waits until every running node reports cluster_state:ok and the
// cluster client can write to every slot range.
func (c *RedisCluster) WaitOK(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		ok := true
		for _, n := range c.Nodes {
			if n.cmd == nil {
				continue
			}
			cl := redis.NewClient(&redis.Options{Addr: n.Addr})
			info, err := cl.ClusterInfo(ctx).Result()
			cl.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				ok = false
			}
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("cluster not ok within 60s")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Master returns the node that serves key now.
func (c *RedisCluster) Master(tb testing.TB, key string) *RedisServer {
	tb.Helper()
	cc := c.Client(tb)
	var addr string
	err := cc.ForEachMaster(context.Background(), func(ctx context.Context, n *redis.Client) error {
		slot := redis.NewIntCmd(ctx, "cluster", "keyslot", key)
		n.Process(ctx, slot)
		slots, err := n.ClusterSlots(ctx).Result()
		if err != nil {
			return err
		}
		for _, s := range slots {
			if int64(s.Start) <= slot.Val() && slot.Val() <= int64(s.End) && s.Nodes[0].Addr == n.Options().Addr {
				addr = n.Options().Addr
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	tb.Fatalf("no master for %s", key)
	return nil
}

// Universal returns a cluster client as a redis.UniversalClient.
func (c *RedisCluster) Universal(tb testing.TB) redis.UniversalClient { return c.Client(tb) }
