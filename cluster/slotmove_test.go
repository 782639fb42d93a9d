package cluster_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// slotGroup returns a consistency group name (with prefix) whose slot is on
// shard from in the routing table, and that slot.
func slotGroup(t *testing.T, rt *taskstorepb.RoutingResponse, prefix string, from uint32, skip ...uint32) (string, uint32) {
	t.Helper()
	for i := 0; i < 100000; i++ {
		g := fmt.Sprintf("%s%d", prefix, i)
		s := uint32(taskstorepb.SlotOf(g, len(rt.Slots)))
		if rt.Slots[s] == from && !slices.Contains(skip, s) {
			return g, s
		}
	}
	t.Fatal("no group found")
	return "", 0
}

// shardTasks counts the tasks of a slot each replica of a shard holds.
func shardTasks(c *harness.Cluster, shard, slot uint32) map[string]int {
	out := map[string]int{}
	for _, n := range c.Nodes {
		if n.Server() == nil {
			continue
		}
		if s := n.Server().Node.Shard(shard); s != nil {
			out[n.ID] = s.Machine().SlotTasks(taskstorepb.DefaultSlots)[slot]
		}
	}
	return out
}

// A slot moves between shards while clients write to it and to another
// slot of the same shard: every acknowledged write is on the target once,
// the preloaded tasks (a claimed one among them, committed afterwards by
// its claimant at the target) moved, the source keeps none of them, and
// the replicas of both shards agree.
func TestSlotMoveUnderLoad(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	c.WaitFormat()
	ctx := ctxT(t, 3*time.Minute)
	cl, err := client.Dial(ctx, strings.Join(c.Endpoints(), ","), client.WithClaimant("mover-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rt, err := cl.Routing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const from, to = 1, 2
	g, slot := slotGroup(t, rt, "moving", from)
	other, _ := slotGroup(t, rt, "staying", from, slot)

	// Preload: 3,000 tasks in batches, one claimed, one keyed.
	for b := 0; b < 30; b++ {
		req := &taskstorepb.ModifyRequest{}
		for i := 0; i < 100; i++ {
			in := &taskstorepb.TaskInsert{Id: fmt.Sprintf("pre-%d-%d", b, i), Queue: g + "/pre", Value: []byte("payload")}
			if b == 0 && i == 0 {
				in.Key = "the-key"
			}
			req.Inserts = append(req.Inserts, in)
		}
		if _, err := cl.Modify(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	claimed, err := cl.Claim(ctx, &taskstorepb.ClaimRequest{Queues: []string{g + "/pre"}, Limit: 1, Lease: durationpb.New(time.Minute)})
	if err != nil || len(claimed.Tasks) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}

	// Writers: two on the moving slot, one on another slot of the source.
	var (
		stop  atomic.Bool
		wg    sync.WaitGroup
		mu    sync.Mutex
		acked = map[string][]string{}
		worst = map[string]time.Duration{}
		fails []error
	)
	write := func(group string, w int) {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			id := fmt.Sprintf("w%d-%d", w, i)
			start := time.Now()
			_, err := cl.Insert(ctx, group+"/live", []byte("x"), client.WithID(id))
			took := time.Since(start)
			mu.Lock()
			if err != nil {
				fails = append(fails, fmt.Errorf("insert %s into %s: %w", id, group, err))
			} else {
				acked[group] = append(acked[group], id)
				worst[group] = max(worst[group], took)
			}
			mu.Unlock()
		}
	}
	for w, group := range []string{g, g, other} {
		wg.Add(1)
		go write(group, w)
	}
	time.Sleep(300 * time.Millisecond)

	// A claim waiting on an empty queue of the moving slot: it must wait
	// on at the target and take the task inserted there after the move.
	waited := make(chan *taskstorepb.ClaimResponse, 1)
	waitErr := make(chan error, 1)
	go func() {
		res, err := cl.Claim(ctx, &taskstorepb.ClaimRequest{Queues: []string{g + "/idle"}, Limit: 1,
			Lease: durationpb.New(time.Minute), Wait: durationpb.New(time.Minute)})
		waited <- res
		waitErr <- err
	}()
	time.Sleep(200 * time.Millisecond)

	moves, err := cl.MoveSlots(ctx, []uint32{slot}, to)
	if err != nil {
		t.Fatal(err)
	}
	if len(moves) != 1 || moves[0].Slot != slot || moves[0].From != from || moves[0].To != to {
		t.Fatalf("moves recorded: %v", moves)
	}
	if err := cl.WaitMoves(ctx, moves, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // writes after the move, at the target
	if _, err := cl.Insert(ctx, g+"/idle", []byte("for the waiter"), client.WithID("awaited")); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-waited:
		if err := <-waitErr; err != nil || len(res.GetTasks()) != 1 || res.Tasks[0].Id != "awaited" {
			t.Fatalf("the claim waiting through the move got %v, %v; want the task inserted at the target", res, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the claim waiting through the move did not get the task inserted at the target")
	}
	stop.Store(true)
	wg.Wait()
	if len(fails) > 0 {
		t.Fatalf("%d writes failed, the first: %v", len(fails), fails[0])
	}
	t.Logf("acknowledged writes: %d to the moving slot (slowest %v), %d to the other slot (slowest %v)",
		len(acked[g]), worst[g].Round(time.Millisecond), len(acked[other]), worst[other].Round(time.Millisecond))

	rt, err = cl.Routing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rt.Slots[slot] != to {
		t.Fatalf("the routing table puts slot %d on shard %d, want %d", slot, rt.Slots[slot], to)
	}
	// Every acknowledged write is there once, at the target.
	for _, group := range []string{g, other} {
		var ids []string
		page := ""
		for {
			res, err := cl.Tasks(ctx, &taskstorepb.TasksRequest{Queue: group + "/live", Limit: 1000, PageToken: page})
			if err != nil {
				t.Fatal(err)
			}
			for _, tk := range res.Tasks {
				ids = append(ids, tk.Id)
			}
			if page = res.NextPageToken; page == "" {
				break
			}
		}
		slices.Sort(ids)
		want := slices.Clone(acked[group])
		slices.Sort(want)
		if !slices.Equal(ids, want) {
			t.Fatalf("%s/live holds %d tasks, %d were acknowledged", group, len(ids), len(want))
		}
	}
	// The preload moved, its key still taken, and the claimant commits the
	// task it claimed before the move.
	if _, err := cl.Insert(ctx, g+"/pre", nil, client.WithKey("the-key")); err == nil {
		t.Fatal("the moved key was free at the target")
	}
	if err := cl.Delete(ctx, claimed.Tasks[0].Id, claimed.Tasks[0].Version, client.InQueue(g+"/pre")); err != nil {
		t.Fatalf("the claimant's commit at the target: %v", err)
	}
	// Replicas: the source holds nothing of the slot, the target all of it.
	want := 3000 - 1 + len(acked[g]) + 1 // the preload less the committed task, the writes, the awaited task
	deadline := time.Now().Add(30 * time.Second)
	for {
		src, dst := shardTasks(c, from, slot), shardTasks(c, to, slot)
		ok := len(src) == 3 && len(dst) == 3
		for _, n := range src {
			ok = ok && n == 0
		}
		for _, n := range dst {
			ok = ok && n == want
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas hold %v of the slot on the source and %v on the target; want 0 and %d", src, dst, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	st, err := cl.Status(ctx, &taskstorepb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Moves) != 0 {
		t.Fatalf("moves still listed: %v", st.Moves)
	}
	c.CheckReplicas()
	for _, n := range c.Nodes {
		for _, id := range []uint32{from, to} {
			if n.Server().Node.Diverged(id) != nil {
				t.Fatalf("%s: shard %d diverged", n.ID, id)
			}
		}
	}
	leader := c.Leader(from)
	res := c.Nodes[leader].Server().Node.Shard(from).Machine().SlotStates()
	if len(res) != 1 || res[0].Slot != slot {
		t.Fatalf("source slot states %v, want slot %d gone", res, slot)
	}
}

// Shards are added, slots rebalanced onto them and a shard removed on a
// live cluster: every task stays, each shard serves its share of the slots
// (within one), the removed shard leaves the map and its replicas retire.
func TestShardsAddRebalanceRemove(t *testing.T) {
	skipShort(t)
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	c.WaitFormat()
	// A hang guard, not a speed goal: at load 14+ the 512 slot moves
	// alone took two minutes and the test ran past four.
	ctx := ctxT(t, 10*time.Minute)
	cl := dialCluster(ctx, t, c)
	// Tasks in 200 groups, spread over many slots.
	want := map[string]bool{}
	for g := 0; g < 200; g++ {
		q := fmt.Sprintf("grp%d/q", g)
		req := &taskstorepb.ModifyRequest{}
		for i := 0; i < 5; i++ {
			id := fmt.Sprintf("t%d", i)
			req.Inserts = append(req.Inserts, &taskstorepb.TaskInsert{Id: id, Queue: q})
			want[q+" "+id] = true
		}
		if _, err := cl.Modify(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	added, err := cl.AddShards(ctx, 2)
	if err != nil || len(added) != 2 || added[0].Id != 3 || added[1].Id != 4 {
		t.Fatalf("add shards: %v, %v", added, err)
	}
	moves, err := cl.RebalanceSlots(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(moves) < 500 || len(moves) > 515 {
		t.Fatalf("rebalancing 2 shards to 4 recorded %d moves, want about 512", len(moves))
	}
	start := time.Now()
	if err := cl.WaitMoves(ctx, moves, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d slot moves in %v", len(moves), time.Since(start).Round(time.Millisecond))
	counts := func() map[uint32]int {
		rt, err := cl.Routing(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[uint32]int{}
		for _, s := range rt.Slots {
			out[s]++
		}
		return out
	}
	if got := counts(); len(got) != 4 || got[1] != 256 || got[2] != 256 || got[3] != 256 || got[4] != 256 {
		t.Fatalf("slots per shard after the rebalance: %v", got)
	}
	check := func(when string) {
		t.Helper()
		for key := range want {
			q, id, _ := strings.Cut(key, " ")
			if tk, err := cl.GetIn(ctx, q, id); err != nil || tk == nil {
				t.Fatalf("%s: task %s of %s: %v", when, id, q, err)
			}
		}
	}
	check("after the rebalance")

	moves, err = cl.RemoveShard(ctx, 1)
	if err != nil || len(moves) != 256 {
		t.Fatalf("remove shard 1: %d moves, %v", len(moves), err)
	}
	if err := cl.WaitMoves(ctx, moves, nil); err != nil {
		t.Fatal(err)
	}
	if got := counts(); len(got) != 3 || got[1] != 0 || got[2] < 341 || got[3] < 341 || got[4] < 341 {
		t.Fatalf("slots per shard after removing shard 1: %v", got)
	}
	check("after removing shard 1")
	// The shard leaves the map, and its replicas retire.
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := cl.Status(ctx, &taskstorepb.StatusRequest{})
		gone := err == nil
		for _, sh := range st.GetShards() {
			gone = gone && sh.Id != 1
		}
		for _, n := range c.Nodes {
			gone = gone && n.Server().Node.Shard(1) == nil
		}
		if gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shard 1 still in the map or running somewhere: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A node restarted with its bootstrap flags (--initial-cluster and
	// two shards) follows the map: it does not bootstrap the removed
	// shard 1 again from the flags.
	c.Stop(0)
	c.Restart(0)
	if c.Nodes[0].Server().Node.Shard(1) != nil {
		t.Fatal("n1 restarted with its bootstrap flags started a replica of the removed shard 1")
	}
	if _, err := os.Stat(filepath.Join(c.Nodes[0].Dir, "shards", "1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("n1 restarted with its bootstrap flags made shard 1's directory again: %v", err)
	}
	c.WaitReady()
	check("after a restart")

	// Shard 3 was added on the live cluster: n1 is one of its initial
	// replicas, which bootstrap its group. Once it is removed, a restart
	// of n1 replays maps that still list it, and must not bootstrap it.
	moves, err = cl.RemoveShard(ctx, 3)
	if err != nil {
		t.Fatalf("remove shard 3: %v", err)
	}
	if err := cl.WaitMoves(ctx, moves, nil); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		gone := true
		for _, n := range c.Nodes {
			gone = gone && n.Server().Node.Shard(3) == nil && len(n.Server().Node.Map().Shards) == 2
		}
		if gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("shard 3 still in the map or running somewhere")
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.Stop(0)
	c.Restart(0)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		sh := c.Nodes[0].Server().Node.Shard(3)
		if sh == nil {
			continue
		}
		if f := sh.Raft().GetConfiguration(); f.Error() == nil && len(f.Configuration().Servers) > 0 {
			t.Fatalf("n1 restarted bootstrapped the removed shard 3 again from a replayed map: %v", f.Configuration().Servers)
		}
	}
	c.WaitReady()
	check("after a second restart")
	// Removing the last serving shards one after another stops at the last.
	if _, err := cl.RemoveShard(ctx, 99); err == nil {
		t.Fatal("removing an unknown shard was accepted")
	}
	c.CheckReplicas()
}
