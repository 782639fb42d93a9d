package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestRollingStoreSwitch moves a live cluster of three taskstored
// processes from --state memory to --state disk and back, one node at a
// time (stop, restart with the other flag, wait until it has caught up),
// while a writer inserts and a worker claims and commits. Every
// acknowledged insert must be there at the end, exactly once unless
// committed, each step must leave the replicas of every shard counting the
// same state (the memory budget's count, which both stores keep alike),
// and the writes must go on throughout.
func TestRollingStoreSwitch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	pc := harness.StartProcesses(t, 3, "--shards", "2", "--raft-timeout-scale", "2", "--state", "memory")
	pc.WaitReady(60 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cl := pc.Dial(ctx)

	const groups = 4
	queue := func(g int) string { return fmt.Sprintf("switch%d/q", g) }
	var (
		mu        sync.Mutex
		acked     = map[string]string{} // id -> queue
		committed = map[string]bool{}
		stop      = make(chan struct{})
		wg        sync.WaitGroup
	)
	wg.Add(2)
	go func() { // writer: client-chosen ids, so a retry is recognised
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id, q := fmt.Sprintf("task-%05d", i), queue(i%groups)
			cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := cl.Insert(cctx, q, []byte(id), client.WithID(id))
			ccancel()
			if err == nil {
				mu.Lock()
				acked[id] = q
				mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	go func() { // worker: claims and commits (deletes) some of them
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			res, err := cl.Claim(cctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{queue(i % groups)}, Limit: 2})
			if err == nil {
				for _, tk := range res.Tasks {
					if cl.Delete(cctx, tk.Id, tk.Version, client.InQueue(tk.Queue), client.AsClaimant("w")) == nil {
						mu.Lock()
						committed[tk.Id] = true
						mu.Unlock()
					}
				}
			}
			ccancel()
			time.Sleep(50 * time.Millisecond)
		}
	}()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}

	for _, store := range []string{"disk", "memory"} {
		for _, p := range pc.Nodes {
			before := count()
			p.Stop()
			setFlag(p, "--state", store)
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			pc.WaitReady(90 * time.Second)
			waitCaughtUp(t, ctx, cl, fmt.Sprintf("%s restarted with --state %s", p.ID, store))
			// Writes go on with the node back.
			for deadline := time.Now().Add(30 * time.Second); count() < before+20; time.Sleep(100 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("after %s restarted with --state %s: %d inserts acknowledged in 30 s", p.ID, store, count()-before)
				}
			}
			t.Logf("%s now on %s; %d inserts acknowledged", p.ID, store, count())
		}
	}
	close(stop)
	wg.Wait()
	waitReplicasAgree(t, ctx, cl, "the end")

	mu.Lock()
	defer mu.Unlock()
	var missing []string
	for id, q := range acked {
		if committed[id] {
			continue
		}
		if _, err := cl.GetIn(ctx, q, id); err != nil {
			missing = append(missing, fmt.Sprintf("%s (%v)", id, err))
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		t.Fatalf("%d acknowledged, uncommitted tasks missing after the switches: %v", len(missing), missing[:min(len(missing), 10)])
	}
	var total uint64
	for g := range groups {
		qs, err := cl.ListQueues(ctx, queue(g))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range qs {
			total += s.Total
		}
	}
	if want := uint64(len(acked) - len(committed)); total != want {
		t.Fatalf("%d tasks stored, want %d (%d acknowledged, %d committed)", total, want, len(acked), len(committed))
	}
	t.Logf("SUMMARY rolling-store-switch: acked=%d committed=%d stored=%d", len(acked), len(committed), total)
}

// waitCaughtUp waits until every replica of every shard has applied what
// its shard had committed when the wait began (writes go on meanwhile).
func waitCaughtUp(t *testing.T, ctx context.Context, cl *client.Client, when string) {
	t.Helper()
	target := map[uint32]uint64{}
	deadline := time.Now().Add(90 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		st, err := cl.Status(ctx, &taskstorepb.StatusRequest{})
		if err != nil {
			last = err.Error()
			time.Sleep(200 * time.Millisecond)
			continue
		}
		done := len(st.Shards) > 0
		for _, s := range st.Shards {
			if _, ok := target[s.Id]; !ok {
				for _, r := range s.ReplicaStatus {
					target[s.Id] = max(target[s.Id], r.CommitIndex)
				}
			}
			if len(s.ReplicaStatus) != 3 {
				done, last = false, fmt.Sprintf("shard %d: %d replicas answered", s.Id, len(s.ReplicaStatus))
				continue
			}
			for _, r := range s.ReplicaStatus {
				if r.AppliedIndex < target[s.Id] {
					done, last = false, fmt.Sprintf("shard %d: %s applied %d of %d", s.Id, r.Node, r.AppliedIndex, target[s.Id])
				}
			}
		}
		if done {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: replicas did not catch up: %s", when, last)
}

// setFlag sets a flag's value in p's arguments (for its next start).
func setFlag(p *harness.Process, flag, value string) {
	if i := slices.Index(p.Args, flag); i >= 0 && i+1 < len(p.Args) {
		p.Args[i+1] = value
		return
	}
	p.Args = append(p.Args, flag, value)
}

// waitReplicasAgree waits until every shard's replicas have applied the
// same index and count the same state there (ReplicaStatus.memory_used,
// the tasks' bytes plus an overhead each: the same on either store).
func waitReplicasAgree(t *testing.T, ctx context.Context, cl *client.Client, when string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		st, err := cl.Status(ctx, &taskstorepb.StatusRequest{})
		if err != nil {
			last = err.Error()
			time.Sleep(200 * time.Millisecond)
			continue
		}
		agree := len(st.Shards) > 0
		for _, s := range st.Shards {
			if len(s.ReplicaStatus) != 3 {
				agree, last = false, fmt.Sprintf("shard %d: %d replicas answered", s.Id, len(s.ReplicaStatus))
				break
			}
			r0 := s.ReplicaStatus[0]
			for _, r := range s.ReplicaStatus[1:] {
				if r.AppliedIndex != r0.AppliedIndex || r.MemoryUsed != r0.MemoryUsed {
					agree = false
					last = fmt.Sprintf("shard %d: %s applied %d counts %d, %s applied %d counts %d",
						s.Id, r0.Node, r0.AppliedIndex, r0.MemoryUsed, r.Node, r.AppliedIndex, r.MemoryUsed)
				}
			}
		}
		if agree {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: replicas do not agree: %s", when, last)
}
