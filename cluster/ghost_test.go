package cluster_test

import (
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// A removed shard stays gone when a node restarts from a meta snapshot
// taken while the shard was still in the map: the restored map places the
// shard on the node, but the node retired its replica under a later map,
// so it must not start the replica again (it would show as a leaderless
// shard in status until retired once more).
func TestRemovedShardStaysGoneAfterARestart(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	ctx := ctxT(t, 4*time.Minute)
	cl := dialCluster(ctx, t, c)
	added, err := cl.AddShards(ctx, 1)
	if err != nil || len(added) != 1 || added[0].Id != 3 {
		t.Fatalf("add a shard: %v, %v", added, err)
	}
	waitUntil(t, time.Minute, "every node runs shard 3", func() bool {
		for _, n := range c.Nodes {
			if n.Server().Node.Shard(3) == nil {
				return false
			}
		}
		return true
	})
	// The snapshot node 1 restarts from lists shard 3, placed on it.
	if err := cluster.SnapshotMeta(c.Nodes[0].Server().Node); err != nil {
		t.Fatal(err)
	}
	moves, err := cl.RemoveShard(ctx, 3)
	if err != nil {
		t.Fatalf("remove shard 3: %v", err)
	}
	if err := cl.WaitMoves(ctx, moves, nil); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 2*time.Minute, "shard 3 leaves every node's map", func() bool {
		for _, n := range c.Nodes {
			if len(n.Server().Node.Map().Shards) != 2 {
				return false
			}
		}
		return true
	})
	// A shard removed for good retires at once, not after the grace that
	// covers a replica moved away (10 election timeouts: 10 s here).
	left := time.Now()
	waitUntil(t, 2*time.Minute, "shard 3 retires everywhere", func() bool {
		for _, n := range c.Nodes {
			if n.Server().Node.Shard(3) != nil {
				return false
			}
		}
		return true
	})
	if d := time.Since(left); d > 5*time.Second {
		t.Errorf("the removed shard's replicas retired %v after it left the map, want well within the 10 s grace", d.Round(time.Millisecond))
	}
	removedAt := c.Nodes[0].Server().Node.Map().Epoch
	c.Stop(0)
	// Down for a while: the leaders back off from a follower they cannot
	// reach, so the restarted node runs on its restored map for a moment.
	time.Sleep(5 * time.Second)
	c.Restart(0)
	n := c.Nodes[0].Server().Node
	var caughtUp time.Time
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if n.Shard(3) != nil {
			t.Fatal("the restarted node started a replica of the removed shard 3 again")
		}
		// Until it catches up, the node's map may still list shard 3
		// (without a leader); it must not report a replica of it.
		for _, s := range n.Status(ctx, true).GetShards() {
			if s.Id == 3 && len(s.ReplicaStatus) > 0 {
				t.Fatalf("the restarted node reports a replica of the removed shard 3: %v", s)
			}
		}
		if caughtUp.IsZero() && n.Map().Epoch >= removedAt {
			caughtUp = time.Now()
		}
		if !caughtUp.IsZero() && time.Since(caughtUp) > 3*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the restarted node did not catch up with the map")
		}
	}
}

// waitUntil polls cond until it holds, failing the test after d.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", d, what)
		}
	}
}
