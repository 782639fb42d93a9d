package cluster_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestMemoryBudgetRefusesInserts: with the state in memory and a memory
// limit, a shard's inserts are refused with ResourceExhausted once its
// tasks fill the leader's budget, naming the limit and what to do; every
// replica applied the same refusals (their states agree), claims and
// commits still work and make room, and status shows the fill.
func TestMemoryBudgetRefusesInserts(t *testing.T) {
	// 320 KiB: 40%, 128 KiB, for the tasks of the one shard, about 90
	// tasks of 1 KiB.
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale, StateStore: cluster.StateInMemory, MemoryLimit: 320 << 10})
	c.WaitReady()
	c.WaitFormat()
	queue := "budget/q"
	shard := c.ShardOf(queue)
	value := []byte(strings.Repeat("x", 1000))
	var inserted int
	var refusal error
	for i := 0; i < 100 && refusal == nil; i++ {
		ins := make([]*taskstorepb.TaskInsert, 10)
		for j := range ins {
			ins[j] = &taskstorepb.TaskInsert{Queue: queue, Value: value}
		}
		_, err := c.TaskStore(queue).Modify(ctxT(t, 10*time.Second), &taskstorepb.ModifyRequest{Inserts: ins})
		switch status.Code(err) {
		case codes.OK:
			inserted += len(ins)
		case codes.ResourceExhausted:
			refusal = err
		default:
			t.Fatalf("insert after %d tasks: %v", inserted, err)
		}
	}
	if refusal == nil {
		t.Fatalf("%d tasks of 1000 bytes inserted under a 128 KiB budget: nothing refused", inserted)
	}
	if inserted < 50 || inserted > 130 {
		t.Fatalf("refused after %d tasks of 1000 bytes, want about 100 under a 128 KiB budget", inserted)
	}
	for _, want := range []string{"memory budget reached", "128.0 KiB", "claim", "purge", "--state disk"} {
		if !strings.Contains(refusal.Error(), want) {
			t.Errorf("refusal %q does not say %q", refusal, want)
		}
	}
	waitDigestsAgree(t, c, shard)
	for _, n := range c.Nodes {
		if got := n.Server().Node.Shard(shard).Machine().TaskCount(); got != inserted {
			t.Fatalf("%s holds %d tasks, %d inserts acknowledged", n.ID, got, inserted)
		}
	}

	// Claims and commits work at the budget and make room.
	res := claim(t, c, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{queue}, Limit: 20})
	if len(res.Tasks) != 20 {
		t.Fatalf("claim at the budget: %v", res)
	}
	var refs []*taskstorepb.TaskRef
	for _, tk := range res.Tasks {
		refs = append(refs, &taskstorepb.TaskRef{Id: tk.Id, Version: tk.Version, Queue: queue})
	}
	if _, err := c.TaskStore(queue).Modify(ctxT(t, 10*time.Second), &taskstorepb.ModifyRequest{Claimant: "w", Deletes: refs}); err != nil {
		t.Fatalf("commit at the budget: %v", err)
	}
	insert(t, c, queue, "", "after the commit")

	st, err := taskstorepb.NewAdminClient(c.Conn(0)).Status(ctxT(t, 10*time.Second), &taskstorepb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Shards {
		if s.Id != shard {
			continue
		}
		for _, r := range s.ReplicaStatus {
			if r.MemoryBudget != 128<<10 || r.MemoryUsed == 0 || r.MemoryUsed > r.MemoryBudget {
				t.Errorf("%s: status says %d of a budget of %d bytes, want some of 131072", r.Node, r.MemoryUsed, r.MemoryBudget)
			}
		}
	}
}
