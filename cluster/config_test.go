package cluster_test

import (
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/cluster"
)

// TestConfigValidate: Start refuses what the taskstored flags refuse, so a
// program that builds a Config (a test harness, an embedding) cannot start
// a node with, say, an initial cluster naming one node twice or 5000
// shards; every problem is reported at once.
func TestConfigValidate(t *testing.T) {
	ok := cluster.Config{ID: "n1", DataDir: "/tmp/x", ListenAddr: "127.0.0.1:7101",
		InitialCluster: []cluster.Peer{{ID: "n1", Address: "127.0.0.1:7101"}, {ID: "n2", Address: "127.0.0.1:7102"}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a good config: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*cluster.Config)
		want   string
	}{
		{"no id", func(c *cluster.Config) { c.ID = "" }, "node id"},
		{"id with a newline", func(c *cluster.Config) { c.ID = "n\n1" }, "control characters"},
		{"no data dir", func(c *cluster.Config) { c.DataDir = "" }, "data directory"},
		{"listen without a port", func(c *cluster.Config) { c.ListenAddr = "localhost" }, "listen address"},
		{"a peer twice", func(c *cluster.Config) {
			c.InitialCluster = append(c.InitialCluster, cluster.Peer{ID: "n2", Address: "h:1"})
		}, "named twice"},
		{"a peer without an address", func(c *cluster.Config) { c.InitialCluster[1].Address = "" }, "has no address"},
		{"too many shards", func(c *cluster.Config) { c.Shards = 5000 }, "shards 5000"},
		{"negative replicas", func(c *cluster.Config) { c.Replicas = -1 }, "replicas -1"},
		{"negative clock offset", func(c *cluster.Config) { c.Tuning = cluster.DefaultTuning(); c.Tuning.MaxClockOffset = -time.Second }, "max clock offset"},
		{"lease over heartbeat", func(c *cluster.Config) {
			c.Tuning = cluster.DefaultTuning()
			c.Tuning.LeaderLeaseTimeout = 2 * c.Tuning.HeartbeatTimeout
		}, "leader lease timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			c.InitialCluster = append([]cluster.Peer(nil), ok.InitialCluster...)
			tc.change(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want it to mention %q", err, tc.want)
			}
			if c.DataDir != "" {
				c.DataDir = t.TempDir() // nothing is written: the configuration is refused first
			}
			if _, err := cluster.Start(c); err == nil || !strings.Contains(err.Error(), "invalid configuration") {
				t.Fatalf("Start = %v, want the configuration refused", err)
			}
		})
	}
	// Several problems are reported together.
	both := ok
	both.ID, both.Shards = "", 5000
	if err := both.Validate(); err == nil || !strings.Contains(err.Error(), "node id") || !strings.Contains(err.Error(), "shards 5000") {
		t.Fatalf("two problems: %v", err)
	}
}

// TestDefaultShardsOnePerNode: without --shards a cluster bootstraps one
// shard per initial node, so that each node leads one (docs/performance.md:
// fewer groups per node move more tasks); never none.
func TestDefaultShardsOnePerNode(t *testing.T) {
	for _, tc := range []struct{ nodes, want int }{{0, 1}, {1, 1}, {3, 3}, {5, 5}} {
		if got := cluster.DefaultShards(tc.nodes); got != tc.want {
			t.Errorf("DefaultShards(%d) = %d, want %d", tc.nodes, got, tc.want)
		}
	}
}
