package cluster_test

import (
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/testing/harness"
)

// After a leader whose clock ran an hour ahead, a leader with a right clock
// must not stamp one frozen time for the next hour: log time goes on at the
// monotonic rate from where the fast leader left it (issue 19 item 4).
func TestLogTimeAdvancesAfterAFastLeader(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
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
