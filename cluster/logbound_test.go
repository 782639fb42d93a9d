package cluster_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// Raft trims logs by entry counts; with large values the retained log must
// still stay near Tuning.MaxLogBytes on every replica.
func TestRaftLogIsBoundedByBytes(t *testing.T) {
	skipShort(t)
	const bound = 512 << 10
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale, Tune: func(tu *cluster.Tuning) {
		tu.MaxLogBytes = bound
		tu.LogBoundEvery = 200 * time.Millisecond
	}})
	c.WaitReady()
	value := strings.Repeat("v", 16<<10)
	// 400 entries of 16 KiB: 6.4 MiB, far below the default 16,384-entry
	// snapshot threshold, twelve times the bound.
	for i := 0; i < 400; i++ {
		insert(t, c, "big/q", fmt.Sprintf("t%03d", i), value)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var sizes []int64
		over := false
		for i := range c.Nodes {
			for _, s := range c.Nodes[i].Server().Node.LocalShards() {
				b := s.LogBytes()
				sizes = append(sizes, b)
				over = over || b > 2*bound
			}
		}
		if !over && len(sizes) == 3 {
			t.Logf("retained log bytes per replica: %v (bound %d)", sizes, bound)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("retained log bytes per replica %v after 6.4 MiB written; want each under %d", sizes, 2*bound)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Nothing was lost to the snapshots.
	if got := get(t, c, "big/q", "t000"); got == nil {
		t.Fatal("the first task is gone")
	}
}

// The byte bound lowers raft's entry counts but keeps what someone else set
// with ReloadConfig: a shorter log (the chaos suite's snapshot scenario sets
// 32 and 64 so a lagging follower needs a snapshot) and the timeouts. It
// once put Tuning's counts back within seconds, and the follower caught up
// from the log instead.
func TestLogBoundKeepsAReloadedConfig(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale, Tune: func(tu *cluster.Tuning) {
		tu.LogBoundEvery = 2 * time.Second
		tu.MaxLogBytes = 256 << 10 // small enough that the bound moves the counts
	}})
	c.WaitReady()
	// Reloaded before the bound's first check (the soak's snapshot scenario
	// hit that order too), then entries of another size after it.
	shard := c.Shards()[0]
	var hb time.Duration
	if err := c.ReloadRaft(shard, func(rc *raft.ReloadableConfig) {
		rc.TrailingLogs, rc.SnapshotThreshold = 32, 64
		rc.HeartbeatTimeout += 7 * time.Millisecond
		rc.ElectionTimeout = max(rc.ElectionTimeout, rc.HeartbeatTimeout)
		hb = rc.HeartbeatTimeout
	}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		insert(t, c, "reload/q", fmt.Sprintf("t%02d", i), "x")
	}
	// Larger entries change the mean entry size, so the bound recomputes.
	for i := 20; i < 40; i++ {
		insert(t, c, "reload/q", fmt.Sprintf("t%02d", i), strings.Repeat("x", 2<<10))
	}
	time.Sleep(5 * time.Second) // two bound periods
	for i := range c.Nodes {
		rc, ok := c.RaftConfig(i, shard)
		if !ok {
			continue
		}
		if rc.TrailingLogs != 32 || rc.SnapshotThreshold != 64 || rc.HeartbeatTimeout != hb {
			t.Errorf("%s: trailing %d, threshold %d, heartbeat %v; want 32, 64, %v as reloaded",
				c.Nodes[i].ID, rc.TrailingLogs, rc.SnapshotThreshold, rc.HeartbeatTimeout, hb)
		}
	}
}
