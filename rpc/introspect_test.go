package rpc

import (
	"fmt"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

func TestIntrospectionRatesAndClaimToCommit(t *testing.T) {
	now := time.Unix(1000, 0)
	in := newIntrospection(func() time.Time { return now })
	q := "work/q"

	var inserts []*taskstorepb.TaskInsert
	for i := 0; i < 30; i++ {
		inserts = append(inserts, &taskstorepb.TaskInsert{Queue: q})
	}
	in.modified(&taskstorepb.ModifyRequest{Inserts: inserts}, &fsmpb.ModifyResult{})
	in.claimed([]*taskstorepb.Task{{Id: "a", Version: 2, Queue: q}, {Id: "b", Version: 2, Queue: q}})
	now = now.Add(4 * time.Second)
	// A renewal: the claim time follows the renewed version.
	in.modified(&taskstorepb.ModifyRequest{Changes: []*taskstorepb.TaskChange{{Id: "a", Version: 2, Queue: q, KeepClaim: true}}},
		&fsmpb.ModifyResult{Changed: []*fsmpb.Task{{Id: "a", Version: 3}}})
	now = now.Add(2 * time.Second)
	in.modified(&taskstorepb.ModifyRequest{
		Changes: []*taskstorepb.TaskChange{{Id: "a", Version: 3, Queue: q}}, // 6 s after its claim
		Deletes: []*taskstorepb.TaskRef{
			{Id: "b", Version: 2},           // 6 s, queue taken from the claim
			{Id: "c", Version: 9, Queue: q}, // never seen claimed: counts, no latency
		},
	}, &fsmpb.ModifyResult{Changed: []*fsmpb.Task{{Id: "a", Version: 4}}})

	qs := &taskstorepb.QueueStats{Name: q}
	in.fill(qs)
	if qs.EnqueueRate != 0.5 || qs.ClaimRate != 2.0/60 || qs.CommitRate != 3.0/60 {
		t.Fatalf("rates %v %v %v, want 0.5, 2/60, 3/60", qs.EnqueueRate, qs.ClaimRate, qs.CommitRate)
	}
	if got := qs.AvgClaimToCommit.AsDuration(); got != 6*time.Second {
		t.Fatalf("avg claim to commit %v, want 6s", got)
	}
	if qs.RateWindow.AsDuration() != time.Minute {
		t.Fatalf("window %v", qs.RateWindow.AsDuration())
	}

	// A minute later the window has slid past everything.
	now = now.Add(61 * time.Second)
	qs = &taskstorepb.QueueStats{Name: q}
	in.fill(qs)
	if qs.EnqueueRate != 0 || qs.CommitRate != 0 || qs.AvgClaimToCommit != nil {
		t.Fatalf("after the window: %v", qs)
	}
	if len(in.claims) != 0 {
		t.Fatalf("committed claims still tracked: %v", in.claims)
	}
}

func TestIntrospectionBoundsQueues(t *testing.T) {
	in := newIntrospection(time.Now)
	for i := 0; i < maxTrackedQueues+10; i++ {
		in.modified(&taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: fmt.Sprintf("g/q%d", i)}}}, &fsmpb.ModifyResult{})
	}
	if len(in.queues) != maxTrackedQueues {
		t.Fatalf("tracking %d queues, cap is %d", len(in.queues), maxTrackedQueues)
	}
}
