package harness

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// ProduceLeaderLoss is the Produce leader-loss scenario shared by the
// client's and the proxy's tests: prod (a Producer of a client that reaches
// c directly or through a proxy) sends n inserts into queues of two shards
// and one refused transaction; once a quarter are answered the leader of
// the first queue's shard is killed mid-stream. Every request gets its own
// answer (the refused one a DependencyError, each insert its own task,
// retried with its request id across the leader change), and read back
// through direct every value is stored exactly once.
func ProduceLeaderLoss(ctx context.Context, t testing.TB, c *Cluster, prod *client.Producer, direct *client.Client, prefix string, n int) {
	t.Helper()
	var queues []string
	seen := map[uint32]bool{}
	for i := 0; len(queues) < 2; i++ {
		q := fmt.Sprintf("%s%d/q", prefix, i)
		if s := c.ShardOf(q); !seen[s] {
			seen[s] = true
			queues = append(queues, q)
		}
	}
	refused := prod.Modify(ctx, &taskstorepb.ModifyRequest{Deletes: []*taskstorepb.TaskRef{{Id: "missing", Version: 1, Queue: queues[1]}}})
	var acked atomic.Int64
	pending := make([]*client.Pending, 0, n)
	killed := false
	victim := c.Leader(c.ShardOf(queues[0]))
	for i := range n {
		if !killed && acked.Load() >= int64(n/4) {
			c.Kill(victim) // mid-stream: requests of both shards are in flight
			killed = true
		}
		f := prod.Insert(ctx, &taskstorepb.TaskInsert{Queue: queues[i%2], Value: fmt.Appendf(nil, "v%d", i)})
		go func() { <-f.Done(); acked.Add(1) }()
		pending = append(pending, f)
	}
	prod.Wait()
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
			res, err := direct.Tasks(ctx, req)
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
