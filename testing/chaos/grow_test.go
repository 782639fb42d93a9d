package chaos_test

import (
	"context"
	"slices"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/testing/checker"
)

// growScenario takes the cluster from 2 shards to 6 and back to 3 while the
// workload runs (the resharding target): 4 shards added and every slot spread
// over the six (about 680 slot moves, the workload's among them), then the
// first three shards removed, their slots moved to the others. One kill -9
// of the meta leader, which drives the moves, lands in the middle of the
// rebalance. At the end the table must name the 3 remaining shards only,
// each serving its share of the slots, and no move may be under way.
var growScenario = scenario{
	name:   "grow",
	before: func(e *env) { e.c.WaitFormat() },
	faults: growFaults,
	floor:  floor(checker.Floor{checker.CountSlotMoves: 600, checker.CountFaults: 1}),
}

func init() { scenarios = append(scenarios, growScenario) }

func growFaults(e *env) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cl := e.dial(ctx)
	wait := func(what string, moves []*taskstorepb.SlotMove) {
		if err := cl.WaitMoves(ctx, moves, nil); err != nil {
			e.t.Fatalf("%s: %v", what, err)
		}
		e.h.Count(checker.CountSlotMoves, len(moves))
	}
	slotsPerShard := func() map[uint32]int {
		rt, err := cl.Routing(ctx)
		if err != nil {
			e.t.Fatalf("routing: %v", err)
		}
		out := map[uint32]int{}
		for _, s := range rt.Slots {
			out[s]++
		}
		return out
	}

	e.fault("add 4 shards and rebalance 2 -> 6")
	added, err := cl.AddShards(ctx, 4)
	if err != nil || len(added) != 4 {
		e.t.Fatalf("add shards: %v (%d added)", err, len(added))
	}
	moves, err := cl.RebalanceSlots(ctx, false)
	if err != nil {
		e.t.Fatalf("rebalance: %v", err)
	}
	// Kill the meta leader while the moves run; a new one resumes them.
	e.sleep(300 * time.Millisecond)
	if m := e.c.MetaLeader(); m >= 0 {
		e.fault("kill -9 %s, the meta leader, during the rebalance", e.c.Nodes[m].ID)
		e.c.Kill(m)
		e.sleep(3 * time.Second)
		e.c.Restart(m)
	}
	wait("rebalance to 6 shards", moves)
	if got := slotsPerShard(); len(got) != 6 {
		e.t.Fatalf("slots per shard after growing to 6: %v", got)
	}
	e.sleep(2 * time.Second)

	e.fault("remove shards 1, 2 and 3: 6 -> 3")
	var all []*taskstorepb.SlotMove
	for _, id := range []uint32{1, 2, 3} {
		moves, err := cl.RemoveShard(ctx, id)
		if err != nil {
			e.t.Fatalf("remove shard %d: %v", id, err)
		}
		all = append(all, moves...)
	}
	wait("removing 3 shards", all)
	// Slots that moved from shard 1 to 2 or 3 before those were retiring
	// move on in the background (the slot mover's chore once it is idle):
	// the shards are gone when the map no longer lists them.
	for {
		st, err := cl.Status(ctx, &taskstorepb.StatusRequest{})
		if err == nil && len(st.Moves) == 0 && !slices.ContainsFunc(st.Shards, func(s *taskstorepb.ShardStatus) bool { return s.Id <= 3 }) {
			break
		}
		if ctx.Err() != nil {
			e.t.Fatalf("shards 1-3 not removed: %v %v", err, slotsPerShard())
		}
		e.sleep(250 * time.Millisecond)
	}
	got := slotsPerShard()
	if len(got) != 3 || got[1]+got[2]+got[3] != 0 {
		e.t.Fatalf("slots per shard after shrinking to 3: %v", got)
	}
	for id, n := range got {
		if n < 1024/3-1 || n > 1024/3+1 {
			e.t.Fatalf("shard %d serves %d slots, want a third (%v)", id, n, got)
		}
	}
	st, err := cl.Status(ctx, &taskstorepb.StatusRequest{})
	if err != nil {
		e.t.Fatalf("status: %v", err)
	}
	if len(st.Moves) != 0 {
		e.t.Fatalf("moves still under way: %v", st.Moves)
	}
	e.t.Logf("slots per shard at the end: %v", got)
}
