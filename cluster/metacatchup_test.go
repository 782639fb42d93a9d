package cluster_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestRestartedNodeServesNoStaleRouting restarts every node of a cluster
// whose meta snapshots predate an added shard (and a slot moved to it),
// with one node cut off from the others: raft restores that node's map
// from the snapshot and applies the log past it only once a meta leader
// tells it the commit index, which the cut-off node cannot hear. It must
// not serve the snapshot's routing table (a listing by it silently missed
// the added shard's queues) nor report ready: its Routing fails with
// Unavailable, saying why. Once it reaches the others, its table names the
// added shard and a listing through it finds the shard's queue.
func TestRestartedNodeServesNoStaleRouting(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	ctx := ctxT(t, 4*time.Minute)
	cl := dialCluster(ctx, t, c)
	for _, n := range c.Nodes {
		if err := cluster.SnapshotMeta(n.Server().Node); err != nil {
			t.Fatal(err)
		}
	}

	// After the snapshots: shard 3, and the slot of queue catchup/q on it.
	const queue = "catchup/q"
	added, err := cl.AddShards(ctx, 1)
	if err != nil || len(added) != 1 {
		t.Fatalf("add a shard: %v, %v", added, err)
	}
	to := added[0].Id
	rt, err := cl.Routing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slot := uint32(taskstorepb.SlotOf(taskstorepb.GroupOf(queue), len(rt.Slots)))
	var moves []*taskstorepb.SlotMove
	for {
		if moves, err = cl.MoveSlots(ctx, []uint32{slot}, to); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("move slot %d to shard %d: %v", slot, to, err)
		}
		time.Sleep(200 * time.Millisecond) // the new shard elects its leader
	}
	if err := cl.WaitMoves(ctx, moves, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Insert(ctx, queue, []byte("v")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "every node's map routes the slot to the added shard", func() bool {
		for _, n := range c.Nodes {
			if n.Server().Node.Map().Slots[slot] != to {
				return false
			}
		}
		return true
	})

	if err := c.StopAll(); err != nil {
		t.Fatal(err)
	}
	c.Isolate(0)
	for i := range c.Nodes {
		c.Restart(i)
	}
	n0 := c.Nodes[0].Server()
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	got, err := taskstorepb.NewAdminClient(c.Conn(0)).Routing(rctx, &taskstorepb.RoutingRequest{})
	cancel()
	if err == nil {
		t.Fatalf("the cut-off node served a routing table (slot %d on shard %d, shards %v) before catching up with the meta group", slot, got.Slots[slot], shardIDs(got))
	}
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "meta group") {
		t.Fatalf("routing on the cut-off node: %v, want Unavailable saying the meta group has not caught up", err)
	}
	t.Logf("the cut-off node answers: %v", err)
	if err := n0.Ready(); err == nil || !strings.Contains(err.Error(), "meta group") {
		t.Fatalf("the cut-off node is ready (%v) before catching up with the meta group", err)
	}

	c.Network().Heal()
	only, err := client.Dial(ctx, c.Nodes[0].Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer only.Close()
	for {
		rt, err := only.Routing(ctx)
		if err == nil {
			if rt.Slots[slot] != to || !slices.Contains(shardIDs(rt), to) {
				t.Fatalf("after catching up: slot %d on shard %d (want %d), shards %v", slot, rt.Slots[slot], to, shardIDs(rt))
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("routing after the heal: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		qs, err := only.Queues(ctx, &taskstorepb.QueuesRequest{Prefix: "catchup/"})
		if err == nil {
			if len(qs.Queues) != 1 || qs.Queues[0].Name != queue || qs.Queues[0].Shard != to {
				t.Fatalf("listing after the restart: %v, want %s on shard %d", qs.Queues, queue, to)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("listing after the heal: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func shardIDs(rt *taskstorepb.RoutingResponse) []uint32 {
	var ids []uint32
	for _, s := range rt.Shards {
		ids = append(ids, s.Id)
	}
	return ids
}
