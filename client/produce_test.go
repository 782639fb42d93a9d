package client_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestProducerAcrossGroupsAndLeaderLoss runs a Producer against a real
// three-node cluster with two shards: inserts into queues of both shards
// are in flight together, a refused transaction fails alone, and when one
// shard's leader is killed mid-stream every request is retried with its
// request id until another leader applies it: each value is in its queue
// exactly once afterwards, none lost, none doubled.
func TestProducerAcrossGroupsAndLeaderLoss(t *testing.T) {
	hc := harness.Start(t, 3, harness.Options{Shards: 2, Scale: 2})
	hc.WaitReady()
	var queues []string
	seen := map[uint32]bool{}
	for i := 0; len(queues) < 2; i++ {
		q := fmt.Sprintf("p%d/q", i)
		if s := hc.ShardOf(q); !seen[s] {
			seen[s] = true
			queues = append(queues, q)
		}
	}
	c := mustDial(t, strings.Join(hc.Endpoints(), ","))
	ctx := ctxFor(t, 90*time.Second)
	p := c.NewProducer(client.WithInflight(32))

	// One refused transaction among inserts: only it fails.
	refused := p.Modify(ctx, &taskstorepb.ModifyRequest{Deletes: []*taskstorepb.TaskRef{{Id: "missing", Version: 1, Queue: queues[0]}}})
	const n = 600
	var acked atomic.Int64
	pending := make([]*client.Pending, 0, n)
	killed := false
	victim := hc.Leader(hc.ShardOf(queues[0]))
	for i := range n {
		if !killed && acked.Load() >= n/4 {
			// Mid-stream: requests of both shards are in flight.
			hc.Kill(victim)
			killed = true
		}
		f := p.Insert(ctx, &taskstorepb.TaskInsert{Queue: queues[i%2], Value: fmt.Appendf(nil, "v%d", i)})
		go func() { <-f.Done(); acked.Add(1) }()
		pending = append(pending, f)
	}
	p.Wait()
	if !killed {
		t.Fatal("every insert was answered before the leader could be killed")
	}
	var dep *client.DependencyError
	if _, err := refused.Result(); !errors.As(err, &dep) {
		t.Fatalf("delete of a missing task: %v, want a DependencyError", err)
	}
	for i, f := range pending {
		task, err := f.Task()
		if err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
		if want := fmt.Sprintf("v%d", i); string(task.Value) != want || task.Queue != queues[i%2] {
			t.Fatalf("insert %d answered with %s in %s, want %s in %s", i, task.Value, task.Queue, want, queues[i%2])
		}
	}
	counts := map[string]int{}
	for _, q := range queues {
		req := &taskstorepb.TasksRequest{Queue: q, Limit: 1000}
		for {
			res, err := c.Tasks(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			for _, task := range res.Tasks {
				counts[string(task.Value)]++
			}
			if res.NextPageToken == "" {
				break
			}
			req.PageToken = res.NextPageToken
		}
	}
	for i := range n {
		if v := fmt.Sprintf("v%d", i); counts[v] != 1 {
			t.Errorf("%s is stored %d times, want once", v, counts[v])
		}
	}
	if len(counts) != n {
		t.Errorf("%d values stored, want %d", len(counts), n)
	}
}
