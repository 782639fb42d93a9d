package cluster_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestPauseQueue: a paused queue takes inserts but hands
// out no claims, a claim of it and another queue takes from the other, a
// waiting claim stays parked through the pause (and a leader change) and
// wakes on the resume; a paused queue with no tasks is still listed as
// paused; the replicas agree.
func TestPauseQueue(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	c.WaitFormat()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ts := c.TaskStore("pz/a")
	const shard = 1

	res, err := ts.PauseQueue(ctx, &taskstorepb.QueuePauseRequest{Queue: "pz/a"})
	if err != nil || res.WasPaused {
		t.Fatalf("pause: %v, %v; want a first pause", res, err)
	}
	if res, err := ts.PauseQueue(ctx, &taskstorepb.QueuePauseRequest{Queue: "pz/a"}); err != nil || !res.WasPaused {
		t.Fatalf("pause again: %v, %v; want no error, was paused", res, err)
	}
	qs, err := ts.Queues(ctx, &taskstorepb.QueuesRequest{Prefix: "pz/"})
	if err != nil || len(qs.Queues) != 1 || qs.Queues[0].Name != "pz/a" || !qs.Queues[0].Paused || qs.Queues[0].Total != 0 {
		t.Fatalf("queues of an empty paused queue: %v, %v", qs.GetQueues(), err)
	}
	insert(t, c, "pz/a", "a1", "")
	insert(t, c, "pz/b", "b1", "")

	claim := func(wait time.Duration, queues ...string) *taskstorepb.ClaimResponse {
		t.Helper()
		res, err := ts.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: queues, Limit: 5, Lease: durationpb.New(time.Minute),
			Wait: durationpb.New(wait)})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if got := claim(0, "pz/a"); len(got.Tasks) != 0 {
		t.Fatalf("a claim of the paused queue took %v", got.Tasks)
	}
	if got := claim(0, "pz/a", "pz/b"); len(got.Tasks) != 1 || got.Tasks[0].Id != "b1" {
		t.Fatalf("a claim of the paused queue and another took %v, want b1 alone", got.Tasks)
	}

	waited := make(chan *taskstorepb.ClaimResponse, 1)
	go func() {
		// A leader that loses leadership ends its waiting claims with an
		// error (clients retry): that counts as an empty answer here.
		res, _ := ts.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"pz/a"}, Limit: 5,
			Lease: durationpb.New(time.Minute), Wait: durationpb.New(60 * time.Second)})
		waited <- res
	}()
	select {
	case got := <-waited:
		t.Fatalf("a waiting claim of the paused queue returned %v", got.GetTasks())
	case <-time.After(time.Second):
	}
	// The pause is replicated state: a new leader keeps it.
	if err := c.TransferLeader(shard, -1); err != nil {
		t.Fatal(err)
	}
	c.WaitReady()
	c.WaitFormat()
	if got := claim(0, "pz/a"); len(got.Tasks) != 0 {
		t.Fatalf("after a leader change a claim of the paused queue took %v", got.Tasks)
	}
	if res, err := ts.ResumeQueue(ctx, &taskstorepb.QueuePauseRequest{Queue: "pz/a"}); err != nil || !res.WasPaused {
		t.Fatalf("resume: %v, %v", res, err)
	}
	// The waiting claim was parked on the old leader, which answered it
	// (empty or not) when it lost leadership, or still holds it: either
	// way a claim now gets the task.
	var got []*taskstorepb.Task
	select {
	case r := <-waited:
		got = r.GetTasks()
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting claim did not return after the resume")
	}
	if len(got) == 0 {
		got = claim(0, "pz/a").Tasks
	}
	if len(got) != 1 || got[0].Id != "a1" {
		t.Fatalf("after the resume: %v, want a1", got)
	}
	qs, err = ts.Queues(ctx, &taskstorepb.QueuesRequest{Prefix: "pz/a"})
	if err != nil || len(qs.Queues) != 1 || qs.Queues[0].Paused {
		t.Fatalf("queues after the resume: %v, %v", qs.GetQueues(), err)
	}
	waitDigestsAgree(t, c, shard)
}

// TestResumeWakesWaitingClaim: on a stable leader, a claim waiting on a
// paused queue with a task returns it as soon as the queue is resumed.
func TestResumeWakesWaitingClaim(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	c.WaitFormat()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ts := c.TaskStore("pw/a")
	if _, err := ts.PauseQueue(ctx, &taskstorepb.QueuePauseRequest{Queue: "pw/a"}); err != nil {
		t.Fatal(err)
	}
	insert(t, c, "pw/a", "a1", "")
	type answer struct {
		res *taskstorepb.ClaimResponse
		err error
		at  time.Time
	}
	waited := make(chan answer, 1)
	go func() {
		res, err := ts.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"pw/a"}, Wait: durationpb.New(40 * time.Second)})
		waited <- answer{res, err, time.Now()}
	}()
	select {
	case a := <-waited:
		t.Fatalf("the waiting claim returned during the pause: %v %v", a.res, a.err)
	case <-time.After(1500 * time.Millisecond):
	}
	resumed := time.Now()
	if _, err := ts.ResumeQueue(ctx, &taskstorepb.QueuePauseRequest{Queue: "pw/a"}); err != nil {
		t.Fatal(err)
	}
	a := <-waited
	if a.err != nil || len(a.res.Tasks) != 1 || a.res.Tasks[0].Id != "a1" {
		t.Fatalf("waiting claim after the resume: %v %v, want a1", a.res, a.err)
	}
	if d := a.at.Sub(resumed); d > 10*time.Second {
		t.Fatalf("the waiting claim returned %v after the resume: the resume did not wake it", d)
	}
}

// TestLimitWakesWaitingClaims: under a concurrency limit
// of 1, a waiting claim stays parked while a task is available but another
// is claimed, and wakes when that claim ends: by a commit, and by its lease
// running out (with no other write: the leader's tick).
func TestLimitWakesWaitingClaims(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	c.WaitFormat()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ts := c.TaskStore("lw/a")
	if _, err := ts.SetQueueLimit(ctx, &taskstorepb.QueueLimitRequest{Queue: "lw/a", MaxClaimed: 1}); err != nil {
		t.Fatal(err)
	}
	claim := func(wait, lease time.Duration) (*taskstorepb.ClaimResponse, error) {
		return ts.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"lw/a"}, Limit: 5,
			Lease: durationpb.New(lease), Wait: durationpb.New(wait)})
	}
	type answer struct {
		res *taskstorepb.ClaimResponse
		err error
	}
	waitFor := func(what string, hold func()) *taskstorepb.Task {
		t.Helper()
		ch := make(chan answer, 1)
		go func() {
			res, err := claim(40*time.Second, time.Minute)
			ch <- answer{res, err}
		}()
		select {
		case a := <-ch:
			t.Fatalf("%s: the waiting claim returned while the queue was at its limit: %v %v", what, a.res, a.err)
		case <-time.After(1500 * time.Millisecond):
		}
		hold()
		select {
		case a := <-ch:
			if a.err != nil || len(a.res.Tasks) != 1 {
				t.Fatalf("%s: waiting claim: %v %v, want one task", what, a.res, a.err)
			}
			return a.res.Tasks[0]
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the waiting claim did not wake", what)
		}
		return nil
	}

	insert(t, c, "lw/a", "a1", "")
	insert(t, c, "lw/a", "a2", "")
	held, err := claim(0, time.Minute)
	if err != nil || len(held.Tasks) != 1 {
		t.Fatalf("first claim: %v %v, want one task under the limit", held, err)
	}
	h := held.Tasks[0]
	got := waitFor("commit", func() {
		if _, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: "w",
			Deletes: []*taskstorepb.TaskRef{{Id: h.Id, Version: h.Version, Queue: "lw/a"}}}); err != nil {
			t.Fatal(err)
		}
	})
	if got.Id == h.Id {
		t.Fatalf("woke with the deleted task %s", got.Id)
	}
	// got holds the one slot for a minute. Release it by letting a short
	// lease run out instead: delete it, claim the next with a 3 s lease.
	if _, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: "w",
		Deletes: []*taskstorepb.TaskRef{{Id: got.Id, Version: got.Version, Queue: "lw/a"}}}); err != nil {
		t.Fatal(err)
	}
	insert(t, c, "lw/a", "a3", "")
	insert(t, c, "lw/a", "a4", "")
	short, err := claim(0, 3*time.Second)
	if err != nil || len(short.Tasks) != 1 {
		t.Fatalf("short claim: %v %v", short, err)
	}
	waitFor("lease end", func() {})
}
