package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestMeasureAddAndDrainWithManyTasks prints how long adding a node to a
// 3-node cluster holding TASKSTORE_MEASURE_TASKS tasks (default 1M) takes
// until placement settles, and how long draining it again takes. Measures,
// does not judge:
//
//	TASKSTORE_MEASURE=1 go test -run MeasureAddAndDrain -v -timeout 30m ./testing/e2e/
func TestMeasureAddAndDrainWithManyTasks(t *testing.T) {
	if os.Getenv("TASKSTORE_MEASURE") == "" {
		t.Skip("set TASKSTORE_MEASURE=1 to measure")
	}
	total := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("TASKSTORE_MEASURE_TASKS")); err == nil {
		total = v
	}
	pc := harness.StartProcesses(t, 3, "--shards", "4")
	pc.WaitReady(60 * time.Second)
	ctx := context.Background()
	cl := pc.Dial(ctx)

	// Load: batches of 1000 inserts (one transaction each), 4 writers.
	start := time.Now()
	const batch = 1000
	var g errgroup.Group
	g.SetLimit(4)
	for b := 0; b < total/batch; b++ {
		g.Go(func() error {
			req := &taskstorepb.ModifyRequest{}
			queue := fmt.Sprintf("load%d/q", b%16)
			for i := 0; i < batch; i++ {
				req.Inserts = append(req.Inserts, &taskstorepb.TaskInsert{Id: fmt.Sprintf("b%d-%d", b, i), Queue: queue, Value: []byte("0123456789abcdef")})
			}
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			_, err := cl.Modify(cctx, req)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("loaded %d tasks in %v (%.0f tasks/s)", total, time.Since(start), float64(total)/time.Since(start).Seconds())

	waitSettled := func(what string, done func(*taskstorepb.StatusResponse) bool) time.Duration {
		start := time.Now()
		for time.Since(start) < 20*time.Minute {
			st, err := cl.Status(ctx, &taskstorepb.StatusRequest{})
			if err == nil {
				if ok, _ := client.PlacementSettled(st); ok && done(st) {
					return time.Since(start)
				}
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Fatalf("%s did not settle", what)
		return 0
	}
	node := func(st *taskstorepb.StatusResponse, id string) *taskstorepb.NodeStatus {
		for _, n := range st.Nodes {
			if n.Id == id {
				return n
			}
		}
		return nil
	}
	pc.StartJoining("n4")
	for {
		if _, err := cl.AddNode(ctx, "n4", ""); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	took := waitSettled("add", func(st *taskstorepb.StatusResponse) bool {
		n := node(st, "n4")
		return n != nil && len(n.Shards) >= 3 // 12 replicas over 4 nodes
	})
	t.Logf("add n4 to a cluster holding %d tasks: placement settled in %v", total, took)
	if _, err := cl.RemoveNode(ctx, "n4", false); err != nil {
		t.Fatal(err)
	}
	took = waitSettled("drain", func(st *taskstorepb.StatusResponse) bool {
		n := node(st, "n4")
		return n == nil || (n.State == "removed" && len(n.Shards) == 0)
	})
	t.Logf("drain n4 from a cluster holding %d tasks: done in %v", total, took)
}
