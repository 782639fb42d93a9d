package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestRetentionDeletesOldTasks: a queue with a retention policy of 2s
// loses its tasks once they are that old, many more than one retention
// step visits (the leader's steps walk it), while another queue of the
// same group keeps its tasks; the policy reads back with its retain.
func TestRetentionDeletesOldTasks(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	c.WaitFormat()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ts := c.TaskStore("rt/done")
	const n = 3000 // about three steps of visits
	for i := 0; i < n; i += 500 {
		var ins []*taskstorepb.TaskInsert
		for j := i; j < i+500; j++ {
			ins = append(ins, &taskstorepb.TaskInsert{Queue: "rt/done", Value: []byte(fmt.Sprint(j)), Priority: int32(j % 3)})
		}
		ins = append(ins, &taskstorepb.TaskInsert{Queue: "rt/keep", Value: []byte(fmt.Sprint(i))})
		if _, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: ins}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ts.SetQueuePolicy(ctx, &taskstorepb.QueuePolicyRequest{Queue: "rt/done",
		Policy: &taskstorepb.QueuePolicy{Retain: durationpb.New(2 * time.Second)}}); err != nil {
		t.Fatal(err)
	}
	count := func(queue string) (uint64, *taskstorepb.QueuePolicy) {
		res, err := ts.Queues(ctx, &taskstorepb.QueuesRequest{Prefix: queue})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range res.Queues {
			if q.Name == queue {
				return q.Total, q.Policy
			}
		}
		return 0, nil
	}
	for {
		total, p := count("rt/done")
		if p.GetRetain().AsDuration() != 2*time.Second {
			t.Fatalf("rt/done lists policy %v, want its retain", p)
		}
		if total == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("rt/done still holds %d tasks", total)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if kept, _ := count("rt/keep"); kept != n/500 {
		t.Fatalf("rt/keep holds %d tasks, want %d", kept, n/500)
	}
}
