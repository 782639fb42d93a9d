package client_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestWorker runs the Worker against one in-process 3-node cluster; each
// subtest uses its own consistency group.
func TestWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	addrs := startCluster(t)
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, addrs string)
	}{
		{"ClaimHandleDelete", testWorkerClaimHandleDelete},
		{"CommitCarriesNextClaim", testWorkerCommitCarriesNextClaim},
		{"RenewalKeepsSlowTask", testWorkerRenewalKeepsSlowTask},
		{"RetryThenDeadLetter", testWorkerRetryThenDeadLetter},
		{"MoveWithInsertsIsAtomic", testWorkerMoveWithInsertsIsAtomic},
		{"LostTaskCancelsHandler", testWorkerLostTaskCancelsHandler},
		{"PausedWorkerCommitIsRefused", testWorkerPausedWorkerCommitIsRefused},
		{"ShutdownReleases", testWorkerShutdownReleases},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, addrs)
		})
	}
}

func startCluster(t *testing.T) string {
	t.Helper()
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: 2})
	c.WaitReady()
	return strings.Join(c.Endpoints(), ",")
}

func newWorker(t *testing.T, c *client.Client, queues []string, h client.Handler, opts ...client.WorkerOption) *client.Worker {
	t.Helper()
	w, err := client.NewWorker(c, queues, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// runWorker runs w until stop is called or the test ends; Run must return
// nil.
func runWorker(t *testing.T, w *client.Worker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker %s: Run: %v", w.Claimant(), err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mustInsert(t *testing.T, c *client.Client, queue, id, value string, opts ...client.InsertOption) *client.Task {
	t.Helper()
	task, err := c.Insert(ctxFor(t, 20*time.Second), queue, []byte(value), append(opts, client.WithID(id))...)
	if err != nil {
		t.Fatalf("insert %s: %v", id, err)
	}
	return task
}

func mustGet(t *testing.T, c *client.Client, id string) *client.Task {
	t.Helper()
	task, err := c.Get(ctxFor(t, 20*time.Second), id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return task
}

func assertGone(t *testing.T, c *client.Client, id string) {
	t.Helper()
	task, err := c.Get(ctxFor(t, 20*time.Second), id)
	if !errors.Is(err, client.ErrNotFound) {
		t.Errorf("task %s: got %v, %v; want ErrNotFound", id, task, err)
	}
}

// checkTask compares the fields of a task that a test pins down.
func checkTask(t *testing.T, got *client.Task, want taskWant) {
	t.Helper()
	g := taskWant{got.Queue, got.Version, string(got.Value), got.Claimant, got.Claims, got.Attempt, got.Err}
	if g != want {
		t.Errorf("task %s:\n got %+v\nwant %+v", got.Id, g, want)
	}
}

type taskWant struct {
	Queue    string
	Version  uint64
	Value    string
	Claimant string
	Claims   uint32
	Attempt  uint32
	Err      string
}

func checkStats(t *testing.T, w *client.Worker, want client.WorkerStats) {
	t.Helper()
	if got := w.Stats(); got != want {
		t.Errorf("worker %s stats:\n got %+v\nwant %+v", w.Claimant(), got, want)
	}
}

func testWorkerClaimHandleDelete(t *testing.T, addrs string) {
	c := mustDial(t, addrs)
	const q = "basic/in"
	ids := []string{"b1", "b2", "b3"}
	for _, id := range ids {
		mustInsert(t, c, q, id, "v-"+id)
	}
	var mu sync.Mutex
	seen := map[string][]*client.Task{}
	w := newWorker(t, c, []string{q}, func(ctx context.Context, task *client.Task) (client.Result, error) {
		mu.Lock()
		defer mu.Unlock()
		seen[task.Id] = append(seen[task.Id], proto.Clone(task).(*client.Task))
		return client.Result{}, nil
	}, client.WithWorkerClaimant("basic-w"), client.WithConcurrency(2))
	runWorker(t, w)
	waitFor(t, 20*time.Second, "three commits", func() bool { return w.Stats().Committed == 3 })

	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if len(seen[id]) != 1 {
			t.Fatalf("task %s handled %d times, want 1", id, len(seen[id]))
		}
		// As claimed: inserted at v1, claimed at v2.
		checkTask(t, seen[id][0], taskWant{Queue: q, Version: 2, Value: "v-" + id, Claimant: "basic-w", Claims: 1})
		assertGone(t, c, id)
	}
	checkStats(t, w, client.WorkerStats{Claimed: 3, Committed: 3})
}

// testWorkerCommitCarriesNextClaim: with work queued, each commit claims
// the next task in the same request, so the steady loop makes one Modify
// and no Claim per task; only the first claim and the one that waits once
// the queue is empty are Claims.
func testWorkerCommitCarriesNextClaim(t *testing.T, addrs string) {
	var calls sync.Map // method -> *atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		n, _ := calls.LoadOrStore(method[strings.LastIndex(method, "/")+1:], new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	calls0 := func(method string) int64 {
		if n, ok := calls.Load(method); ok {
			return n.(*atomic.Int64).Load()
		}
		return 0
	}
	setup := mustDial(t, addrs)
	const q, n = "steady/in", 20
	for i := range n {
		mustInsert(t, setup, q, fmt.Sprintf("s%02d", i), "job")
	}
	c := mustDial(t, addrs, client.WithDialOptions(grpc.WithChainUnaryInterceptor(count)))
	var order []string
	w := newWorker(t, c, []string{q}, func(ctx context.Context, task *client.Task) (client.Result, error) {
		order = append(order, task.Id) // concurrency 1: one handler at a time
		if task.Id == "s05" {
			return client.Result{MoveTo: "steady/done"}, nil // a move carries the claim too
		}
		return client.Result{}, nil
	}, client.WithWorkerClaimant("steady-w"))
	runWorker(t, w)
	waitFor(t, 30*time.Second, "every task committed", func() bool { return w.Stats().Committed == n })
	// The worker then waits in a Claim for more work.
	waitFor(t, 10*time.Second, "the waiting claim", func() bool { return calls0("Claim") >= 2 })
	if got := calls0("Modify"); got != n {
		t.Errorf("%d Modify calls for %d tasks, want %d (one per commit)", got, n, n)
	}
	if got := calls0("Claim"); got != 2 {
		t.Errorf("%d Claim calls, want 2: the first and the one that waits once the queue is empty", got)
	}
	for i, id := range order {
		if want := fmt.Sprintf("s%02d", i); id != want {
			t.Fatalf("handled %v, want s00..s%02d in order", order, n-1)
		}
	}
	checkStats(t, w, client.WorkerStats{Claimed: n, Committed: n})
	moved := mustGet(t, setup, "s05")
	checkTask(t, moved, taskWant{Queue: "steady/done", Version: 3, Value: "job", Claims: 1})
}

func testWorkerRenewalKeepsSlowTask(t *testing.T, addrs string) {
	ca, cb := mustDial(t, addrs), mustDial(t, addrs)
	const q = "renew/in"
	// Long enough that a brief leaderless spell on a starved CI machine does
	// not let the lease run out between renewals.
	const lease = 3 * time.Second
	mustInsert(t, ca, q, "r1", "job")
	started := make(chan struct{})
	var handlerErr atomic.Value
	a := newWorker(t, ca, []string{q}, func(ctx context.Context, task *client.Task) (client.Result, error) {
		close(started)
		select {
		case <-time.After(3*lease + lease/2): // longer than three leases
		case <-ctx.Done():
			handlerErr.Store(context.Cause(ctx))
			return client.Result{}, ctx.Err()
		}
		return client.Result{MoveTo: "renew/done", Value: []byte("by A")}, nil
	}, client.WithWorkerClaimant("renew-a"), client.WithLease(lease))
	var bCalls atomic.Int32
	b := newWorker(t, cb, []string{q}, func(ctx context.Context, task *client.Task) (client.Result, error) {
		bCalls.Add(1)
		return client.Result{}, nil
	}, client.WithWorkerClaimant("renew-b"), client.WithLease(lease))
	runWorker(t, a)
	<-started
	runWorker(t, b)

	// Two leases in, A still holds the task, renewed (a new version each
	// third of the lease), and nobody else claimed it.
	time.Sleep(2 * lease)
	mid := mustGet(t, ca, "r1")
	if mid.Claimant != "renew-a" || mid.Claims != 1 || mid.Version < 4 || mid.Queue != q {
		t.Errorf("after two leases: claimant %q, claims %d, version %d, queue %s; want renew-a, 1, >= 4, %s",
			mid.Claimant, mid.Claims, mid.Version, mid.Queue, q)
	}
	waitFor(t, 20*time.Second, "A's commit", func() bool { return a.Stats().Committed == 1 })
	got := mustGet(t, ca, "r1")
	checkTask(t, got, taskWant{Queue: "renew/done", Version: got.Version, Value: "by A", Claims: 1})
	if got.Version <= mid.Version {
		t.Errorf("final version %d, want more than %d", got.Version, mid.Version)
	}
	if err := handlerErr.Load(); err != nil {
		t.Errorf("A's handler context ended: %v", err)
	}
	if n := bCalls.Load(); n != 0 {
		t.Errorf("B handled the task %d times, want 0", n)
	}
	checkStats(t, a, client.WorkerStats{Claimed: 1, Committed: 1})
	checkStats(t, b, client.WorkerStats{})
}

func testWorkerRetryThenDeadLetter(t *testing.T, addrs string) {
	c := mustDial(t, addrs)
	mustInsert(t, c, "retry/in", "x1", "payload")
	mustInsert(t, c, "retry/perm", "x2", "bad")
	mustInsert(t, c, "retry/panic", "x3", "boom")
	type call struct {
		attempt uint32
		err     string
		at      time.Time
	}
	var mu sync.Mutex
	calls := map[string][]call{}
	w := newWorker(t, c, []string{"retry/in", "retry/perm", "retry/panic"}, func(ctx context.Context, task *client.Task) (client.Result, error) {
		mu.Lock()
		calls[task.Id] = append(calls[task.Id], call{task.Attempt, task.Err, time.Now()})
		mu.Unlock()
		switch task.Queue {
		case "retry/perm":
			return client.Result{}, client.Permanent(errors.New("bad input"))
		case "retry/panic":
			panic("kaboom")
		}
		return client.Result{}, fmt.Errorf("boom %d", task.Attempt)
	}, client.WithMaxAttempts(3), client.WithRetryBackoff(200*time.Millisecond, 300*time.Millisecond))
	runWorker(t, w)
	waitFor(t, 30*time.Second, "three dead letters", func() bool { return w.Stats().DeadLettered == 3 })

	mu.Lock()
	defer mu.Unlock()
	x1 := calls["x1"]
	var attempts []uint32
	var errs []string
	for _, c := range x1 {
		attempts = append(attempts, c.attempt)
		errs = append(errs, c.err)
	}
	if fmt.Sprint(attempts) != "[0 1 2]" || fmt.Sprintf("%q", errs) != `["" "boom 0" "boom 1"]` {
		t.Fatalf("x1 was tried with attempts %v, errs %q; want [0 1 2], [\"\" \"boom 0\" \"boom 1\"]", attempts, errs)
	}
	// Backoff 200ms after the first failure, then doubled but capped at 300ms.
	if d := x1[1].at.Sub(x1[0].at); d < 200*time.Millisecond {
		t.Errorf("first retry after %v, want at least 200ms", d)
	}
	if d := x1[2].at.Sub(x1[1].at); d < 300*time.Millisecond {
		t.Errorf("second retry after %v, want at least 300ms", d)
	}
	// Versions: insert 1, then per attempt a claim and a change.
	checkTask(t, mustGet(t, c, "x1"), taskWant{Queue: "retry/dead", Version: 7, Value: "payload", Claims: 3, Attempt: 3, Err: "boom 2"})
	if n := len(calls["x2"]); n != 1 {
		t.Errorf("permanent failure tried %d times, want 1", n)
	}
	checkTask(t, mustGet(t, c, "x2"), taskWant{Queue: "retry/dead", Version: 3, Value: "bad", Claims: 1, Attempt: 1, Err: "bad input"})
	if n := len(calls["x3"]); n != 3 {
		t.Errorf("panicking task tried %d times, want 3", n)
	}
	checkTask(t, mustGet(t, c, "x3"), taskWant{Queue: "retry/dead", Version: 7, Value: "boom", Claims: 3, Attempt: 3, Err: "panic: kaboom"})
	checkStats(t, w, client.WorkerStats{Claimed: 7, Retried: 4, DeadLettered: 3})
}

func testWorkerMoveWithInsertsIsAtomic(t *testing.T, addrs string) {
	c := mustDial(t, addrs)
	mustInsert(t, c, "move/in", "m1", "in-1")
	mustInsert(t, c, "move/in", "m2", "in-2")
	mustInsert(t, c, "move/other", "m-taken", "taken")
	w := newWorker(t, c, []string{"move/in"}, func(ctx context.Context, task *client.Task) (client.Result, error) {
		switch task.Id {
		case "m1":
			return client.Result{MoveTo: "move/next", Value: []byte("out-1"), Inserts: []*client.TaskInsert{
				client.NewInsert("move/follow", []byte("f-a"), client.WithID("m1-a")),
				client.NewInsert("move/follow", []byte("f-b"), client.WithID("m1-b"), client.WithPriority(7)),
			}}, nil
		default:
			// The second insert's id is taken: nothing of this commit may
			// happen.
			return client.Result{MoveTo: "move/next", Value: []byte("out-2"), Inserts: []*client.TaskInsert{
				client.NewInsert("move/follow", []byte("f-c"), client.WithID("m2-c")),
				client.NewInsert("move/follow", []byte("dup"), client.WithID("m-taken")),
			}}, nil
		}
	}, client.WithMaxAttempts(1))
	runWorker(t, w)
	waitFor(t, 20*time.Second, "a commit and a dead letter", func() bool {
		s := w.Stats()
		return s.Committed == 1 && s.DeadLettered == 1
	})

	checkTask(t, mustGet(t, c, "m1"), taskWant{Queue: "move/next", Version: 3, Value: "out-1", Claims: 1})
	// A task records who inserted it (the worker's commit) until claimed.
	checkTask(t, mustGet(t, c, "m1-a"), taskWant{Queue: "move/follow", Version: 1, Value: "f-a", Claimant: w.Claimant()})
	if f := mustGet(t, c, "m1-b"); f.Queue != "move/follow" || string(f.Value) != "f-b" || f.Priority != 7 {
		t.Errorf("m1-b = %v", f)
	}
	// m2's commit was refused as a whole and counted as its one attempt.
	checkTask(t, mustGet(t, c, "m2"), taskWant{Queue: "move/dead", Version: 3, Value: "in-2", Claims: 1, Attempt: 1,
		Err: "commit: transaction refused: insert of existing id m-taken in move/follow (its consistency group already holds a task with that id)"})
	assertGone(t, c, "m2-c")
	checkTask(t, mustGet(t, c, "m-taken"), taskWant{Queue: "move/other", Version: 1, Value: "taken", Claimant: c.Claimant()})
	checkStats(t, w, client.WorkerStats{Claimed: 2, Committed: 1, DeadLettered: 1})
}

func testWorkerLostTaskCancelsHandler(t *testing.T, addrs string) {
	c := mustDial(t, addrs)
	const q = "lost/in"
	mustInsert(t, c, q, "l1", "job")
	started := make(chan struct{})
	causes := make(chan error, 1)
	w := newWorker(t, c, []string{q}, func(ctx context.Context, task *client.Task) (client.Result, error) {
		close(started)
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return client.Result{MoveTo: "lost/done"}, nil // must not be committed
	}, client.WithWorkerClaimant("lost-w"), client.WithLease(time.Second))
	runWorker(t, w)
	<-started

	// Take the task away from under the worker: delete its current version
	// (as its claimant, which the lease allows).
	ctx := ctxFor(t, 20*time.Second)
	for {
		cur := mustGet(t, c, "l1")
		err := c.Delete(ctx, "l1", cur.Version, client.InQueue(q), client.AsClaimant("lost-w"))
		if err == nil {
			break
		}
		if !errors.Is(err, client.ErrRefused) {
			t.Fatal(err) // else a renewal came first: try again
		}
	}
	select {
	case cause := <-causes:
		if !errors.Is(cause, client.ErrTaskLost) {
			t.Fatalf("handler context ended with %v, want ErrTaskLost", cause)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("handler context not cancelled after the task was deleted")
	}
	waitFor(t, 10*time.Second, "the loss to be counted", func() bool { return w.Stats().Lost == 1 })
	checkStats(t, w, client.WorkerStats{Claimed: 1, Lost: 1})
	assertGone(t, c, "l1")
}

// testWorkerPausedWorkerCommitIsRefused: worker A is paused (its handler
// blocks, and renewal is off) past its lease; worker B claims the task and
// commits it; A resumes and commits, and the cluster refuses A's stale
// version. The task is committed once, by B.
func testWorkerPausedWorkerCommitIsRefused(t *testing.T, addrs string) {
	logA := &recordLog{}
	ca := mustDial(t, addrs, client.WithLogger(slog.New(logA)))
	cb := mustDial(t, addrs)
	const q = "paused/in"
	const lease = time.Second
	mustInsert(t, ca, q, "p1", "job")

	var aCalls, bCalls atomic.Int32
	// An outside system that fences by the token: A's
	// write after B's must be refused there too, not only its commit here.
	ext := &fencedStore{}
	var aWrite atomic.Value
	started, resume := make(chan struct{}), make(chan struct{})
	a := newWorker(t, ca, []string{q}, func(ctx context.Context, task *client.Task) (client.Result, error) {
		aCalls.Add(1)
		close(started)
		<-resume // paused: no renewal, context ignored
		aWrite.Store(writeResult{ext.write(task.Id, client.FencingToken(task), "by A")})
		return client.Result{}, nil
	}, client.WithWorkerClaimant("paused-a"), client.WithLease(lease), client.WithRenewal(0))
	var bSaw atomic.Pointer[client.Task]
	b := newWorker(t, cb, []string{q}, func(ctx context.Context, task *client.Task) (client.Result, error) {
		bCalls.Add(1)
		bSaw.Store(task)
		if err := ext.write(task.Id, client.FencingToken(task), "by B"); err != nil {
			return client.Result{}, err
		}
		return client.Result{MoveTo: "paused/done", Value: []byte("by B")}, nil
	}, client.WithWorkerClaimant("paused-b"), client.WithLease(lease))

	runWorker(t, a)
	<-started
	claimedByA := time.Now()
	runWorker(t, b)
	waitFor(t, 20*time.Second, "B's commit", func() bool { return b.Stats().Committed == 1 })
	if d := time.Since(claimedByA); d < lease/2 {
		t.Errorf("B committed %v after A's claim, before A's lease of %v could end", d, lease)
	}
	// B claimed v3 (insert v1, A's claim v2) and moved it to v4.
	checkTask(t, bSaw.Load(), taskWant{Queue: q, Version: 3, Value: "job", Claimant: "paused-b", Claims: 2})
	checkTask(t, mustGet(t, cb, "p1"), taskWant{Queue: "paused/done", Version: 4, Value: "by B", Claims: 2})

	close(resume)
	waitFor(t, 20*time.Second, "A's outcome", func() bool {
		s := a.Stats()
		return s.Lost+s.Committed+s.Retried+s.DeadLettered+s.Errors > 0
	})
	checkStats(t, a, client.WorkerStats{Claimed: 1, Lost: 1})
	checkStats(t, b, client.WorkerStats{Claimed: 1, Committed: 1})
	if na, nb := aCalls.Load(), bCalls.Load(); na != 1 || nb != 1 {
		t.Errorf("handler calls: A %d, B %d; want 1 each", na, nb)
	}
	// The refusal named A's version as stale.
	errs := logA.errs("commit refused: the task version is gone")
	if len(errs) != 1 {
		t.Fatalf("A logged %d refused commits, want 1", len(errs))
	}
	var dep *client.DependencyError
	if !errors.As(errs[0], &dep) {
		t.Fatalf("A's commit failed with %v, want a *DependencyError", errs[0])
	}
	want := &taskstorepb.RefError{Category: taskstorepb.RefError_DELETE_STALE, Id: "p1", Version: 2, CurrentVersion: 4, Queue: "paused/done"}
	if len(dep.Errors) != 1 || !proto.Equal(dep.Errors[0], want) {
		t.Errorf("refusal lists %v, want just %v", dep.Errors, want)
	}
	// A's refused commit changed nothing.
	checkTask(t, mustGet(t, cb, "p1"), taskWant{Queue: "paused/done", Version: 4, Value: "by B", Claims: 2})
	// Nor did its late write outside: A held token 1, B token 2.
	if r, _ := aWrite.Load().(writeResult); r.err == nil || ext.value("p1") != "by B" {
		t.Errorf("the fenced store took A's late write (err %v), holds %q; want it refused and %q kept", r.err, ext.value("p1"), "by B")
	}
}

type writeResult struct{ err error }

// fencedStore is a system outside the cluster that refuses a write whose
// fencing token is lower than the highest it has seen for the task.
type fencedStore struct {
	mu     sync.Mutex
	tokens map[string]uint32
	values map[string]string
}

func (s *fencedStore) write(id string, token uint32, v string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tokens == nil {
		s.tokens, s.values = map[string]uint32{}, map[string]string{}
	}
	if token < s.tokens[id] {
		return fmt.Errorf("fenced: token %d is older than %d", token, s.tokens[id])
	}
	s.tokens[id], s.values[id] = token, v
	return nil
}

func (s *fencedStore) value(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.values[id]
}

func testWorkerShutdownReleases(t *testing.T, addrs string) {
	c := mustDial(t, addrs)
	const q = "shutdown/in"
	mustInsert(t, c, q, "s1", "job")
	started := make(chan struct{})
	w := newWorker(t, c, []string{q}, func(ctx context.Context, task *client.Task) (client.Result, error) {
		close(started)
		<-ctx.Done()
		return client.Result{}, ctx.Err()
	}, client.WithWorkerClaimant("shutdown-w"))
	stop := runWorker(t, w)
	<-started
	stop()
	checkStats(t, w, client.WorkerStats{Claimed: 1, Released: 1})
	// Released with no attempt counted, and available at once.
	checkTask(t, mustGet(t, c, "s1"), taskWant{Queue: q, Version: 3, Value: "job", Claims: 1})
	resp, err := c.Claim(ctxFor(t, 20*time.Second), &taskstorepb.ClaimRequest{Queues: []string{q}})
	if err != nil || len(resp.Tasks) != 1 || resp.Tasks[0].Id != "s1" {
		t.Fatalf("claim after shutdown: %v, %v; want s1", resp, err)
	}
}

func TestNewWorkerRefusesBadOptions(t *testing.T) {
	c, err := client.Dial(context.Background(), "127.0.0.1:1", client.WithProxyOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := func(context.Context, *client.Task) (client.Result, error) { return client.Result{}, nil }
	for name, tc := range map[string]struct {
		queues []string
		h      client.Handler
		opts   []client.WorkerOption
	}{
		"no queue":        {nil, h, nil},
		"empty queue":     {[]string{""}, h, nil},
		"no handler":      {[]string{"q"}, nil, nil},
		"zero lease":      {[]string{"q"}, h, []client.WorkerOption{client.WithLease(0)}},
		"long lease":      {[]string{"q"}, h, []client.WorkerOption{client.WithLease(25 * time.Hour)}},
		"renewal > lease": {[]string{"q"}, h, []client.WorkerOption{client.WithLease(time.Second), client.WithRenewal(time.Second)}},
		"no concurrency":  {[]string{"q"}, h, []client.WorkerOption{client.WithConcurrency(0)}},
		"no attempts":     {[]string{"q"}, h, []client.WorkerOption{client.WithMaxAttempts(0)}},
		"bad backoff":     {[]string{"q"}, h, []client.WorkerOption{client.WithRetryBackoff(time.Second, time.Millisecond)}},
	} {
		if _, err := client.NewWorker(c, tc.queues, tc.h, tc.opts...); !errors.Is(err, client.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := client.NewWorker(c, []string{"q"}, h, client.WithRenewal(0)); err != nil {
		t.Errorf("renewal off: %v", err)
	}
}

// recordLog keeps every log record, to check what a worker reported.
type recordLog struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordLog) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordLog) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}

func (h *recordLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordLog) WithGroup(string) slog.Handler      { return h }

// errs returns the "err" attributes of the records with message msg.
func (h *recordLog) errs(msg string) []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []error
	for _, r := range h.recs {
		if r.Message != msg {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			if err, ok := a.Value.Any().(error); ok && a.Key == "err" {
				out = append(out, err)
			}
			return true
		})
	}
	return out
}
