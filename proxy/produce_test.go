package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// TestProducerThroughProxy: a Producer whose client knows only the proxy
// sends inserts into two shards' groups over the proxy's Produce stream,
// which relays each item over its own streams to the leaders. A refused
// transaction fails alone; when one leader is killed mid-stream the proxy
// retries its items with their request ids, and every value is stored
// exactly once.
func TestProducerThroughProxy(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	pc := dial(t, p.Addr(), client.WithProxyOnly())
	var queues []string
	seen := map[uint32]bool{}
	for i := 0; len(queues) < 2; i++ {
		q := fmt.Sprintf("pp%d/q", i)
		if s := c.ShardOf(q); !seen[s] {
			seen[s] = true
			queues = append(queues, q)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	prod := pc.NewProducer(client.WithInflight(32))
	refused := prod.Modify(ctx, &taskstorepb.ModifyRequest{Deletes: []*taskstorepb.TaskRef{{Id: "missing", Version: 1, Queue: queues[1]}}})
	const n = 400
	var acked atomic.Int64
	var pending []*client.Pending
	killed := false
	for i := range n {
		if !killed && acked.Load() >= n/4 {
			c.Kill(c.Leader(c.ShardOf(queues[0])))
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
		if task, err := f.Task(); err != nil || string(task.Value) != fmt.Sprintf("v%d", i) {
			t.Fatalf("insert %d: %v, %v", i, task, err)
		}
	}
	direct := dial(t, strings.Join(c.Endpoints(), ","))
	counts := map[string]int{}
	for _, q := range queues {
		for _, tk := range listAll(t, direct, q) {
			counts[string(tk.Value)]++
		}
	}
	for i := range n {
		if v := fmt.Sprintf("v%d", i); counts[v] != 1 {
			t.Errorf("%s is stored %d times, want once", v, counts[v])
		}
	}
}
