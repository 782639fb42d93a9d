package cluster_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// With many claims waiting on a queue, one task must not
// cost one log entry per waiting claim.

func leaderShard(t *testing.T, c *harness.Cluster, queue string) *cluster.Shard {
	t.Helper()
	shard := c.ShardOf(queue)
	i := c.Leader(shard)
	if i < 0 {
		t.Fatalf("shard %d has no leader", shard)
	}
	return c.Nodes[i].Server().Node.Shard(shard)
}

type waitResult struct {
	i          int
	res        *taskstorepb.ClaimResponse
	err        error
	start, end time.Time
}

func claimantOf(i int) string { return fmt.Sprintf("w%03d", i) }

// parkWaiters starts n claims waiting up to wait on queue at the shard's
// leader s, and returns once every one has made its first (empty) try
// and the shard's log is quiet. With inOrder they arrive one after the
// other, claimant w000 first.
func parkWaiters(t *testing.T, ctx context.Context, ts taskstorepb.TaskStoreClient, s *cluster.Shard, queue string, n int, wait, lease time.Duration, inOrder bool) <-chan waitResult {
	t.Helper()
	out := make(chan waitResult, n)
	base := s.ProposedRequests() + s.EmptyClaims()
	for i := range n {
		go func() {
			start := time.Now()
			res, err := ts.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: claimantOf(i), Queues: []string{queue},
				Wait: durationpb.New(wait), Lease: durationpb.New(lease)})
			out <- waitResult{i, res, err, start, time.Now()}
		}()
		if inOrder { // registered in this order
			waitFor(t, func() bool { return s.Waiting() > i })
		}
	}
	// Each claim's first try answered (proposed, or found nothing).
	waitFor(t, func() bool { return s.ProposedRequests()+s.EmptyClaims() >= base+float64(n) })
	waitFor(t, func() bool { return s.Waiting() == n })
	// Quiet: nothing more is being committed.
	last := s.Raft().AppliedIndex()
	for {
		time.Sleep(300 * time.Millisecond)
		now := s.Raft().AppliedIndex()
		if now == last {
			return out
		}
		last = now
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(time.Millisecond)
	}
}

// settle waits until the shard's log has been quiet for a while and returns
// its applied index: Raft's, which counts every entry (the machine's skips
// an election's no-op and barrier).
func settle(s *cluster.Shard) uint64 {
	last := s.Raft().AppliedIndex()
	for {
		time.Sleep(400 * time.Millisecond)
		now := s.Raft().AppliedIndex()
		if now == last {
			return now
		}
		last = now
	}
}

func nextWinner(t *testing.T, results <-chan waitResult, timeout time.Duration) waitResult {
	t.Helper()
	select {
	case r := <-results:
		if r.err != nil || len(r.res.Tasks) != 1 {
			t.Fatalf("waiter %d: %v %v, want one task", r.i, r.res, r.err)
		}
		return r
	case <-time.After(timeout):
		t.Fatal("no waiting claim was answered")
	}
	return waitResult{}
}

// TestWaitersOneTaskWakesOneClaim parks 200 claims on one queue and checks
// that each task made available (an insert, a lease running out, a delayed
// insert coming due) costs a bounded number of log entries, not one per
// waiting claim, and goes to exactly one of them.
func TestWaitersOneTaskWakesOneClaim(t *testing.T) {
	const n = 200
	const lease = 4 * time.Second
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	queue := "park/q"
	ts := c.TaskStore(queue)
	s := leaderShard(t, c, queue)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := parkWaiters(t, ctx, ts, s, queue, n, time.Minute, lease, false)

	// An insert wakes one claim.
	idx0 := settle(s)
	insert(t, c, queue, "t1", "x")
	first := nextWinner(t, results, 20*time.Second)
	idx1 := settle(s)
	t.Logf("one insert with %d waiting claims: %d log entries", n, idx1-idx0)
	if idx1-idx0 > 3 {
		t.Errorf("one insert with %d waiting claims cost %d log entries, want <= 3 (insert + claim)", n, idx1-idx0)
	}
	if got := first.res.Tasks[0]; got.Id != "t1" || got.Claimant != claimantOf(first.i) || got.Claims != 1 {
		t.Fatalf("first claim: %v", got)
	}

	// Its lease runs out (no commit makes it available: the leader's timer
	// does): one other waiting claim takes it.
	second := nextWinner(t, results, 20*time.Second)
	idx2 := settle(s)
	t.Logf("a lease running out with %d waiting claims: %d log entries", n-1, idx2-idx1)
	if idx2-idx1 > 2 {
		t.Errorf("a lease running out cost %d log entries, want <= 2", idx2-idx1)
	}
	if got := second.res.Tasks[0]; got.Id != "t1" || got.Claims != 2 || second.i == first.i {
		t.Fatalf("after the lease: waiter %d got %v (first was %d)", second.i, got, first.i)
	}

	// A delayed insert wakes nobody until it is due, then one claim.
	_, err := ts.Modify(ctxT(t, 10*time.Second), &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{
		{Id: "t2", Queue: queue, Delay: durationpb.New(time.Second)}}})
	if err != nil {
		t.Fatal(err)
	}
	// On a slow machine t1's lease may run out again first: one more claim.
	reclaims := 0
	for {
		r := nextWinner(t, results, 20*time.Second)
		got := r.res.Tasks[0]
		if got.Id == "t2" && got.Claims == 1 {
			break
		}
		if got.Id != "t1" || reclaims > 2 {
			t.Fatalf("delayed insert: waiter %d got %v", r.i, got)
		}
		reclaims++
	}
	idx3 := settle(s)
	t.Logf("a delayed insert with %d waiting claims: %d log entries (%d lease ends besides)", n-2, idx3-idx2, reclaims)
	if bound := uint64(3 + 2*reclaims); idx3-idx2 > bound {
		t.Errorf("a delayed insert cost %d log entries, want <= %d", idx3-idx2, bound)
	}
	cancel()
}

// TestWaitersKInsertsWakeKClaims parks 50 claims in a known order, inserts
// 5 tasks (three alone, two in one transaction) and checks that the 5
// oldest claims get one task each, every task is claimed exactly once, the
// other 45 answer empty when their wait ends, and the log holds about two
// entries per task.
func TestWaitersKInsertsWakeKClaims(t *testing.T) {
	const n, k = 50, 5
	wait := 15 * time.Second
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	queue := "fifo/q"
	ts := c.TaskStore(queue)
	s := leaderShard(t, c, queue)
	results := parkWaiters(t, context.Background(), ts, s, queue, n, wait, time.Minute, true)
	parked := time.Now()

	idx0 := settle(s)
	for _, id := range []string{"k1", "k2", "k3"} {
		insert(t, c, queue, id, id)
	}
	if _, err := ts.Modify(ctxT(t, 10*time.Second), &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{
		{Id: "k4", Queue: queue}, {Id: "k5", Queue: queue}}}); err != nil {
		t.Fatal(err)
	}
	if time.Since(parked) > wait/2 {
		t.Fatalf("too slow to test: inserting took %v of the %v wait", time.Since(parked), wait)
	}

	var winners []int
	claimedBy := map[string]string{}
	for range n {
		var r waitResult
		select {
		case r = <-results:
		case <-time.After(wait + 30*time.Second):
			t.Fatal("waiting claims did not all answer")
		}
		if r.err != nil {
			t.Fatalf("waiter %d: %v", r.i, r.err)
		}
		switch len(r.res.Tasks) {
		case 0:
			if d := r.end.Sub(r.start); d < wait {
				t.Errorf("waiter %d answered empty after %v, before its %v wait ran out", r.i, d, wait)
			}
		case 1:
			task := r.res.Tasks[0]
			if prev, ok := claimedBy[task.Id]; ok {
				t.Errorf("task %s claimed by %s and %s", task.Id, prev, task.Claimant)
			}
			claimedBy[task.Id] = task.Claimant
			if task.Claimant != claimantOf(r.i) || task.Claims != 1 {
				t.Errorf("waiter %d got %v", r.i, task)
			}
			winners = append(winners, r.i)
		default:
			t.Errorf("waiter %d got %d tasks", r.i, len(r.res.Tasks))
		}
	}
	sort.Ints(winners)
	if fmt.Sprint(winners) != fmt.Sprint([]int{0, 1, 2, 3, 4}) {
		t.Errorf("winners %v, want the %d oldest claims [0 1 2 3 4]", winners, k)
	}
	if len(claimedBy) != k {
		t.Errorf("claimed %v, want all %d tasks", claimedBy, k)
	}
	for id, who := range claimedBy {
		if got := get(t, c, queue, id); got == nil || got.Claimant != who || got.Claims != 1 {
			t.Errorf("task %s: %v, want claimed once by %s", id, got, who)
		}
	}
	idx1 := settle(s)
	t.Logf("%d inserts (4 entries) with %d waiting claims: %d log entries", k, n, idx1-idx0)
	if idx1-idx0 > 4+k+3 {
		t.Errorf("%d tasks in 4 entries with %d waiting claims cost %d log entries, want <= %d", k, n, idx1-idx0, 4+k+3)
	}
}
