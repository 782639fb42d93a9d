package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestGrowShrinkAndForceRemoveUnderLoad runs real processes: 3 nodes under
// an insert load, add n4 and n5, check placement (RF 3, spread within one
// replica per node), remove n2 and n4, check again, then kill n5 for good and
// remove it with --force. Every acknowledged insert must be there at the end,
// and the load must never fail beyond the client's retries.
func TestGrowShrinkAndForceRemoveUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	pc := harness.StartProcesses(t, 3, "--shards", "4", "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cl := pc.Dial(ctx)

	var (
		mu     sync.Mutex
		acked  []string
		failed []string
		stop   = make(chan struct{})
		wg     sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("m%05d", i)
			cctx, ccancel := context.WithTimeout(ctx, time.Minute)
			_, err := cl.Insert(cctx, fmt.Sprintf("mem%d/q", i%8), []byte(id), client.WithID(id))
			ccancel()
			mu.Lock()
			if err == nil {
				acked = append(acked, id)
			} else {
				failed = append(failed, fmt.Sprintf("%s: %v", id, err))
			}
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()

	settle := func(what string, members []string) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Minute)
		for {
			st, err := cl.Status(ctx, &taskstorepb.StatusRequest{})
			if err == nil {
				ok, why := client.PlacementSettled(st)
				per := map[string]int{}
				for _, s := range st.Shards {
					if len(s.Replicas) != 3 {
						ok, why = false, fmt.Sprintf("shard %d has %v", s.Id, s.Replicas)
					}
					for _, r := range s.Replicas {
						per[r]++
					}
				}
				lo, hi := 1<<30, 0
				for _, m := range members {
					lo, hi = min(lo, per[m]), max(hi, per[m])
				}
				if ok && hi-lo <= 1 && lo > 0 {
					t.Logf("%s: settled, replicas per node %v", what, per)
					return
				}
				if why == "" {
					why = fmt.Sprintf("replicas per node %v", per)
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: not settled: %s", what, why)
				}
			}
			time.Sleep(500 * time.Millisecond)
		}
	}

	for _, id := range []string{"n4", "n5"} {
		pc.StartJoining(id, "--raft-timeout-scale", "2")
	}
	for _, id := range []string{"n4", "n5"} {
		deadline := time.Now().Add(time.Minute)
		for {
			_, err := cl.AddNode(ctx, id, "")
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("add %s: %v", id, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	start := time.Now()
	settle("grown to 5", []string{"n1", "n2", "n3", "n4", "n5"})
	t.Logf("adding two nodes settled in %v", time.Since(start))

	for _, id := range []string{"n2", "n4"} {
		start := time.Now()
		if _, err := cl.RemoveNode(ctx, id, false); err != nil {
			t.Fatalf("remove %s: %v", id, err)
		}
		deadline := time.Now().Add(3 * time.Minute)
		for {
			st, err := cl.Status(ctx, &taskstorepb.StatusRequest{})
			if err == nil {
				done := false
				for _, n := range st.Nodes {
					if n.Id == id && n.State == "removed" && len(n.Shards) == 0 {
						done = true
					}
				}
				if ok, _ := client.PlacementSettled(st); ok && done {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not drained", id)
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Logf("draining %s took %v", id, time.Since(start))
		// The removed process learns it was removed and exits by itself.
		if code, ok := pc.Node(id).WaitExit(time.Minute); !ok || code != 0 {
			t.Fatalf("removed %s: exited %v with code %d, want to exit 0 by itself", id, ok, code)
		}
	}
	settle("shrunk to 3", []string{"n1", "n3", "n5"})

	// n5 dies for good: remove it by force; its shards carry on with two.
	pc.Node("n5").Kill()
	if _, err := cl.RemoveNode(ctx, "n5", true); err != nil {
		t.Fatalf("force remove n5: %v", err)
	}
	time.Sleep(5 * time.Second)
	close(stop)
	wg.Wait()

	seen := map[string]bool{}
	for g := 0; g < 8; g++ {
		for _, task := range listAll(t, ctx, cl, fmt.Sprintf("mem%d/q", g)) {
			if seen[task.Id] {
				t.Fatalf("%s present twice", task.Id)
			}
			seen[task.Id] = true
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var missing []string
	for _, id := range acked {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d acknowledged inserts lost: %v", len(missing), missing)
	}
	if len(failed) > 0 {
		t.Fatalf("%d inserts failed beyond client retries, e.g. %v", len(failed), failed[0])
	}
	if len(acked) < 100 {
		t.Fatalf("only %d inserts: the load did not run", len(acked))
	}
	t.Logf("%d inserts acknowledged through growing, shrinking and a forced removal; none lost", len(acked))
}
