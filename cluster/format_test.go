package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/cluster/peerpb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestRaiseFormatAfterUpgrade walks a rolling upgrade's last step on a real
// three-node cluster: while one node's binary applies only format 0, the
// shard keeps today's rule (an id is unique in the shard); once every
// replica's node applies fsm.MaxFormat, the leader raises the format on
// every replica through the log, and two consistency groups on one shard
// may each hold a task with the same id, each reached through
// its own queue.
func TestRaiseFormatAfterUpgrade(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale, Tune: func(tu *cluster.Tuning) {
		tu.FormatEvery = -1 // the test raises it by hand
	}})
	c.WaitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const shard = 1
	older := c.Nodes[(c.Leader(shard)+1)%3].Server().Node
	cluster.PretendMaxStateFormat(older, fsm.FormatShardIDs)

	leader := func() *cluster.Node { return c.Nodes[c.Leader(shard)].Server().Node }
	raise := func() bool {
		t.Helper()
		l := leader()
		ok, err := l.RaiseFormat(ctx, l.Shard(shard))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	insert := func(queue string) error {
		_, err := c.TaskStore(queue).Modify(ctx, &taskstorepb.ModifyRequest{
			Inserts: []*taskstorepb.TaskInsert{{Id: "same-id", Queue: queue, Value: []byte(queue)}}})
		return err
	}

	if raise() {
		t.Fatal("the leader raised the format while a replica's node applies only format 0")
	}
	rep, err := peerpb.NewPeerClient(c.ConnTo(older.Addr())).Report(ctx, &peerpb.ReportRequest{})
	if err != nil || rep.MaxStateFormat != fsm.FormatShardIDs {
		t.Fatalf("the older node reports %v (%v), want max_state_format 0", rep.GetMaxStateFormat(), err)
	}
	// What needs format 2 is refused, and says why, while a replica's node
	// would stop at it.
	if _, err := c.TaskStore("alpha/q").PauseQueue(ctx, &taskstorepb.QueuePauseRequest{Queue: "alpha/q"}); status.Code(err) != codes.Unavailable ||
		!strings.Contains(err.Error(), "state format") {
		t.Fatalf("a pause below format %d: %v, want Unavailable naming the state format", fsm.FormatQueueControls, err)
	}
	// A schedule removal below format 2 proposes nothing: no schedule can
	// exist, and a node older than schedules stops at OP_SCHEDULE.
	r := c.Nodes[c.Leader(shard)].Server().Node.Shard(shard).Raft()
	before := r.LastIndex()
	if res, err := c.TaskStore("alpha/q").DeleteSchedule(ctx, &taskstorepb.DeleteScheduleRequest{Name: "s", Queue: "alpha/q"}); err != nil || res.Deleted {
		t.Fatalf("a schedule removal below format %d: %v, %v; want nothing deleted", fsm.FormatQueueControls, res, err)
	}
	if after := r.LastIndex(); after != before {
		t.Fatalf("a schedule removal below format %d wrote to the log (index %d -> %d)", fsm.FormatQueueControls, before, after)
	}
	if err := insert("alpha/q"); err != nil {
		t.Fatal(err)
	}
	if err := insert("beta/q"); status.Code(err) != codes.AlreadyExists && status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("format 0: the id of another group's task on the shard: %v, want refused as a duplicate", err)
	}

	cluster.PretendMaxStateFormat(older, fsm.MaxFormat) // the last node is upgraded
	if !raise() {
		t.Fatal("every node applies the new format, but the leader did not raise it")
	}
	for i := range c.Nodes {
		m := c.Nodes[i].Server().Node.Shard(shard).Machine()
		deadline := time.Now().Add(20 * time.Second)
		for m.Format() != fsm.MaxFormat {
			if time.Now().After(deadline) {
				t.Fatalf("%s: format %d, want %d", c.Nodes[i].ID, m.Format(), fsm.MaxFormat)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if raise() {
		t.Fatal("the leader raised the format again")
	}
	if err := insert("beta/q"); err != nil {
		t.Fatalf("format %d: the same id in another group: %v", fsm.MaxFormat, err)
	}
	got, err := c.TaskStore("alpha/q").Tasks(ctx, &taskstorepb.TasksRequest{Ids: []string{"same-id"}, Shard: shard})
	if err != nil || len(got.Tasks) != 2 || got.Tasks[0].Queue != "alpha/q" || got.Tasks[1].Queue != "beta/q" {
		t.Fatalf("by id: %v (%v), want the tasks of alpha/q and beta/q", got.GetTasks(), err)
	}
	// A delete through beta's queue reaches beta's task only.
	if _, err := c.TaskStore("beta/q").Modify(ctx, &taskstorepb.ModifyRequest{
		Deletes: []*taskstorepb.TaskRef{{Id: "same-id", Version: 1, Queue: "beta/q"}}}); err != nil {
		t.Fatal(err)
	}
	got, err = c.TaskStore("alpha/q").Tasks(ctx, &taskstorepb.TasksRequest{Ids: []string{"same-id"}, Shard: shard})
	if err != nil || len(got.Tasks) != 1 || got.Tasks[0].Queue != "alpha/q" || string(got.Tasks[0].Value) != "alpha/q" {
		t.Fatalf("after deleting beta's: %v (%v), want alpha's alone", got.GetTasks(), err)
	}
}

// A cluster bootstrapped by this binary follows the newest format from its
// first request: as soon as a shard has a leader, two consistency groups
// on it may each hold a task with the same id. The loop that raises
// formats looks only every hour here, so only the raise on election can
// make it.
func TestNewClusterStartsAtNewestFormat(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale, Tune: func(tu *cluster.Tuning) {
		tu.FormatEvery = time.Hour
	}})
	c.WaitReady()
	const shard = 1
	l := c.Leader(shard)
	if l < 0 {
		t.Fatal("no leader after WaitReady")
	}
	if f := c.Nodes[l].Server().Node.Shard(shard).Machine().Format(); f != fsm.MaxFormat {
		t.Fatalf("a new cluster's shard leads at state format %d, want %d", f, fsm.MaxFormat)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, queue := range []string{"alpha/q", "beta/q"} {
		if _, err := c.TaskStore(queue).Modify(ctx, &taskstorepb.ModifyRequest{
			Inserts: []*taskstorepb.TaskInsert{{Id: "same-id", Queue: queue}}}); err != nil {
			t.Fatalf("insert same-id into %s: %v", queue, err)
		}
	}
}
