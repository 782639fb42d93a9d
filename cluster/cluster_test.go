package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// raceScale stretches Raft timeouts: -race and two cores make goroutines slow.
const raceScale = 2

// skipShort skips a scenario that takes tens of seconds (many restarts,
// elections or moves) under -short: `make test` is the quick check, and
// `make test-full` (CI) runs it.
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("a long scenario: skipped with -short (make test-full runs it)")
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// dialCluster is a client of c's nodes, closed when the test ends.
func dialCluster(ctx context.Context, t *testing.T, c *harness.Cluster) *client.Client {
	t.Helper()
	cl, err := client.Dial(ctx, strings.Join(c.Endpoints(), ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func insert(t *testing.T, c *harness.Cluster, queue, id, value string) *taskstorepb.Task {
	t.Helper()
	var lastErr error
	for try := 0; try < 50; try++ {
		res, err := c.TaskStore(queue).Modify(ctxT(t, 10*time.Second), &taskstorepb.ModifyRequest{
			Inserts: []*taskstorepb.TaskInsert{{Id: id, Queue: queue, Value: []byte(value)}},
		})
		if err == nil {
			return res.Inserted[0]
		}
		if status.Code(err) == codes.FailedPrecondition && id != "" {
			// A retry of an insert whose first attempt committed.
			got := get(t, c, queue, id)
			if got != nil {
				return got
			}
		}
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("insert %s: %v", id, err)
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("insert %s: %v", id, lastErr)
	return nil
}

var claimSeq atomic.Uint64

// claim claims from queue's shard leader, retrying an unavailable shard with
// the same request id so that a claim whose outcome was unknown (leadership
// lost mid-commit on a starved machine) is answered once, not taken twice.
func claim(t *testing.T, c *harness.Cluster, req *taskstorepb.ClaimRequest) *taskstorepb.ClaimResponse {
	t.Helper()
	req.Request = &taskstorepb.RequestID{ClientId: "cluster-test", Seq: claimSeq.Add(1)}
	var lastErr error
	for try := 0; try < 50; try++ {
		res, err := c.TaskStore(req.Queues[0]).Claim(ctxT(t, 10*time.Second), req)
		if err == nil {
			return res
		}
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("claim %v: %v", req.Queues, err)
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("claim %v: %v", req.Queues, lastErr)
	return nil
}

func get(t *testing.T, c *harness.Cluster, queue, id string) *taskstorepb.Task {
	t.Helper()
	res, err := c.TaskStore(queue).Tasks(ctxT(t, 10*time.Second), &taskstorepb.TasksRequest{Queue: queue, Ids: []string{id}})
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	if len(res.Tasks) == 0 {
		return nil
	}
	return res.Tasks[0]
}

func TestRoutingTransactionsAndGroups(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 4, Scale: raceScale})
	c.WaitReady()
	ctx := ctxT(t, time.Minute)

	// Every node agrees on which shard owns a group, and a node that does not
	// lead it answers Unavailable with the leader's address.
	queue := "mail/outbox"
	shard := c.ShardOf(queue)
	leader := c.Leader(shard)
	for i := range c.Nodes {
		ts := taskstorepb.NewTaskStoreClient(c.Conn(i))
		_, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Id: fmt.Sprintf("r%d", i), Queue: queue}}})
		if i == leader {
			if err != nil {
				t.Fatalf("leader refused: %v", err)
			}
			continue
		}
		st := status.Convert(err)
		if st.Code() != codes.Unavailable {
			t.Fatalf("follower %d: got %v, want Unavailable", i, err)
		}
		var hint *taskstorepb.NotLeader
		for _, d := range st.Details() {
			if nl, ok := d.(*taskstorepb.NotLeader); ok {
				hint = nl
			}
		}
		if hint == nil || hint.Shard != shard || hint.LeaderAddress != c.Nodes[leader].Addr {
			t.Fatalf("follower %d: hint %v, want shard %d at %s", i, hint, shard, c.Nodes[leader].Addr)
		}
	}

	// A transaction across queues of one group is atomic.
	a := insert(t, c, "mail/inbox", "a", "1")
	b := insert(t, c, "mail/sent", "b", "2")
	ts := c.TaskStore("mail/inbox")
	_, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{
		Inserts: []*taskstorepb.TaskInsert{{Id: "c", Queue: "mail/archive"}},
		Changes: []*taskstorepb.TaskChange{{Id: a.Id, Version: a.Version, Queue: "mail/inbox", NewQueue: "mail/archive"}},
		Deletes: []*taskstorepb.TaskRef{{Id: b.Id, Version: b.Version + 1, Queue: "mail/sent"}}, // stale
	})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stale delete: got %v, want FailedPrecondition", err)
	}
	var detail *taskstorepb.ModifyError
	for _, d := range status.Convert(err).Details() {
		if me, ok := d.(*taskstorepb.ModifyError); ok {
			detail = me
		}
	}
	if detail == nil || len(detail.Errors) != 1 || detail.Errors[0].Category != taskstorepb.RefError_DELETE_STALE || detail.Errors[0].Id != "b" {
		t.Fatalf("refusal detail: %v", detail)
	}
	if get(t, c, "mail/archive", "c") != nil || get(t, c, "mail/inbox", "a").Queue != "mail/inbox" {
		t.Fatal("a refused transaction was partly applied")
	}
	res, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{
		Inserts: []*taskstorepb.TaskInsert{{Id: "c", Queue: "mail/archive"}},
		Changes: []*taskstorepb.TaskChange{{Id: a.Id, Version: a.Version, Queue: "mail/inbox", NewQueue: "mail/archive"}},
		Deletes: []*taskstorepb.TaskRef{{Id: b.Id, Version: b.Version, Queue: "mail/sent"}},
	})
	if err != nil {
		t.Fatalf("transaction: %v", err)
	}
	if res.Changed[0].Queue != "mail/archive" || res.Changed[0].Version != a.Version+1 {
		t.Fatalf("changed: %v", res.Changed[0])
	}

	// A transaction over two groups is refused before it reaches any log.
	_, err = ts.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: "mail/x"}, {Queue: "billing/y"}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("cross-group: got %v, want InvalidArgument", err)
	}
	_, err = ts.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"mail/x", "billing/y"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("cross-group claim: got %v, want InvalidArgument", err)
	}
}

func TestWaitingClaimIsWokenByInsert(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	queue := "jobs/w"
	ts := c.TaskStore(queue)
	type result struct {
		res *taskstorepb.ClaimResponse
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		res, err := ts.Claim(context.Background(), &taskstorepb.ClaimRequest{Claimant: "w1", Queues: []string{queue}, Wait: durationpb.New(20 * time.Second)})
		done <- result{res, err, time.Now()}
	}()
	time.Sleep(500 * time.Millisecond)
	inserted := time.Now()
	insert(t, c, queue, "t1", "x")
	r := <-done
	if r.err != nil || len(r.res.Tasks) != 1 || r.res.Tasks[0].Id != "t1" || r.res.Tasks[0].Claimant != "w1" {
		t.Fatalf("claim: %v %v", r.res, r.err)
	}
	if woke := r.at.Sub(inserted); woke > 5*time.Second {
		t.Fatalf("woken %v after the insert: polled, not notified", woke)
	}

	// A wait that finds nothing returns an empty result at its deadline.
	start := time.Now()
	res, err := ts.Claim(ctxT(t, 30*time.Second), &taskstorepb.ClaimRequest{Claimant: "w1", Queues: []string{queue}, Wait: durationpb.New(300 * time.Millisecond)})
	if err != nil || len(res.Tasks) != 0 {
		t.Fatalf("empty wait: %v %v", res, err)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Fatal("returned before the wait ran out")
	}
}

// TestLeaderLossAndRestartKeepAcknowledgedWrites kills a shard's leader while
// inserts stream in, restarts it, and checks every acknowledged insert is
// present exactly once on every replica.
func TestLeaderLossAndRestartKeepAcknowledgedWrites(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	queue := "stream/q"
	shard := c.ShardOf(queue)
	var acked []string
	for i := 0; i < 30; i++ {
		id := fmt.Sprintf("t%03d", i)
		insert(t, c, queue, id, id)
		acked = append(acked, id)
		if i == 10 {
			victim := c.Leader(shard)
			c.Kill(victim)
			defer func(v int) {
				if c.Nodes[v].Server() == nil {
					c.Restart(v)
				}
			}(victim)
			t.Logf("killed leader %s of shard %d", c.Nodes[victim].ID, shard)
		}
		if i == 20 {
			for v := range c.Nodes {
				if c.Nodes[v].Server() == nil {
					c.Restart(v)
				}
			}
		}
	}
	c.WaitReady()
	res, err := c.TaskStore(queue).Tasks(ctxT(t, 10*time.Second), &taskstorepb.TasksRequest{Queue: queue, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, task := range res.Tasks {
		ids = append(ids, task.Id)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, acked) {
		t.Fatalf("after leader loss: have %v, want %v", ids, acked)
	}
	// Every replica converges to the same state.
	waitDigestsAgree(t, c, shard)
}

func waitDigestsAgree(t *testing.T, c *harness.Cluster, shard uint32) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var digests [][32]byte
		var applied []uint64
		for _, n := range c.Nodes {
			if n.Server() == nil {
				continue
			}
			if s := n.Server().Node.Shard(shard); s != nil {
				digests = append(digests, s.Machine().Digest())
				applied = append(applied, s.Machine().AppliedIndex())
			}
		}
		same := len(digests) == len(c.Nodes)
		for _, d := range digests {
			same = same && d == digests[0]
		}
		if same {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas of shard %d disagree (applied %v)", shard, applied)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestLaggingFollowerInstallsSnapshot cuts a follower off while the leader
// writes and compacts its log, then heals: the follower must catch up by
// snapshot and end identical.
func TestLaggingFollowerInstallsSnapshot(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	queue := "snap/q"
	shard := c.ShardOf(queue)
	lag := (c.Leader(shard) + 1) % 3
	var all []string
	for _, n := range c.Nodes {
		all = append(all, n.ID)
	}
	c.Network().Partition([]string{c.Nodes[lag].ID}, all)
	for i := 0; i < 200; i++ {
		insert(t, c, queue, fmt.Sprintf("s%03d", i), "")
	}
	// Force a snapshot and log compaction on the (current) leader.
	lr := c.Nodes[c.Leader(shard)].Server().Node.Shard(shard).Raft()
	if err := lr.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	c.Network().Heal()
	waitDigestsAgree(t, c, shard)
	if n := c.Nodes[lag].Server().Node.Shard(shard).Machine().TaskCount(); n != 200 {
		t.Fatalf("lagging follower has %d tasks, want 200", n)
	}
}

// TestRestartWithData stops the whole cluster and starts it again.
func TestRestartWithData(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	insert(t, c, "keep/q", "k1", "v1")
	for i := range c.Nodes {
		c.Stop(i)
	}
	for i := range c.Nodes {
		c.Restart(i)
	}
	c.WaitReady()
	got := get(t, c, "keep/q", "k1")
	if got == nil || string(got.Value) != "v1" {
		t.Fatalf("after restart: %v", got)
	}
}

// TestJoiningNodeWaitsVisibleInStatus: a node started with --join gossips
// in, shows as waiting, and hosts nothing until an operator adds it.
func TestJoiningNodeWaitsVisibleInStatus(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	c.StartJoining("n4")
	admin := taskstorepb.NewAdminClient(c.Conn(0))
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := admin.Status(ctxT(t, 10*time.Second), &taskstorepb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var n4 *taskstorepb.NodeStatus
		for _, n := range st.Nodes {
			if n.Id == "n4" {
				n4 = n
			}
		}
		if n4 != nil && n4.State == "waiting" && n4.Health == "alive" {
			if len(n4.Shards) != 0 || n4.Address != c.Nodes[3].Addr {
				t.Fatalf("waiting node: %v", n4)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n4 not visible as waiting: %v", st.Nodes)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := len(c.Nodes[3].Server().Node.LocalShards()); got != 0 {
		t.Fatalf("a waiting node hosts %d shards", got)
	}
	// The cluster keeps serving.
	insert(t, c, "join/q", "j1", "x")
}

// TestMetricsReflectTheWork: per-shard and per-group series exist and move.
func TestMetricsReflectTheWork(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	queue := "metrics/q"
	insert(t, c, queue, "m1", "x")
	insert(t, c, queue, "m2", "x")
	claim(t, c, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{queue}})
	// A lease that runs out and is claimed again counts as an expiration.
	claim(t, c, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{queue}, Lease: durationpb.New(100 * time.Millisecond)})
	time.Sleep(300 * time.Millisecond)
	if res := claim(t, c, &taskstorepb.ClaimRequest{Claimant: "w2", Queues: []string{queue}, Limit: 2}); len(res.Tasks) != 1 {
		t.Fatalf("reclaim after the lease ran out: %v", res)
	}
	values := gatherMetrics(t, c)
	shard := fmt.Sprint(c.ShardOf(queue))
	for key, want := range map[string]float64{
		"taskstore_tasks_inserted_total,group=metrics":                                                                 2,
		"taskstore_tasks_claimed_total,group=metrics":                                                                  3,
		"taskstore_lease_expirations_total,group=metrics":                                                              1,
		"taskstore_shard_leader,shard=" + shard:                                                                        1,
		"taskstore_queue_tasks,queue=metrics/q,state=claimed":                                                          2,
		"taskstore_shard_apply_seconds,shard=" + shard:                                                                 3,
		"taskstore_shard_tasks,shard=" + shard:                                                                         2,
		"grpc_server_handled_total,grpc_code=OK,grpc_method=Claim,grpc_service=taskstore.v1.TaskStore,grpc_type=unary": 1,
	} {
		if got, ok := values[key]; !ok || got < want {
			t.Errorf("%s = %v (present %v), want at least %v", key, got, ok, want)
		}
	}
}

// gatherMetrics reads every running node's registry. Counters are summed
// over the nodes and gauges take their largest value, so a leadership
// change mid-test (a starved CI machine) does not matter.
func gatherMetrics(t *testing.T, c *harness.Cluster) map[string]float64 {
	t.Helper()
	values := map[string]float64{}
	for _, n := range c.Nodes {
		if n.Server() == nil {
			continue
		}
		families, err := n.Server().Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			for _, m := range f.Metric {
				key := f.GetName()
				for _, l := range m.Label {
					key += "," + l.GetName() + "=" + l.GetValue()
				}
				switch {
				case m.Counter != nil:
					values[key] += m.Counter.GetValue()
				case m.Gauge != nil:
					values[key] = max(values[key], m.Gauge.GetValue())
				case m.Histogram != nil:
					values[key] = max(values[key], float64(m.Histogram.GetSampleCount()))
				}
			}
		}
	}
	return values
}

// TestRetriesCountOnce sends one insert, and one commit carrying the next
// claim, four times each with the same request id, as a client retrying
// after lost answers does: each is answered four times, but the inserted,
// claimed and committed counters and the rates count it once (a request replayed 3 times was counted 4 times).
func TestRetriesCountOnce(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	const q = "retries/q"
	ts := c.TaskStore(q)
	ins := &taskstorepb.ModifyRequest{Request: &taskstorepb.RequestID{ClientId: "c1", Seq: 1},
		Inserts: []*taskstorepb.TaskInsert{{Id: "a", Queue: q}, {Id: "b", Queue: q}}}
	for range 4 {
		if _, err := ts.Modify(ctxT(t, 10*time.Second), ins); err != nil {
			t.Fatal(err)
		}
	}
	first := claim(t, c, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{q}})
	if len(first.Tasks) != 1 {
		t.Fatalf("claim: %v", first)
	}
	commit := &taskstorepb.ModifyRequest{Request: &taskstorepb.RequestID{ClientId: "c1", Seq: 2}, Claimant: "w",
		Deletes: []*taskstorepb.TaskRef{{Id: first.Tasks[0].Id, Version: first.Tasks[0].Version}},
		Claim:   &taskstorepb.ModifyClaim{Queues: []string{q}}}
	for range 4 {
		res, err := ts.Modify(ctxT(t, 10*time.Second), commit)
		if err != nil || len(res.Claimed) != 1 {
			t.Fatalf("commit and claim: %v %v", res, err)
		}
	}
	values := gatherMetrics(t, c)
	for key, want := range map[string]float64{
		"taskstore_tasks_inserted_total,group=retries":  2,
		"taskstore_tasks_claimed_total,group=retries":   2,
		"taskstore_tasks_committed_total,group=retries": 1,
		"taskstore_tasks_deleted_total,group=retries":   1,
	} {
		if got := values[key]; got != want {
			t.Errorf("%s = %v, want %v", key, got, want)
		}
	}
}

// TestPurgeDeletesOneQueue: purge empties a queue in one command and leaves
// the other queues of its group alone.
func TestPurgeDeletesOneQueue(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	for i := 0; i < 25; i++ {
		insert(t, c, "purge/a", fmt.Sprintf("a%d", i), "")
	}
	insert(t, c, "purge/b", "b0", "")
	res, err := c.TaskStore("purge/a").Purge(ctxT(t, 10*time.Second), &taskstorepb.PurgeRequest{Queue: "purge/a"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 25 {
		t.Fatalf("deleted %d, want 25", res.Deleted)
	}
	if get(t, c, "purge/a", "a3") != nil || get(t, c, "purge/b", "b0") == nil {
		t.Fatal("purge deleted the wrong tasks")
	}
	waitDigestsAgree(t, c, c.ShardOf("purge/a"))
}

// TestRollingRestartKeepsShardsAvailable stops and restarts each node in
// turn (graceful stop: leaderships handed off first) while a client inserts
// through every group; no insert may fail beyond the client's retries.
func TestRollingRestartKeepsShardsAvailable(t *testing.T) {
	skipShort(t)
	c := harness.Start(t, 3, harness.Options{Shards: 3, Scale: raceScale})
	c.WaitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl := dialCluster(ctx, t, c)
	stop := make(chan struct{})
	errs := make(chan error, 1)
	var n int
	go func() {
		defer close(errs)
		for i := 0; ; i++ {
			select {
			case <-stop:
				n = i
				return
			default:
			}
			cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := cl.Insert(cctx, fmt.Sprintf("roll%d/q", i%6), nil, client.WithID(fmt.Sprintf("r%d", i)))
			ccancel()
			if err != nil {
				errs <- fmt.Errorf("insert %d: %w", i, err)
				return
			}
		}
	}()
	for i := range c.Nodes {
		time.Sleep(time.Second)
		c.Stop(i)
		time.Sleep(time.Second)
		c.Restart(i)
		c.WaitReady()
	}
	close(stop)
	if err := <-errs; err != nil {
		t.Fatalf("during the rolling restart: %v", err)
	}
	if n < 20 {
		t.Fatalf("only %d inserts during the restart: the load did not run", n)
	}
	t.Logf("%d inserts, none failed, through a rolling restart", n)
}

// TestMetricsFoldQueuesWithoutReadingThem: past MaxQueueSeries queues a
// node's series sum the rest as "<group>/*", with counts and no age; the
// oldest available task is read for the queues with their own series only
// (a scrape of 100,000 queues on disk read all of them: 6-8 s of CPU).
func TestMetricsFoldQueuesWithoutReadingThem(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	n := cluster.MaxQueueSeries + 20
	req := &taskstorepb.ModifyRequest{}
	for i := range n {
		req.Inserts = append(req.Inserts, &taskstorepb.TaskInsert{Queue: fmt.Sprintf("fold/q%04d", i), Value: []byte("x")})
	}
	if _, err := c.TaskStore("fold/q0000").Modify(ctxT(t, 10*time.Second), req); err != nil {
		t.Fatal(err)
	}
	values := gatherMetrics(t, c)
	ages, own := 0, 0
	for key := range values {
		if strings.HasPrefix(key, "taskstore_queue_oldest_available_seconds,") {
			ages++
		}
		if strings.HasPrefix(key, "taskstore_queue_tasks,queue=fold/q") && strings.HasSuffix(key, "state=available") {
			own++
		}
	}
	if ages == 0 || ages > cluster.MaxQueueSeries || ages != own {
		t.Errorf("%d age series and %d queues with their own series; want as many, at most %d", ages, own, cluster.MaxQueueSeries)
	}
	if got := values["taskstore_queue_tasks,queue=fold/*,state=available"]; got < 20 {
		t.Errorf("fold/* available = %v, want the %d queues past the cap", got, n-own)
	}
	if _, ok := values["taskstore_queue_oldest_available_seconds,queue=fold/*"]; ok {
		t.Error("fold/* has an age: the scrape read the queues it folds")
	}
}
