package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestScheduleAcrossLeaderChanges: a schedule ticking
// every second through two leader changes inserts exactly one task per
// tick it fired (no tick twice, whichever leader fired it), its count of
// fired ticks says so on every replica, and once removed it inserts no more.
func TestScheduleAcrossLeaderChanges(t *testing.T) {
	skipShort(t)
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	c.WaitFormat()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	ts := c.TaskStore("cron/beat")
	put, err := ts.PutSchedule(ctx, &taskstorepb.PutScheduleRequest{Schedule: &taskstorepb.Schedule{
		Name: "beat", Queue: "cron/beat", Every: durationpb.New(time.Second), Value: []byte("tick"),
		Missed: taskstorepb.MissedTicks_MISSED_TICKS_RUN_ONCE}})
	if err != nil {
		t.Fatal(err)
	}
	if put.Replaced || put.Schedule.Next == nil {
		t.Fatalf("put: %v", put)
	}
	for range 2 {
		time.Sleep(3 * time.Second)
		if err := c.TransferLeader(1, -1); err != nil {
			t.Fatal(err)
		}
		c.WaitReady()
	}
	time.Sleep(3 * time.Second)
	ts = c.TaskStore("cron/beat")
	list, err := ts.Schedules(ctx, &taskstorepb.SchedulesRequest{Prefix: "cron/"})
	if err != nil || len(list.Schedules) != 1 {
		t.Fatalf("schedules: %v %v", list, err)
	}
	if _, err := ts.DeleteSchedule(ctx, &taskstorepb.DeleteScheduleRequest{Name: "beat", Queue: "cron/beat"}); err != nil {
		t.Fatal(err)
	}
	fired := list.Schedules[0].Fired
	time.Sleep(2 * time.Second) // a removed schedule inserts nothing more
	tasks, err := ts.Tasks(ctx, &taskstorepb.TasksRequest{Queue: "cron/beat", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, tk := range tasks.Tasks {
		// Ticks fall on whole seconds: beat@2026-11-25T12:47:08Z.
		if !strings.HasPrefix(tk.Id, "beat@") || strings.Contains(tk.Id, ".") || seen[tk.Id] || string(tk.Value) != "tick" {
			t.Fatalf("task %s (value %q): not one task per tick", tk.Id, tk.Value)
		}
		seen[tk.Id] = true
	}
	// fired was read before the removal, which a tick may have beaten by
	// one.
	if n := uint64(len(tasks.Tasks)); n < 5 || n < fired || n > fired+1 {
		t.Fatalf("%d tasks, schedule says %d ticks fired: a tick inserted twice or not at all", n, fired)
	}
	waitDigestsAgree(t, c, 1)
}

// TestPutScheduleAnswersWithTheStoredSchedule: a retried put (same request
// id) answers with the schedule the first one stored, not a next tick
// computed again from the retry's time; a put that replaces a schedule
// answers with the fired count and last tick it kept.
func TestPutScheduleAnswersWithTheStoredSchedule(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	c.WaitFormat()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const q = "cron/stored"
	ts := c.TaskStore(q)
	put := func(seq uint64, every time.Duration) *taskstorepb.Schedule {
		t.Helper()
		res, err := ts.PutSchedule(ctx, &taskstorepb.PutScheduleRequest{
			Schedule: &taskstorepb.Schedule{Name: "s", Queue: q, Every: durationpb.New(every)},
			Request:  &taskstorepb.RequestID{ClientId: "put-test", Seq: seq}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Schedule
	}
	first := put(1, time.Hour)
	time.Sleep(1100 * time.Millisecond)
	if retry := put(1, time.Hour); !retry.Next.AsTime().Equal(first.Next.AsTime()) {
		t.Fatalf("a retried put answers next %v, the stored schedule's is %v", retry.Next.AsTime(), first.Next.AsTime())
	}
	put(2, time.Second)
	deadline := time.Now().Add(20 * time.Second)
	var fired uint64
	for fired < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the schedule did not fire twice")
		}
		time.Sleep(200 * time.Millisecond)
		res, err := ts.Schedules(ctx, &taskstorepb.SchedulesRequest{Prefix: q})
		if err != nil || len(res.Schedules) != 1 {
			t.Fatalf("schedules: %v, %v", res, err)
		}
		fired = res.Schedules[0].Fired
	}
	if again := put(3, time.Hour); again.Fired < 2 || again.Last == nil {
		t.Fatalf("a replacing put answers fired %d, last %v: want what it kept (at least 2, and a last tick)", again.Fired, again.Last)
	}
}
