package client_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/client/clienttest"
)

// TestMoveQueue requeues a dead-letter queue in batches:
// every unclaimed task that matches moves, attempts reset, in transactions
// of at most Batch tasks; a task with a live lease and tasks the filter
// does not select stay; a move across groups or of claimed tasks is
// refused.
func TestMoveQueue(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	c := mustDial(t, fc.Addrs())
	ctx := ctxFor(t, 30*time.Second)
	const n = 1203
	var inserts []*taskstorepb.TaskInsert
	for i := range n {
		in := &taskstorepb.TaskInsert{Id: fmt.Sprintf("t%04d", i), Queue: "jobs/dead", Attempt: 5, Err: "timeout"}
		if i%100 == 0 {
			in.Err = "bad input" // not selected by the filter below
		}
		inserts = append(inserts, in)
	}
	for i := 0; i < n; i += 500 {
		if _, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: inserts[i:min(i+500, n)]}); err != nil {
			t.Fatal(err)
		}
	}
	// A worker holds one (the first in claim order).
	cl, err := c.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"jobs/dead"}, Lease: durationpb.New(time.Hour)})
	if err != nil || len(cl.Tasks) != 1 {
		t.Fatalf("claim: %v, %v", cl, err)
	}
	held := cl.Tasks[0].Id
	before := len(fc.CallsTo("Modify"))
	var progress []client.MoveResult
	res, err := c.MoveQueue(ctx, "jobs/dead", "jobs/work", client.MoveOptions{
		Filter:        &taskstorepb.TasksRequest{ErrContains: "timeout"},
		ResetAttempts: true, Batch: 400,
		Progress: func(r client.MoveResult) { progress = append(progress, r) },
	})
	if err != nil {
		t.Fatal(err)
	}
	selected := n - 13 // 13 ids are multiples of 100
	if held[len(held)-2:] != "00" {
		selected-- // the held one would have matched
	}
	if res.Moved != selected || res.Skipped != 0 {
		t.Errorf("moved %d, skipped %d; want %d, 0", res.Moved, res.Skipped, selected)
	}
	if len(progress) < 3 || progress[len(progress)-1].Moved != res.Moved {
		t.Errorf("progress %v, want a call per batch ending with %v", progress, res)
	}
	for _, call := range fc.CallsTo("Modify")[before:] {
		if k := len(call.Req.(*taskstorepb.ModifyRequest).Changes); k > 400 {
			t.Errorf("a transaction moved %d tasks, over the batch of 400", k)
		}
	}
	if got := fc.Task(held); got == nil || got.Queue != "jobs/dead" || got.Claimant != "w" {
		t.Errorf("the claimed task: %v, want it left in jobs/dead with its holder", got)
	}
	if got := fc.Task("t0000"); got == nil || got.Queue != "jobs/dead" || got.Attempt != 5 {
		t.Errorf("a task the filter does not select: %v, want it left", got)
	}
	if got := fc.Task("t0007"); held != "t0007" && (got == nil || got.Queue != "jobs/work" || got.Attempt != 0 || got.Err != "") {
		t.Errorf("a moved task: %v, want it in jobs/work with attempt 0 and no err", got)
	}
	// A task changed between the listing and the move is left alone; the
	// rest of its batch moves.
	for i := range 10 {
		if _, err := c.Insert(ctx, "jobs/x", nil, client.WithID(fmt.Sprintf("x%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	other := mustDial(t, fc.Addrs())
	var once sync.Once
	fc.SetHook(func(node, method string, req proto.Message, phase clienttest.Phase) error {
		if r, ok := req.(*taskstorepb.ModifyRequest); ok && phase == clienttest.Before && len(r.Changes) > 0 && r.Changes[0].NewQueue == "jobs/y" {
			once.Do(func() {
				cur := fc.Task("x3")
				_, err := other.Modify(ctx, &taskstorepb.ModifyRequest{Changes: []*taskstorepb.TaskChange{{Id: "x3", Version: cur.Version, Queue: "jobs/x", Value: []byte("changed")}}})
				if err != nil {
					t.Errorf("changing x3 under the move: %v", err)
				}
			})
		}
		return nil
	})
	res, err = c.MoveQueue(ctx, "jobs/x", "jobs/y", client.MoveOptions{})
	fc.SetHook(nil)
	if err != nil || res.Moved != 9 || res.Skipped != 1 {
		t.Errorf("move with x3 changed under it: %+v, %v; want 9 moved, 1 skipped", res, err)
	}
	if got := fc.Task("x3"); got == nil || got.Queue != "jobs/x" {
		t.Errorf("x3: %v, want it left in jobs/x", got)
	}
	// A task whose key the destination holds cannot move: a conflict, not
	// a skip, and the others move.
	for _, in := range []*taskstorepb.TaskInsert{{Id: "k1", Queue: "jobs/k-src", Key: "dup"}, {Id: "k2", Queue: "jobs/k-src"}, {Id: "k3", Queue: "jobs/k-dst", Key: "dup"}} {
		if _, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{in}}); err != nil {
			t.Fatal(err)
		}
	}
	res, err = c.MoveQueue(ctx, "jobs/k-src", "jobs/k-dst", client.MoveOptions{})
	if err != nil || res.Moved != 1 || res.Conflicts != 1 || len(res.ConflictIDs) != 1 || res.ConflictIDs[0] != "k1" || res.Skipped != 0 {
		t.Errorf("move with a key taken in the destination: %+v, %v; want k2 moved, k1 a conflict", res, err)
	}
	if _, err := c.MoveQueue(ctx, "jobs/dead", "other/work", client.MoveOptions{}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("a move across groups: %v, want ErrInvalid", err)
	}
	if _, err := c.MoveQueue(ctx, "jobs/dead", "jobs/work", client.MoveOptions{Filter: &taskstorepb.TasksRequest{State: taskstorepb.TaskState_TASK_STATE_CLAIMED}}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("a move of claimed tasks: %v, want ErrInvalid", err)
	}
}

// TestMoveQueueCountsClaimed: tasks a worker holds are never moved, and
// MoveResult.Claimed says how many were left in the source for that, held
// before the move or claimed during it (then counted once, as claimed, not
// also as skipped); a filter that selects no claimed task counts none.
func TestMoveQueueCountsClaimed(t *testing.T) {
	for _, tc := range []struct {
		name          string
		heldBefore    int  // claimed before the move
		claimDuring   bool // one claimed between the listing and the move
		filter        *taskstorepb.TasksRequest
		moved, claimd int
	}{
		{name: "none held", moved: 4},
		{name: "held before", heldBefore: 2, moved: 2, claimd: 2},
		{name: "claimed during", claimDuring: true, moved: 3, claimd: 1},
		{name: "held before and claimed during", heldBefore: 1, claimDuring: true, moved: 2, claimd: 2},
		{name: "only available ones", heldBefore: 1, filter: &taskstorepb.TasksRequest{State: taskstorepb.TaskState_TASK_STATE_AVAILABLE}, moved: 3},
		{name: "a filter the held one does not match", heldBefore: 1, filter: &taskstorepb.TasksRequest{ErrContains: "nope"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := clienttest.New(t, 3, 2)
			c := mustDial(t, fc.Addrs())
			ctx := ctxFor(t, 30*time.Second)
			for i := range 4 {
				if _, err := c.Insert(ctx, "m/dead", nil, client.WithID(fmt.Sprintf("d%d", i))); err != nil {
					t.Fatal(err)
				}
			}
			if tc.heldBefore > 0 {
				cl, err := c.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"m/dead"}, Lease: durationpb.New(time.Hour), Limit: uint32(tc.heldBefore)})
				if err != nil || len(cl.Tasks) != tc.heldBefore {
					t.Fatalf("claim: %v, %v", cl, err)
				}
			}
			if tc.claimDuring {
				other := mustDial(t, fc.Addrs())
				var once sync.Once
				fc.SetHook(func(node, method string, req proto.Message, phase clienttest.Phase) error {
					if r, ok := req.(*taskstorepb.ModifyRequest); ok && phase == clienttest.Before && len(r.Changes) > 0 {
						once.Do(func() {
							if _, err := other.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w2", Queues: []string{"m/dead"}, Lease: durationpb.New(time.Hour)}); err != nil {
								t.Errorf("claim under the move: %v", err)
							}
						})
					}
					return nil
				})
				defer fc.SetHook(nil)
			}
			res, err := c.MoveQueue(ctx, "m/dead", "m/work", client.MoveOptions{Filter: tc.filter})
			if err != nil {
				t.Fatal(err)
			}
			if res.Moved != tc.moved || res.Claimed != tc.claimd || res.Skipped != 0 {
				t.Errorf("%+v: want %d moved, %d claimed, 0 skipped", res, tc.moved, tc.claimd)
			}
		})
	}
}
