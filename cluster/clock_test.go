package cluster_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// After a leader whose clock ran an hour ahead, a leader with a right clock
// must not stamp one frozen time for the next hour: log time goes on at the
// monotonic rate from where the fast leader left it.
func TestLogTimeAdvancesAfterAFastLeader(t *testing.T) {
	// With clock checks off: they would keep the fast node from leading
	// (TestNodeWithAFarClockRefusesToLead); this is what happens when one
	// is missed, e.g. a clock that jumps between two checks.
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale, Tune: func(tu *cluster.Tuning) { tu.MaxClockOffset = 0 }})
	c.WaitReady()
	const q = "clock/q"
	shard := c.ShardOf(q)
	fast := c.Leader(shard)
	c.Stop(fast)
	c.SetClockOffset(fast, time.Hour)
	c.Restart(fast)
	c.WaitReady()
	for c.Leader(shard) != fast {
		if err := c.TransferLeader(shard, fast); err != nil {
			t.Logf("transfer to the fast node: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ahead := insert(t, c, q, "on-fast", "x")
	if d := time.Until(ahead.At.AsTime()); d < 50*time.Minute {
		t.Fatalf("the fast leader stamped %v, %v from now; want about an hour ahead", ahead.At.AsTime(), d)
	}
	slow := (fast + 1) % 3
	for c.Leader(shard) != slow {
		if err := c.TransferLeader(shard, slow); err != nil {
			t.Logf("transfer away: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	a := insert(t, c, q, "a", "x")
	time.Sleep(1500 * time.Millisecond)
	b := insert(t, c, q, "b", "x")
	gap := b.At.AsTime().Sub(a.At.AsTime())
	if gap < time.Second || gap > 5*time.Second {
		t.Fatalf("two inserts 1.5 s apart on the slow leader were stamped %v apart (%v, %v); want about 1.5 s", gap, a.At.AsTime(), b.At.AsTime())
	}
	if a.At.AsTime().Before(ahead.At.AsTime()) {
		t.Fatalf("log time went backwards: %v after %v", a.At.AsTime(), ahead.At.AsTime())
	}
}

// A node whose clock runs an hour ahead finds out from its peers and
// refuses to lead: no task is ever stamped with its time, writes go on
// through the others, and the others do not hand it leadership.
func TestNodeWithAFarClockRefusesToLead(t *testing.T) {
	skipShort(t)
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale, Tune: func(tu *cluster.Tuning) {
		tu.ClockCheckEvery = 200 * time.Millisecond
	}})
	c.WaitReady()
	const q = "skew/q"
	shard := c.ShardOf(q)
	fast := c.Leader(shard)
	c.Stop(fast)
	c.SetClockOffset(fast, time.Hour)
	c.Restart(fast)
	node := c.Nodes[fast].Server().Node
	for deadline := time.Now().Add(20 * time.Second); !node.ClockBad(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s runs an hour ahead and has not noticed", c.Nodes[fast].ID)
		}
	}
	for i := range c.Nodes {
		if i != fast && c.Nodes[i].Server().Node.ClockBad() {
			t.Fatalf("%s, with a right clock, counts itself off", c.Nodes[i].ID)
		}
	}
	// Try hard to make it lead, and write meanwhile.
	for i := 0; i < 10; i++ {
		_ = c.TransferLeader(shard, fast)
		task := insert(t, c, q, fmt.Sprint("t", i), "x")
		if d := time.Until(task.At.AsTime()); d > time.Minute {
			t.Fatalf("task %d stamped %v, %v ahead: the node with the far clock led a write", i, task.At.AsTime(), d)
		}
	}
}
