package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/client/clienttest"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustDial(t *testing.T, addrs string, opts ...client.Option) *client.Client {
	t.Helper()
	opts = append([]client.Option{client.WithBackoff(2*time.Millisecond, 50*time.Millisecond)}, opts...)
	c, err := client.Dial(ctxFor(t, 5*time.Second), addrs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// queuesOnDistinctShards returns one queue per shard of the fake cluster.
func queuesOnDistinctShards(t *testing.T, fc *clienttest.Cluster, n int) []string {
	t.Helper()
	seen := map[uint32]bool{}
	var out []string
	for i := 0; len(out) < n && i < 10000; i++ {
		q := fmt.Sprintf("g%d/work", i)
		if s := fc.ShardOf(q); !seen[s] {
			seen[s] = true
			out = append(out, q)
		}
	}
	if len(out) < n {
		t.Fatalf("found only %d shards", len(out))
	}
	return out
}

func requestIDs(calls []clienttest.Call) []string {
	var out []string
	for _, c := range calls {
		var rid *taskstorepb.RequestID
		switch r := c.Req.(type) {
		case *taskstorepb.ModifyRequest:
			rid = r.Request
		case *taskstorepb.ClaimRequest:
			rid = r.Request
		}
		out = append(out, fmt.Sprintf("%s/%d", rid.GetClientId(), rid.GetSeq()))
	}
	return out
}

func TestRoutesEachGroupToItsShardLeader(t *testing.T) {
	fc := clienttest.New(t, 3, 4)
	c := mustDial(t, fc.Addrs())
	ctx := ctxFor(t, 10*time.Second)
	queues := queuesOnDistinctShards(t, fc, 4)
	for _, q := range queues {
		if _, err := c.Insert(ctx, q, []byte("v")); err != nil {
			t.Fatalf("insert %s: %v", q, err)
		}
	}
	calls := fc.CallsTo("Modify")
	if len(calls) != len(queues) {
		t.Fatalf("got %d Modify calls, want %d (one per insert, no redirects)", len(calls), len(queues))
	}
	for i, call := range calls {
		if want := fc.Leader(fc.ShardOf(queues[i])); call.Node != want {
			t.Errorf("insert into %s went to %s, want leader %s", queues[i], call.Node, want)
		}
	}
}

func TestFollowsNotLeaderHintAndRemembersIt(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	c := mustDial(t, fc.Addrs())
	ctx := ctxFor(t, 10*time.Second)
	q := "jobs/a"
	shard := fc.ShardOf(q)
	old := fc.Leader(shard)
	next := "n3"
	if old == next {
		next = "n2"
	}
	fc.SetLeader(shard, next) // the client's table still names old

	if _, err := c.Insert(ctx, q, []byte("1")); err != nil {
		t.Fatal(err)
	}
	calls := fc.CallsTo("Modify")
	if len(calls) != 2 || calls[0].Node != old || calls[1].Node != next {
		t.Fatalf("calls went to %v, want [%s %s]", nodes(calls), old, next)
	}
	if ids := requestIDs(calls); ids[0] != ids[1] {
		t.Errorf("redirected attempt has request id %s, first had %s", ids[1], ids[0])
	}
	if _, err := c.Insert(ctx, q, []byte("2")); err != nil {
		t.Fatal(err)
	}
	if calls := fc.CallsTo("Modify"); len(calls) != 3 || calls[2].Node != next {
		t.Fatalf("second insert went to %v, want straight to %s", nodes(calls[2:]), next)
	}
}

func nodes(calls []clienttest.Call) []string {
	var out []string
	for _, c := range calls {
		out = append(out, c.Node)
	}
	return out
}

func TestRetryAfterLostReplyAppliesOnce(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	c := mustDial(t, fc.Addrs())
	ctx := ctxFor(t, 10*time.Second)
	var failed atomic.Int32
	fc.SetHook(func(node, method string, req proto.Message, phase clienttest.Phase) error {
		if method == "Modify" && phase == clienttest.After && failed.Add(1) <= 2 {
			return status.Error(codes.Unavailable, "leadership lost: outcome unknown")
		}
		return nil
	})
	// No id chosen: without the request id a retry would insert twice.
	task, err := c.Insert(ctx, "jobs/x", []byte("once"))
	if err != nil {
		t.Fatal(err)
	}
	if n := fc.Count(); n != 1 {
		t.Fatalf("cluster holds %d tasks, want 1", n)
	}
	calls := fc.CallsTo("Modify")
	if len(calls) < 3 {
		t.Fatalf("%d Modify attempts, want at least 3", len(calls))
	}
	ids := requestIDs(calls)
	for _, id := range ids {
		if id != ids[0] || id == "/0" {
			t.Fatalf("request ids differ across retries: %v", ids)
		}
	}
	if got := fc.Task(task.Id); got == nil || got.Version != 1 {
		t.Fatalf("task %s = %v", task.Id, got)
	}
	// The next call uses a new sequence number.
	if _, err := c.Insert(ctx, "jobs/x", nil); err != nil {
		t.Fatal(err)
	}
	if all := requestIDs(fc.CallsTo("Modify")); all[len(all)-1] == ids[0] {
		t.Fatalf("new call reused request id %s", ids[0])
	}
}

func TestRetriesUntilALeaderIsElected(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	c := mustDial(t, fc.Addrs())
	ctx := ctxFor(t, 10*time.Second)
	shard := fc.ShardOf("jobs/a")
	fc.SetLeader(shard, "")
	time.AfterFunc(100*time.Millisecond, func() { fc.SetLeader(shard, "n2") })
	if _, err := c.Insert(ctx, "jobs/a", nil); err != nil {
		t.Fatal(err)
	}
	calls := fc.CallsTo("Modify")
	if last := calls[len(calls)-1]; last.Node != "n2" {
		t.Fatalf("succeeded at %s, want n2", last.Node)
	}
	if len(fc.CallsTo("Routing")) < 2 {
		t.Errorf("routing was not refreshed while the shard had no leader")
	}
}

func TestGivesUpWhenContextEnds(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	c := mustDial(t, fc.Addrs())
	fc.SetLeader(fc.ShardOf("jobs/a"), "")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Insert(ctx, "jobs/a", nil)
	if err == nil {
		t.Fatal("insert succeeded without a leader")
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("gave up after %v", time.Since(start))
	}
	var nl *client.NotLeaderError
	if !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &nl) {
		t.Fatalf("err = %v; want ErrUnavailable, DeadlineExceeded and a *NotLeaderError", err)
	}
	if nl.Shard != fc.ShardOf("jobs/a") {
		t.Errorf("NotLeaderError names shard %d", nl.Shard)
	}
}

func TestStoppedLeaderIsAvoided(t *testing.T) {
	fc := clienttest.New(t, 3, 3)
	c := mustDial(t, fc.Addrs())
	ctx := ctxFor(t, 10*time.Second)
	q := "jobs/a"
	shard := fc.ShardOf(q)
	old := fc.Leader(shard)
	next := "n1"
	if old == next {
		next = "n2"
	}
	fc.Node(old).Stop()
	fc.SetLeader(shard, next)
	if _, err := c.Insert(ctx, q, nil); err != nil {
		t.Fatal(err)
	}
	calls := fc.CallsTo("Modify")
	if last := calls[len(calls)-1]; last.Node != next {
		t.Fatalf("succeeded at %s, want %s", last.Node, next)
	}
}

func TestDependencyErrorListsEveryReference(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	c := mustDial(t, fc.Addrs())
	ctx := ctxFor(t, 10*time.Second)
	task, err := c.Insert(ctx, "jobs/a", []byte("x"), client.WithID("t1"), client.WithKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Modify(ctx, &taskstorepb.ModifyRequest{
		Inserts: []*taskstorepb.TaskInsert{{Queue: "jobs/a", Key: "k"}},
		Deletes: []*taskstorepb.TaskRef{{Id: task.Id, Version: task.Version + 1, Queue: "jobs/a"}},
		Depends: []*taskstorepb.TaskRef{{Id: "nope", Version: 1, Queue: "jobs/b"}},
	})
	var dep *client.DependencyError
	if !errors.As(err, &dep) {
		t.Fatalf("err = %v (%T), want *DependencyError", err, err)
	}
	if !errors.Is(err, client.ErrRefused) || status.Code(err) != codes.FailedPrecondition {
		t.Errorf("err does not match ErrRefused / FailedPrecondition: %v", err)
	}
	if len(dep.Errors) != 3 || len(dep.Stale()) != 1 || len(dep.Missing()) != 1 || len(dep.Duplicates()) != 1 {
		t.Fatalf("refs = %v", dep.Errors)
	}
	if s := dep.Stale()[0]; s.Id != "t1" || s.CurrentVersion != 1 {
		t.Errorf("stale ref = %v", s)
	}
	if n := len(fc.CallsTo("Modify")); n != 2 {
		t.Errorf("%d Modify calls: a refusal must not be retried", n)
	}
}

func TestInvalidIsNotRetried(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	c := mustDial(t, fc.Addrs())
	ctx := ctxFor(t, 10*time.Second)
	_, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: "a/x"}, {Queue: "b/x"}}})
	if !errors.Is(err, client.ErrInvalid) || status.Code(err) != codes.InvalidArgument {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	var e *client.Error
	if !errors.As(err, &e) || e.Code() != codes.InvalidArgument {
		t.Fatalf("err = %#v, want *client.Error", err)
	}
	if n := len(fc.CallsTo("Modify")); n != 1 {
		t.Errorf("%d Modify calls, want 1", n)
	}
	if _, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Deletes: []*taskstorepb.TaskRef{{Id: "x", Version: 1}}}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("unroutable modify: err = %v, want ErrInvalid", err)
	}
	// A queue with no group ("/x") is refused at once, not retried until
	// the deadline (seen as taskctl queue pause /x running to --timeout).
	start := time.Now()
	for name, call := range map[string]func() error{
		"pause":  func() error { _, err := c.PauseQueue(ctx, "/x"); return err },
		"limit":  func() error { _, err := c.SetQueueLimit(ctx, "/x", 1); return err },
		"purge":  func() error { _, err := c.Purge(ctx, "/x"); return err },
		"delete": func() error { _, err := c.DeleteSchedule(ctx, "s", "/x"); return err },
	} {
		if err := call(); !errors.Is(err, client.ErrInvalid) {
			t.Errorf("%s of /x: err = %v, want ErrInvalid", name, err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("refusing /x took %v", d)
	}
}

func TestGetFansOutToEveryShard(t *testing.T) {
	fc := clienttest.New(t, 3, 4)
	c := mustDial(t, fc.Addrs())
	ctx := ctxFor(t, 10*time.Second)
	queues := queuesOnDistinctShards(t, fc, 4)
	var ids []string
	for i, q := range queues {
		task, err := c.Insert(ctx, q, []byte(q), client.WithID(fmt.Sprintf("id-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, task.Id)
	}
	for i, id := range ids {
		got, err := c.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.Queue != queues[i] || string(got.Value) != queues[i] {
			t.Errorf("Get(%s) = %v", id, got)
		}
	}
	for _, call := range fc.CallsTo("Tasks") {
		r := call.Req.(*taskstorepb.TasksRequest)
		if r.Shard == 0 {
			t.Errorf("Tasks without a shard: %v", r)
		}
		if want := fc.Leader(r.Shard); call.Node != want {
			t.Errorf("Tasks for shard %d went to %s, want %s", r.Shard, call.Node, want)
		}
	}
	if _, err := c.Get(ctx, "missing"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Get(missing) err = %v, want ErrNotFound", err)
	}
	resp, err := c.Tasks(ctx, &taskstorepb.TasksRequest{Ids: []string{ids[3], "missing", ids[0]}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Tasks) != 2 || resp.Tasks[0].Id != ids[3] || resp.Tasks[1].Id != ids[0] {
		t.Errorf("Tasks(ids) = %v, want in request order", resp.Tasks)
	}
}

func TestListQueuesMergesShards(t *testing.T) {
	fc := clienttest.New(t, 3, 4)
	c := mustDial(t, fc.Addrs())
	ctx := ctxFor(t, 10*time.Second)
	queues := queuesOnDistinctShards(t, fc, 4)
	for _, q := range queues {
		if _, err := c.Insert(ctx, q, nil); err != nil {
			t.Fatal(err)
		}
	}
	qs, err := c.ListQueues(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) != 4 {
		t.Fatalf("got %d queues, want 4", len(qs))
	}
	for i := 1; i < len(qs); i++ {
		if qs[i-1].Name >= qs[i].Name {
			t.Errorf("queues not sorted: %s before %s", qs[i-1].Name, qs[i].Name)
		}
	}
	for _, call := range fc.CallsTo("Queues") {
		if r := call.Req.(*taskstorepb.QueuesRequest); r.Shard == 0 {
			t.Errorf("Queues without a shard")
		}
	}
}

func TestDeleteAndReleaseLookUpTheQueue(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	c := mustDial(t, fc.Addrs(), client.WithClaimant("w1"))
	ctx := ctxFor(t, 10*time.Second)
	task, err := c.Insert(ctx, "jobs/a", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	claim, err := c.Claim(ctx, &taskstorepb.ClaimRequest{Queues: []string{"jobs/a"}})
	if err != nil || len(claim.Tasks) != 1 {
		t.Fatalf("claim = %v, %v", claim, err)
	}
	claimed := claim.Tasks[0]
	if claimed.Claimant != "w1" || claimed.Version != task.Version+1 {
		t.Fatalf("claimed = %v", claimed)
	}
	released, err := c.Release(ctx, claimed.Id, claimed.Version)
	if err != nil {
		t.Fatal(err)
	}
	if released.Claimant != "" || released.At.AsTime().After(time.Now()) {
		t.Errorf("released = %v, want unclaimed and available", released)
	}
	if err := c.Delete(ctx, task.Id, task.Version); !errors.Is(err, client.ErrRefused) {
		t.Errorf("delete of an old version: err = %v, want ErrRefused", err)
	}
	if err := c.Delete(ctx, released.Id, released.Version); err != nil {
		t.Fatal(err)
	}
	if fc.Task(task.Id) != nil {
		t.Error("task still there after delete")
	}
	if err := c.Delete(ctx, "missing", 1); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("delete of a missing task: err = %v, want ErrNotFound", err)
	}
}

func TestClaimTriesEachGroupInTurn(t *testing.T) {
	fc := clienttest.New(t, 3, 4)
	c := mustDial(t, fc.Addrs(), client.WithClaimant("w"))
	ctx := ctxFor(t, 10*time.Second)
	qs := queuesOnDistinctShards(t, fc, 3)
	if _, err := c.Insert(ctx, qs[2], []byte("late")); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Claim(ctx, &taskstorepb.ClaimRequest{Queues: qs, Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Tasks) != 1 || resp.Tasks[0].Queue != qs[2] {
		t.Fatalf("claimed %v", resp.Tasks)
	}
	calls := fc.CallsTo("Claim")
	if len(calls) != 3 {
		t.Fatalf("%d Claim calls, want one per group", len(calls))
	}
	for i, call := range calls {
		r := call.Req.(*taskstorepb.ClaimRequest)
		if len(r.Queues) != 1 || r.Queues[0] != qs[i] || call.Node != fc.Leader(fc.ShardOf(qs[i])) {
			t.Errorf("claim %d: %v at %s", i, r.Queues, call.Node)
		}
	}
	if ids := requestIDs(calls); ids[0] == ids[1] || ids[1] == ids[2] {
		t.Errorf("groups share a request id: %v", ids)
	}
}

func TestClaimWaitsForATask(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	c := mustDial(t, fc.Addrs(), client.WithClaimant("w"), client.WithAttemptTimeout(200*time.Millisecond))
	ctx := ctxFor(t, 10*time.Second)
	time.AfterFunc(400*time.Millisecond, func() {
		if _, err := c.Insert(context.Background(), "jobs/a", []byte("x")); err != nil {
			t.Error(err)
		}
	})
	start := time.Now()
	resp, err := c.Claim(ctx, &taskstorepb.ClaimRequest{Queues: []string{"jobs/a"}, Wait: durationpb.New(5 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Tasks) != 1 {
		t.Fatalf("claimed %v", resp.Tasks)
	}
	// One attempt: its deadline covered the wait despite the short attempt timeout.
	if n := len(fc.CallsTo("Claim")); n != 1 {
		t.Errorf("%d Claim attempts, want 1", n)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("claim returned after %v, before the insert", d)
	}

	// A wait longer than the context returns empty, not an error.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	resp, err = c.Claim(short, &taskstorepb.ClaimRequest{Queues: []string{"jobs/a"}, Wait: durationpb.New(10 * time.Second)})
	if err != nil || len(resp.Tasks) != 0 {
		t.Fatalf("claim = %v, %v; want empty", resp, err)
	}
}

func TestConcurrentCallsDoNotShareSequenceNumbers(t *testing.T) {
	fc := clienttest.New(t, 3, 4)
	c := mustDial(t, fc.Addrs())
	ctx := ctxFor(t, 20*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			_, err := c.Insert(ctx, fmt.Sprintf("g%d/q", i%8), []byte("x"))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := fc.Count(); n != 64 {
		t.Fatalf("%d tasks, want 64", n)
	}
}

func TestTransferLeader(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	c := mustDial(t, fc.Addrs())
	ctx := ctxFor(t, 10*time.Second)
	resp, err := c.TransferLeader(ctx, &taskstorepb.TransferLeaderRequest{Shard: 1, To: "n3"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Leader != "n3" || fc.Leader(1) != "n3" {
		t.Fatalf("leader = %s / %s, want n3", resp.Leader, fc.Leader(1))
	}
	// Already there: a NotLeader naming the target is success.
	fc.SetLeader(1, "n3")
	if _, err := c.TransferLeader(ctx, &taskstorepb.TransferLeaderRequest{Shard: 1, To: "n3"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TransferLeader(ctx, &taskstorepb.TransferLeaderRequest{Shard: 1, To: "n9"}); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("transfer to unknown node: err = %v, want ErrNotFound", err)
	}
}

func TestProxyOnlySendsEverythingToTheGivenAddress(t *testing.T) {
	fc := clienttest.New(t, 1, 1) // one node leads everything: a stand-in for a proxy
	c := mustDial(t, fc.Addrs(), client.WithProxyOnly())
	ctx := ctxFor(t, 10*time.Second)
	if _, err := c.Insert(ctx, "a/x", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Insert(ctx, "b/x", nil); err != nil {
		t.Fatal(err)
	}
	if n := len(fc.CallsTo("Routing")); n != 0 {
		t.Errorf("proxy-only client read routing %d times", n)
	}
	var failed atomic.Bool
	fc.SetHook(func(node, method string, req proto.Message, phase clienttest.Phase) error {
		if phase == clienttest.Before && !failed.Swap(true) {
			return status.Error(codes.Unavailable, "proxy: shard leader changing")
		}
		return nil
	})
	if _, err := c.Insert(ctx, "a/y", nil); err != nil {
		t.Fatalf("proxy-only client did not retry: %v", err)
	}
}

func TestDialNeedsAnAddress(t *testing.T) {
	if _, err := client.Dial(context.Background(), " , "); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("err = %v", err)
	}
}

func TestClosedClient(t *testing.T) {
	fc := clienttest.New(t, 1, 1)
	c := mustDial(t, fc.Addrs())
	c.Close()
	if _, err := c.Insert(ctxFor(t, time.Second), "a/x", nil); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("err = %v, want ErrClosed", err)
	}
}

// TestTasksByIDsDoesNotReportAbsentWhatAFailedShardHolds: a lookup of ids on
// every shard must not answer as if a task were absent when the shard that
// holds it did not answer (seen in the pause chaos scenario: a reader was
// told a committed task did not exist while its shard's leader was frozen).
// A partial answer is only right when every id asked for was found.
func TestTasksByIDsDoesNotReportAbsentWhatAFailedShardHolds(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	c := mustDial(t, fc.Addrs(), client.WithAttemptTimeout(200*time.Millisecond))
	ctx := ctxFor(t, 20*time.Second)
	queues := queuesOnDistinctShards(t, fc, 2)
	a, err := c.Insert(ctx, queues[0], nil, client.WithID("on-a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Insert(ctx, queues[1], nil, client.WithID("on-b"))
	if err != nil {
		t.Fatal(err)
	}
	down := fc.ShardOf(queues[1])
	fc.SetHook(func(node, method string, req proto.Message, phase clienttest.Phase) error {
		if r, ok := req.(*taskstorepb.TasksRequest); ok && method == "Tasks" && r.Shard == down {
			return status.Error(codes.Unavailable, "shard leader frozen")
		}
		return nil
	})
	shortCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := c.Tasks(shortCtx, &taskstorepb.TasksRequest{Ids: []string{a.Id, b.Id}})
	if err == nil {
		t.Fatalf("Tasks(%s, %s) with shard %d failing = %v and no error: %s reported absent", a.Id, b.Id, down, resp.Tasks, b.Id)
	}
	// Every id found, but the failed shard may hold another group's task
	// with the same id: no answer is right without it. Get must not take
	// the one copy it saw for the only one (a delete by id alone would act
	// on it), so it fails too.
	shortCtx2, cancel2 := context.WithTimeout(ctx, 3*time.Second)
	defer cancel2()
	if resp, err := c.Tasks(shortCtx2, &taskstorepb.TasksRequest{Ids: []string{a.Id}}); err == nil {
		t.Fatalf("Tasks(%s) with another shard failing = %v and no error", a.Id, resp.Tasks)
	}
	shortCtx3, cancel3 := context.WithTimeout(ctx, 3*time.Second)
	defer cancel3()
	if got, err := c.Get(shortCtx3, a.Id); err == nil {
		t.Fatalf("Get(%s) with another shard failing = %v and no error", a.Id, got)
	}
	fc.SetHook(nil)
	if got, err := c.Get(ctx, a.Id); err != nil || got.Queue != queues[0] {
		t.Fatalf("Get(%s) with every shard up = %v, %v", a.Id, got, err)
	}
}

// TestSameIDInTwoGroups: ids are unique within a consistency group only,
// so two groups (here on different shards) may hold the same id. A lookup
// by id alone used to return whichever shard answered first, and Delete
// without a queue then deleted that one (`task delete` removed
// the wrong copy). Now Get reports both and refuses to pick, Delete and
// Release without a queue refuse and change nothing, and with the queue
// they act on the task of that queue only.
func TestSameIDInTwoGroups(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	c := mustDial(t, fc.Addrs())
	ctx := ctxFor(t, 10*time.Second)
	queues := queuesOnDistinctShards(t, fc, 2)
	for _, q := range queues {
		if _, err := c.Insert(ctx, q, []byte(q), client.WithID("theta-task-1")); err != nil {
			t.Fatal(err)
		}
	}
	found, err := c.Find(ctx, "theta-task-1")
	if err != nil || len(found) != 2 || found[0].Queue == found[1].Queue {
		t.Fatalf("Find = %v, %v; want one task in each of %v", found, err, queues)
	}
	_, err = c.Get(ctx, "theta-task-1")
	var amb *client.AmbiguousIDError
	if !errors.As(err, &amb) || !errors.Is(err, client.ErrAmbiguous) || len(amb.Tasks) != 2 {
		t.Fatalf("Get of an id in two groups: %v, want an AmbiguousIDError listing both", err)
	}
	for _, q := range queues {
		if !strings.Contains(err.Error(), q) {
			t.Errorf("the error does not name queue %s: %v", q, err)
		}
	}
	if err := c.Delete(ctx, "theta-task-1", 1); !errors.Is(err, client.ErrAmbiguous) {
		t.Errorf("Delete without a queue: %v, want ErrAmbiguous", err)
	}
	if _, err := c.Release(ctx, "theta-task-1", 1); !errors.Is(err, client.ErrAmbiguous) {
		t.Errorf("Release without a queue: %v, want ErrAmbiguous", err)
	}
	if found, _ := c.Find(ctx, "theta-task-1"); len(found) != 2 {
		t.Fatalf("a refused delete changed something: %v", found)
	}
	if err := c.Delete(ctx, "theta-task-1", 1, client.InQueue(queues[1])); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, "theta-task-1")
	if err != nil || got.Queue != queues[0] {
		t.Fatalf("after deleting the copy in %s: Get = %v, %v; want the one in %s", queues[1], got, err, queues[0])
	}
	if got, err := c.GetIn(ctx, queues[0], "theta-task-1"); err != nil || got.Queue != queues[0] {
		t.Errorf("GetIn(%s) = %v, %v", queues[0], got, err)
	}
	if _, err := c.GetIn(ctx, queues[1], "theta-task-1"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("GetIn(%s) after its delete: %v, want ErrNotFound", queues[1], err)
	}
}
