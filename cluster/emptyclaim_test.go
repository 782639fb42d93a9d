package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestIdleClaimsWriteNoEntries: claims that find nothing (polls and
// waiting claims, on empty queues, a paused queue with a task and a queue
// at its concurrency limit) cost no log entry: 1,000 idle pollers over a
// few seconds leave the leader's log where it was, and a task inserted
// afterwards still goes promptly to a waiting claim.
func TestIdleClaimsWriteNoEntries(t *testing.T) {
	const pollers = 1000
	// Twice the usual timeout scale: 1,000 pollers and three nodes share
	// this process, and a leader starved of CPU for a second steps down
	// (an election writes an entry, which is not what is measured here).
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2 * raceScale})
	c.WaitReady()
	ctx := ctxT(t, 2*time.Minute)
	ts := c.TaskStore("idle/a")
	// A paused queue holding a task, a full queue holding one.
	insert(t, c, "idle/paused", "p1", "x")
	if _, err := ts.PauseQueue(ctx, &taskstorepb.QueuePauseRequest{Queue: "idle/paused"}); err != nil {
		t.Fatal(err)
	}
	insert(t, c, "idle/full", "f1", "x")
	insert(t, c, "idle/full", "f2", "x")
	if _, err := ts.SetQueueLimit(ctx, &taskstorepb.QueueLimitRequest{Queue: "idle/full", MaxClaimed: 1}); err != nil {
		t.Fatal(err)
	}
	if res := claim(t, c, &taskstorepb.ClaimRequest{Claimant: "holder", Queues: []string{"idle/full"}, Lease: durationpb.New(10 * time.Minute)}); len(res.Tasks) != 1 {
		t.Fatalf("claim of the full queue: %v", res)
	}
	queues := [][]string{{"idle/a"}, {"idle/b"}, {"idle/paused"}, {"idle/full"}, {"idle/a", "idle/b", "idle/paused", "idle/full"}}

	// The window is measured again (up to three times) when the shard
	// elected a leader during it: an election writes an entry of its own,
	// and a starved leader may step down on this two-core machine. An
	// error without an election fails the test.
	var s *cluster.Shard
	var applied0, last0 uint64
	var empty0 float64
	var calls, found atomic.Int64
	for attempt := 1; ; attempt++ {
		s = leaderShard(t, c, "idle/a")
		applied0, last0 = settle(s), s.Raft().LastIndex()
		empty0 = s.EmptyClaims()
		term0 := s.Raft().Stats()["term"]
		calls.Store(0)
		err := pollIdle(ctx, ts, pollers, queues, &calls, &found)
		if term := s.Raft().Stats()["term"]; term != term0 || s.Raft().State() != raft.Leader {
			if attempt == 3 {
				t.Fatalf("the shard elected a leader in each of 3 windows (term %s -> %s, last error %v)", term0, term, err)
			}
			t.Logf("the shard elected a leader during the window (term %s -> %s, error %v): measuring again", term0, term, err)
			c.WaitReady()
			continue
		}
		if err != nil {
			t.Fatalf("an idle claim failed: %v", err)
		}
		break
	}
	if found.Load() != 0 {
		t.Fatalf("idle claims found %d tasks", found.Load())
	}
	applied1, last1 := settle(s), s.Raft().LastIndex()
	t.Logf("%d idle pollers, %d claims in 4 s: applied index %d -> %d, last index %d -> %d, %v answered with no entry",
		pollers, calls.Load(), applied0, applied1, last0, last1, s.EmptyClaims()-empty0)
	if applied1 != applied0 || last1 != last0 {
		t.Errorf("%d empty claims moved the leader's log: applied %d -> %d, last %d -> %d, want unchanged",
			calls.Load(), applied0, applied1, last0, last1)
	}
	if got := s.EmptyClaims() - empty0; got < float64(calls.Load()) {
		t.Errorf("%v claims answered with no entry, want at least the %d claims", got, calls.Load())
	}

	// Waiting claims park without an entry, and an insert still wakes one.
	results := parkWaiters(t, ctx, ts, s, "idle/a", 100, time.Minute, time.Minute, false)
	if applied2 := settle(s); applied2 != applied1 {
		t.Errorf("parking 100 waiting claims moved the applied index %d -> %d", applied1, applied2)
	}
	insert(t, c, "idle/a", "t1", "x")
	if got := nextWinner(t, results, 20*time.Second).res.Tasks[0]; got.Id != "t1" {
		t.Fatalf("the waiting claim got %v, want t1", got)
	}
}

// pollIdle runs pollers claimants for 4 s: half poll without waiting (a
// pause of 200 ms between polls), half wait a second at a time; each
// with a request id, as the Go client sends. It returns the first error.
func pollIdle(ctx context.Context, ts taskstorepb.TaskStoreClient, pollers int, queues [][]string, calls, found *atomic.Int64) error {
	var firstErr atomic.Value
	stop := time.Now().Add(4 * time.Second)
	var wg sync.WaitGroup
	for i := range pollers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &taskstorepb.ClaimRequest{Claimant: fmt.Sprintf("idle%d", i), Queues: queues[i%len(queues)]}
			if i%2 == 1 {
				req.Wait = durationpb.New(time.Second)
			}
			for seq := uint64(1); time.Now().Before(stop); seq++ {
				req.Request = &taskstorepb.RequestID{ClientId: req.Claimant, Seq: seq}
				res, err := ts.Claim(ctx, req)
				calls.Add(1)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				found.Add(int64(len(res.Tasks)))
				if req.Wait == nil {
					time.Sleep(200 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	return nil
}

// TestEmptyClaimRetryGetsItsAnswer: a claim that took a task and whose
// answer was lost is retried with its request id when the queue is empty:
// the retry gets the recorded answer (the task), not a fresh empty one,
// with and without a wait; an older request id is refused as stale.
func TestEmptyClaimRetryGetsItsAnswer(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	ctx := ctxT(t, time.Minute)
	ts := c.TaskStore("retry/q")
	insert(t, c, "retry/q", "t1", "x")
	req := &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"retry/q"}, Request: &taskstorepb.RequestID{ClientId: "lost", Seq: 7}}
	first, err := ts.Claim(ctx, req)
	if err != nil || len(first.Tasks) != 1 {
		t.Fatalf("claim: %v %v", first, err)
	}
	for _, wait := range []*durationpb.Duration{nil, durationpb.New(time.Second)} {
		req.Wait = wait
		again, err := ts.Claim(ctx, req)
		if err != nil || len(again.Tasks) != 1 || again.Tasks[0].Id != "t1" || again.Tasks[0].Claims != 1 || again.Tasks[0].Version != first.Tasks[0].Version {
			t.Fatalf("retry (wait %v) of a claim that took t1: %v %v, want its answer", wait, again, err)
		}
	}
	req.Wait = nil
	req.Request.Seq = 6
	if res, err := ts.Claim(ctx, req); err == nil {
		t.Fatalf("an older request id: %v, want refused as stale", res)
	}
	// The session's next request finds nothing.
	req.Request.Seq = 8
	if res, err := ts.Claim(ctx, req); err != nil || len(res.Tasks) != 0 {
		t.Fatalf("next claim: %v %v, want empty", res, err)
	}
}

// TestDeposedLeaderNeverAnswersEmpty: a leader cut off from its peers must
// not answer a claim "nothing" from its state once another leader has
// made a task available: it fails (not the leader) or hands the task.
func TestDeposedLeaderNeverAnswersEmpty(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	shard := c.ShardOf("depose/q")
	old := c.Leader(shard)
	oldTS := taskstorepb.NewTaskStoreClient(c.Conn(old))
	c.Isolate(old)
	waitFor(t, func() bool {
		l := c.Leader(shard)
		return l >= 0 && l != old
	})
	insert(t, c, "depose/q", "t1", "x")
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		res, err := oldTS.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"depose/q"}})
		cancel()
		if err == nil && len(res.Tasks) == 0 {
			t.Fatal("the deposed leader answered a claim empty while t1 was available")
		}
		if err == nil {
			return // handed on to the new leader: it took t1
		}
	}
}
