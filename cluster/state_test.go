package cluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestStateMovesBetweenMemoryAndDisk: a data directory written with the
// state in memory (every earlier version) starts with it on disk, where
// raft's snapshot and log fill the engine, and back, where raft's latest
// snapshot is a marker and the state comes from the engine; nothing
// written is lost either way, and the replicas agree. After restarts on
// disk, the engine holds the state already: its replay skips what it
// holds.
func TestStateMovesBetweenMemoryAndDisk(t *testing.T) {
	skipShort(t)
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale, StateStore: cluster.StateInMemory})
	c.WaitReady()
	queue := "move/q"
	shard := c.ShardOf(queue)
	for i := range 60 {
		insert(t, c, queue, fmt.Sprintf("t%02d", i), fmt.Sprint("v", i))
		if i == 30 {
			// Half before a snapshot, half in the log after it. Every
			// replica first applies what was written: a follower that has
			// not would have nothing new to snapshot.
			waitDigestsAgree(t, c, shard)
			for _, n := range c.Nodes {
				if err := n.Server().Node.Shard(shard).Raft().Snapshot().Error(); err != nil {
					t.Fatalf("snapshot on %s: %v", n.ID, err)
				}
			}
		}
	}
	restartAll := func(store string) {
		t.Helper()
		for i := range c.Nodes {
			c.Stop(i)
		}
		for i := range c.Nodes {
			c.SetStateStore(i, store)
			c.Restart(i)
		}
		c.WaitReady()
		waitDigestsAgree(t, c, shard)
	}
	check := func(when string, want int) {
		t.Helper()
		for _, n := range c.Nodes {
			if got := n.Server().Node.Shard(shard).Machine().TaskCount(); got != want {
				t.Fatalf("%s: %s holds %d tasks, want %d", when, n.ID, got, want)
			}
		}
		for _, id := range []string{"t00", "t45", "t59"} {
			if got := get(t, c, queue, id); got == nil || string(got.Value) != fmt.Sprint("v", atoi(id[1:])) {
				t.Fatalf("%s: task %s is %v", when, id, got)
			}
		}
	}
	restartAll(cluster.StateOnDisk)
	for _, n := range c.Nodes {
		if _, err := os.Stat(filepath.Join(n.Dir, "state")); err != nil {
			t.Fatalf("%s has no state engine after a start on disk: %v", n.ID, err)
		}
	}
	check("memory to disk", 60)
	res := claim(t, c, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{queue}})
	if len(res.Tasks) != 1 {
		t.Fatalf("claim on disk: %v", res)
	}
	insert(t, c, queue, "after", "v60")
	snapshotAll := func() {
		t.Helper()
		// A follower that has not applied the last insert would have
		// nothing new to snapshot after its restart's own.
		waitDigestsAgree(t, c, shard)
		for _, n := range c.Nodes {
			if err := n.Server().Node.Shard(shard).Raft().Snapshot().Error(); err != nil {
				t.Fatalf("snapshot on %s: %v", n.ID, err)
			}
		}
	}
	snapshotAll() // markers now: the engine is the snapshot
	for _, n := range c.Nodes {
		files, _ := filepath.Glob(filepath.Join(n.Dir, "shards", fmt.Sprint(shard), "snapshots", "*", "state.bin"))
		smallest := int64(-1)
		for _, f := range files {
			if fi, err := os.Stat(f); err == nil && (smallest < 0 || fi.Size() < smallest) {
				smallest = fi.Size()
			}
		}
		if smallest < 0 || smallest > 64 {
			t.Fatalf("%s: snapshots on disk %v, the smallest %d bytes: want a marker of a few bytes", n.ID, files, smallest)
		}
	}
	restartAll(cluster.StateOnDisk)
	check("disk to disk", 61)
	insert(t, c, queue, "later", "v61")
	snapshotAll()
	// In memory, raft's latest snapshot is a marker: the state comes out
	// of the engine the node kept.
	restartAll(cluster.StateInMemory)
	check("disk to memory", 62)
}

func atoi(s string) int {
	var n int
	fmt.Sscan(s, &n)
	return n
}

// TestRestartSkipsAReplicaRetiredBefore: a stop that cuts a retirement
// short leaves the replica's directory beside its retired mark. The
// restarted node does not start that replica from its directory (shard 7,
// gone from the map), and one the map places here again (shard 1, marked
// retired once) starts from the map.
func TestRestartSkipsAReplicaRetiredBefore(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	c.Stop(0)
	dir := c.Nodes[0].Dir
	if err := os.MkdirAll(filepath.Join(dir, "shards", "7"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"7", "1"} {
		if err := os.WriteFile(filepath.Join(dir, "shards", id+".retired"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.Restart(0)
	node := c.Nodes[0].Server().Node
	if node.Shard(7) != nil {
		t.Fatal("the restarted node started a replica of shard 7 from the directory a retirement left")
	}
	c.WaitReady()
	deadline := time.Now().Add(30 * time.Second)
	for node.Shard(1) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the map places shard 1 on the restarted node, which did not start it")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
