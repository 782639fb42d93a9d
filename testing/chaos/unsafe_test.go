package chaos_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/checker"
	"github.com/e1158ecb/taskstore/testing/harness"
	"github.com/e1158ecb/taskstore/testing/workload"
)

// TestChaosUnsafe proves the checkers see failures in a real run. There is
// no switch to turn a safety rule of the cluster off (and there must not
// be one), so it breaks the one thing a test controls, how the result is
// observed:
//
//  1. Unsafe read: a follower is cut off while the workload runs, and the
//     final state is read from that follower's own replicas with
//     stale=true (no leader check), as a client trusting a partitioned
//     replica would. The checkers must report lost acknowledged writes.
//  2. The same run read safely (linearizable reads at the leaders) after
//     healing must pass.
//  3. Forged results: the real final state with one acknowledged task
//     dropped, and the real history with one acknowledged commit doubled,
//     must be reported, naming the task.
func TestChaosUnsafe(t *testing.T) {
	gate(t)
	start := time.Now()
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: 2, LogLevel: logLevel()})
	c.WaitReady()
	h := workload.NewHistory()
	e := &env{t: t, c: c, h: h}
	e.lt = c.TrackLeaders()
	var addrs []string
	for _, n := range c.Nodes {
		addrs = append(addrs, n.Addr)
	}
	cfg := workload.Defaults
	cfg.Prefix = "unsafe"
	wl, err := workload.Start(cfg, h, func(ctx context.Context) (*client.Client, error) {
		return client.Dial(ctx, strings.Join(addrs, ","), client.WithAttemptTimeout(5*time.Second))
	})
	if err != nil {
		t.Fatal(err)
	}
	e.sleep(4 * time.Second)
	f := e.follower(c.Shards()[0])
	e.fault("isolate %s, a follower", c.Nodes[f].ID)
	c.Isolate(f)
	e.sleep(5 * time.Second)
	wl.Stop()

	// 1. The unsafe read.
	stale := readStale(t, c.Conn(f), cfg.Prefix)
	unsafe := checker.All(checker.Input{History: h, Final: stale, LinearizeTimeout: 5 * time.Second, LinearizeBudget: 60 * time.Second})
	t.Logf("SUMMARY unsafe-stale-read (expected to fail): %s", unsafe.Summary())
	by := unsafe.ByChecker()
	if by[checker.NameLost] == 0 || by[checker.NameLinearizable] == 0 {
		t.Errorf("reading a partitioned follower's stale state: want lost writes and non-linearizable histories reported, got %v", by)
	}
	for i, v := range unsafe.Violations {
		if i == 5 {
			break
		}
		t.Logf("as expected: %s", v)
	}

	// 2. The safe read.
	c.Network().Heal()
	res := check(t, c, h, cfg.Prefix, nil, e.lt.Terms(), start)
	if !res.report.OK() {
		t.Fatalf("the safe read of the same run failed")
	}

	// 3. Forgeries on the real run.
	var dropped string
	ix := map[string]bool{}
	for _, op := range h.Ops() {
		if op.Kind == workload.KindInsert && op.Outcome == workload.OK {
			ix[op.Inserts[0].ID] = true
		}
	}
	for _, task := range res.final.Tasks {
		if ix[task.ID] {
			dropped = task.ID
			break
		}
	}
	if dropped == "" {
		t.Fatalf("no acknowledged task present at the end to drop")
	}
	lost := checker.All(checker.Input{History: h, Final: res.final.Without(dropped)})
	t.Logf("SUMMARY unsafe-dropped-write (expected to fail): %s", lost.Summary())
	if !lost.Has(checker.NameLost, dropped) {
		t.Errorf("dropped acknowledged task %s not reported as lost: %v", dropped, lost.Violations)
	}
	forged := h.Clone()
	var doubled string
	for _, op := range forged.Ops() {
		if op.Kind == workload.KindCommit && op.Outcome == workload.OK && len(op.Deletes) == 1 {
			twin := *op
			twin.Worker = "forger"
			twin.Start, twin.End = op.Start.Add(time.Millisecond), op.End.Add(time.Millisecond)
			forged.Add(&twin)
			doubled = op.Deletes[0].ID
			break
		}
	}
	if doubled == "" {
		t.Fatalf("no acknowledged delete to double")
	}
	double := checker.All(checker.Input{History: forged, Final: res.final})
	t.Logf("SUMMARY unsafe-double-commit (expected to fail): %s", double.Summary())
	if !double.Has(checker.NameCommits, doubled) || !double.Has(checker.NameLinearizable, doubled) {
		t.Errorf("doubled commit of %s not reported by the commit and linearizability checkers: %v", doubled, double.Violations)
	}
	for _, v := range append(lost.Violations, double.Violations...) {
		t.Logf("as expected: %s", v)
	}
}

// readStale lists every task under prefix from one node's own replicas,
// without any leader check: what a client reading a partitioned replica
// with stale=true sees.
func readStale(t *testing.T, conn *grpc.ClientConn, prefix string) *workload.Final {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts := taskstorepb.NewTaskStoreClient(conn)
	f := &workload.Final{Start: time.Now()}
	qs, err := ts.Queues(ctx, &taskstorepb.QueuesRequest{Prefix: prefix, Stale: true})
	if err != nil {
		t.Fatalf("stale queues: %v", err)
	}
	for _, q := range qs.Queues {
		token := ""
		for {
			resp, err := ts.Tasks(ctx, &taskstorepb.TasksRequest{Queue: q.Name, Stale: true, Limit: 1000, PageToken: token, OmitValues: true})
			if err != nil {
				t.Fatalf("stale list %s: %v", q.Name, err)
			}
			for _, task := range resp.Tasks {
				f.Tasks = append(f.Tasks, workload.FromTask(task))
			}
			if token = resp.NextPageToken; token == "" {
				break
			}
		}
	}
	f.End = time.Now()
	return f
}
