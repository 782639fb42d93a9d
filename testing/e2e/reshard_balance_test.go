package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestGrowBalancesLeadersAndReplicas is the resharding's third target: after
// two nodes join a 3-node cluster of 3 shards, and 2 shards are added and
// the slots rebalanced, every node leads shards within one of every other
// node and holds replicas within one, and every shard serves its share of
// the slots. Real taskstored processes.
func TestGrowBalancesLeadersAndReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	pc := harness.StartProcesses(t, 3, "--shards", "3", "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl := pc.Dial(ctx)
	for _, id := range []string{"n4", "n5"} {
		pc.StartJoining(id)
		for {
			if _, err := cl.AddNode(ctx, id, ""); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("add %s: %v", id, ctx.Err())
			case <-time.After(300 * time.Millisecond):
			}
		}
	}
	if _, err := cl.AddShards(ctx, 2); err != nil {
		t.Fatal(err)
	}
	moves, err := cl.RebalanceSlots(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitMoves(ctx, moves, nil); err != nil {
		t.Fatal(err)
	}
	// Placement and leadership settle in the background.
	spread := func(m map[string]int, nodes []*taskstorepb.NodeStatus) (lo, hi int) {
		lo = 1 << 30
		for _, n := range nodes {
			lo, hi = min(lo, m[n.Id]), max(hi, m[n.Id])
		}
		return lo, hi
	}
	var why string
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		st, err := cl.Status(ctx, &taskstorepb.StatusRequest{})
		if err != nil {
			why = err.Error()
			continue
		}
		if ok, w := client.PlacementSettled(st); !ok {
			why = w
			continue
		}
		leads, holds := map[string]int{}, map[string]int{}
		var lines []string
		minSlots, maxSlots := uint32(1<<31), uint32(0)
		for _, s := range st.Shards {
			leads[s.Leader]++
			for _, r := range s.Replicas {
				holds[r]++
			}
			minSlots, maxSlots = min(minSlots, s.Slots), max(maxSlots, s.Slots)
			lines = append(lines, fmt.Sprintf("shard %d: %d slots, leader %s, replicas %v", s.Id, s.Slots, s.Leader, s.Replicas))
		}
		for _, n := range st.Nodes {
			lines = append(lines, fmt.Sprintf("%s: leads %d, holds %d", n.Id, leads[n.Id], holds[n.Id]))
		}
		ll, lh := spread(leads, st.Nodes)
		hl, hh := spread(holds, st.Nodes)
		why = strings.Join(lines, "; ")
		if len(st.Nodes) == 5 && len(st.Shards) == 5 && lh-ll <= 1 && hh-hl <= 1 && maxSlots-minSlots <= 1 {
			for _, l := range lines {
				t.Log(l)
			}
			return
		}
	}
	t.Fatalf("leaders, replicas or slots not within one of each other after 2 minutes: %s", why)
}
