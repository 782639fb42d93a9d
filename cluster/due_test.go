package cluster_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestQueueCountsTurnWithoutAWrite inserts a delayed task and claims
// another with a short lease, then writes nothing: once the delay and the
// lease have run out, queue stats on the leader and on every replica (a
// stale read) count both as available. They used to keep showing one
// delayed and one claimed until an unrelated write reached the shard.
func TestQueueCountsTurnWithoutAWrite(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	const q = "due/q"
	ts := c.TaskStore(q)
	if _, err := ts.Modify(ctxT(t, 10*time.Second), &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{
		{Id: "later", Queue: q, Delay: durationpb.New(time.Second)},
		{Id: "now", Queue: q},
	}}); err != nil {
		t.Fatal(err)
	}
	res, err := ts.Claim(ctxT(t, 10*time.Second), &taskstorepb.ClaimRequest{Queues: []string{q}, Claimant: "w", Lease: durationpb.New(time.Second)})
	if err != nil || len(res.Tasks) != 1 {
		t.Fatalf("claim: %v %v", res, err)
	}
	stats := func(i int, stale bool) *taskstorepb.QueueStats {
		r, err := taskstorepb.NewTaskStoreClient(c.Conn(i)).Queues(ctxT(t, 10*time.Second), &taskstorepb.QueuesRequest{Prefix: q, Shard: c.ShardOf(q), Stale: stale})
		if err != nil || len(r.Queues) != 1 {
			t.Fatalf("node %d queues: %v %v", i, r, err)
		}
		return r.Queues[0]
	}
	if s := stats(c.Leader(c.ShardOf(q)), false); s.Available != 0 || s.Delayed != 1 || s.Claimed != 1 {
		t.Fatalf("at first: %v, want 1 delayed and 1 claimed", s)
	}
	time.Sleep(1500 * time.Millisecond) // no writes from here on
	deadline := time.Now().Add(3 * time.Second)
	for i := range c.Nodes {
		for {
			stale := i != c.Leader(c.ShardOf(q))
			s := stats(i, stale)
			if s.Available == 2 && s.Delayed == 0 && s.Claimed == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d (stale read %v), 1.5 s after the delay and the lease ended: %v, want 2 available", i, stale, s)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
