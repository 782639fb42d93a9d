package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestClaimWorkloadsDrainExactlyOnce runs claim-delete and claim-move
// workers against an in-process cluster, with a commit that carries the
// next claim (the default) and with --two-calls: every prefilled task is
// committed exactly once, and in the default shape a plain Claim is made
// only when a worker holds nothing.
func TestClaimWorkloadsDrainExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: 2})
	c.WaitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := client.Dial(ctx, strings.Join(c.Endpoints(), ","), client.WithClaimant("bench-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, tc := range []struct {
		workload string
		limit    int
		twoCalls bool
	}{
		{"claim-delete", 1, false}, {"claim-delete", 3, false}, {"claim-delete", 1, true}, {"claim-move", 1, false}, {"claim-move", 2, true},
	} {
		name := fmt.Sprintf("%s limit %d two calls %v", tc.workload, tc.limit, tc.twoCalls)
		t.Run(name, func(t *testing.T) {
			const n, clients = 120, 4
			cfg := &config{workload: tc.workload, queues: 2, groups: 2, prefix: fmt.Sprintf("drain-%s-%d-%v", tc.workload, tc.limit, tc.twoCalls),
				batch: 100, claim: tc.limit, clients: clients, valueSize: 8, twoCalls: tc.twoCalls}
			lay := newLayout(cfg)
			value := make([]byte, cfg.valueSize)
			// claim-move: prefill the first stages only, so that a task
			// committed once sits in a "-next" queue.
			var first []string
			for _, q := range lay.queues {
				if !strings.HasSuffix(q, "-next") {
					first = append(first, q)
				}
			}
			if err := prefill(ctx, cfg, layout{queues: first}, n, clusterInsert(cl, value)); err != nil {
				t.Fatal(err)
			}
			var done atomic.Int64
			workers := make([]*worker, clients)
			var wg sync.WaitGroup
			for i := range workers {
				w := newWorker(i, cl, cfg, layout{queues: first, next: lay.next}, value)
				workers[i] = w
				wg.Go(func() {
					for k := 0; done.Load() < n && k < 20*n; k++ {
						before := w.tasks
						if err := w.op(ctx); err != nil {
							w.failed++
						}
						done.Add(w.tasks - before)
					}
				})
			}
			wg.Wait()
			var tasks, claims, commits int64
			for _, w := range workers {
				tasks += w.tasks
				if w.failed > 0 || len(w.errs) > 0 {
					t.Errorf("worker %d: %d failed ops, errors %v", w.id, w.failed, w.errs)
				}
				if len(w.held) > 0 {
					t.Errorf("worker %d still holds %d tasks after every task was committed", w.id, len(w.held))
				}
				for kind, h := range w.rpcs {
					if kind == "claim" {
						claims += int64(h.count())
					} else {
						commits += int64(h.count())
					}
				}
			}
			if tasks != n {
				t.Errorf("committed %d tasks, want %d", tasks, n)
			}
			// Each plain claim that found tasks starts a chain of commits
			// that ends only when its queue runs dry: with two queues and
			// four workers, a handful, not one per commit.
			if !tc.twoCalls && claims > 4*clients {
				t.Errorf("%d plain claims for %d commits: the commits do not carry the next claim", claims, commits)
			}
			if tc.twoCalls && claims < commits {
				t.Errorf("--two-calls: %d claims for %d commits, want a claim per commit", claims, commits)
			}
			for _, q := range first {
				ts, err := cl.Tasks(ctx, &taskstorepb.TasksRequest{Queue: q})
				if err != nil {
					t.Fatal(err)
				}
				if len(ts.Tasks) != 0 {
					t.Errorf("%s holds %d tasks after the drain, want 0", q, len(ts.Tasks))
				}
			}
		})
	}
}
