package containers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/checker"
	"github.com/e1158ecb/taskstore/testing/workload"
)

// env is what a scenario's fault script works with.
type env struct {
	t  *testing.T
	c  *dockerCluster
	h  *workload.History
	lt *leaderTracker
}

// fault records an injected fault.
func (e *env) fault(format string, args ...any) {
	e.t.Helper()
	e.h.Note(checker.CountFaults, format, args...)
	e.t.Logf("%s fault: %s", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// other is a running, connected node that is none of not, preferring one
// that leads no shard.
func (e *env) other(not ...*container) *container {
	e.t.Helper()
	leads := map[string]bool{}
	if st, err := e.c.Status(); err == nil {
		for _, s := range st.Shards {
			leads[s.Leader] = true
		}
	}
	var best *container
	for _, nd := range e.c.Nodes {
		skip := nd.stopped || nd.disconnected
		for _, x := range not {
			skip = skip || x == nd
		}
		if skip {
			continue
		}
		if !leads[nd.ID] {
			return nd
		}
		if best == nil {
			best = nd
		}
	}
	if best == nil {
		e.t.Fatal("no other node")
	}
	return best
}

type scenario struct {
	name            string
	nodes, replicas int
	faults          func(e *env)
	floor           checker.Floor
}

// floor is the coverage every scenario must reach: the workload's floor of
// the chaos tests, the faults injected, and leader changes, which show the
// faults hit shard leaders.
func floor(extra checker.Floor) checker.Floor {
	f := checker.Floor{
		checker.FloorOps: 300, checker.FloorClaimed: 50, checker.FloorCommits: 50, checker.FloorTxns: 5,
		checker.FloorReads: 10, checker.FloorReclaimed: 1, checker.FloorRefusedTxns: 1,
		checker.FloorStaleCommitAttempts: 2,
	}
	for k, v := range extra {
		f[k] = v
	}
	return f
}

// cut is how long nodes stay disconnected, down how long a killed node
// stays down: at --raft-timeout-scale 2 a follower notices a silent leader
// after 3-6 s and an election may need another 3-6 s (a follower that
// still hears of a leader refuses its vote), so both are long enough for
// a new leader, and for gossip to suspect the node.
const (
	cut    = 15 * time.Second
	down   = 15 * time.Second
	frozen = 12 * time.Second
)

// countMoved counts faults after which the shard's leadership was seen to
// move off the node hit (a higher term, another leader), within the fault.
const countMoved = "fault-leader-moves"

// grace is how much longer than planned a fault stays while a shard it
// hit has not yet been seen to elect another leader. Without a majority
// to spare (3 of 5 voters connected must all agree) split votes can take
// a few election rounds of 3-6 s each; ending the fault first would end
// the run without the leader change it was for.
const grace = 30 * time.Second

// hold keeps the fault for d while watching for each shard of watch to be
// led by another node than the one hit, which led it at term terms[shard];
// it counts countMoved once per shard that moved, and holds up to grace
// longer until every watched shard has moved. It asks the nodes still up
// and connected in turn (Admin.Status on their published ports): the
// proxy's answers come slower while a node is gone, as it tries that node
// first.
func (e *env) hold(d time.Duration, watch map[uint32]*container, terms map[uint32]uint64) {
	e.t.Helper()
	start := time.Now()
	moved := map[uint32]bool{}
	var up []*container
	for _, nd := range e.c.Nodes {
		if !nd.stopped && !nd.disconnected && !nd.paused {
			up = append(up, nd)
		}
	}
	waiting := func() bool {
		since := time.Since(start)
		return since < d || (len(moved) < len(watch) && since < d+grace)
	}
	for i := 0; waiting(); i++ {
		if len(moved) < len(watch) && len(up) > 0 {
			if st, err := e.c.StatusFrom(up[i%len(up)]); err == nil {
				for _, s := range st.Shards {
					from, ok := watch[s.Id]
					if ok && !moved[s.Id] && s.Leader != "" && s.Leader != from.ID && s.Term > terms[s.Id] {
						moved[s.Id] = true
						e.h.Count(countMoved, 1)
						e.t.Logf("shard %d: leadership moved from %s to %s (term %d) %v into the fault", s.Id, from.ID, s.Leader, s.Term, time.Since(start).Round(100*time.Millisecond))
					}
				}
			}
		}
		if time.Since(start) < d {
			time.Sleep(min(250*time.Millisecond, d-time.Since(start)))
		} else {
			time.Sleep(250 * time.Millisecond)
		}
	}
	if held := time.Since(start); held > d+time.Second {
		e.t.Logf("fault held %v instead of %v, until the shards it hit elected another leader", held.Round(100*time.Millisecond), d)
	}
	for shard, from := range watch {
		if !moved[shard] {
			e.t.Logf("shard %d: leadership not seen to move off %s within %v", shard, from.ID, d+grace)
		}
	}
}

var scenarios = []scenario{
	{
		name: "docker3", nodes: 3, replicas: 3,
		faults: func(e *env) {
			shards := e.c.Shards()
			s, k := shards[0], shards[len(shards)-1]
			l, term := e.c.Leader(s)
			e.fault("docker network disconnect %s (leader of shard %d) for %v", l.ID, s, cut)
			e.c.Disconnect(l)
			e.hold(cut, map[uint32]*container{s: l}, map[uint32]uint64{s: term})
			e.fault("docker network connect %s", l.ID)
			e.c.Connect(l)
			time.Sleep(5 * time.Second)
			e.killLeader(k)
			// A frozen leader wakes up believing it still leads, with
			// requests and the new leader's heartbeats arriving together
			// (hashicorp/raft#695).
			p, term := e.c.Leader(s)
			e.fault("docker pause %s (leader of shard %d) for %v", p.ID, s, frozen)
			e.c.Pause(p)
			e.hold(frozen, map[uint32]*container{s: p}, map[uint32]uint64{s: term})
			e.fault("docker unpause %s", p.ID)
			e.c.Unpause(p)
			time.Sleep(5 * time.Second)
		},
		floor: floor(checker.Floor{checker.CountFaults: 6, checker.CountLeaderChanges: 3, countMoved: 3}),
	},
	{
		// Every shard has 5 voters, so the 3 nodes still connected are a
		// majority of each.
		name: "docker5", nodes: 5, replicas: 5,
		faults: func(e *env) {
			shards := e.c.Shards()
			s, k := shards[0], shards[len(shards)-1]
			a, ta := e.c.Leader(s)
			b, tb := e.c.Leader(k)
			watch := map[uint32]*container{s: a, k: b}
			if b == a {
				b = e.other(a)
			}
			e.fault("docker network disconnect %s (leader of shard %d) and %s at once for %v: 3 of 5 nodes stay connected", a.ID, s, b.ID, cut)
			e.c.Disconnect(a)
			e.c.Disconnect(b)
			e.hold(cut, watch, map[uint32]uint64{s: ta, k: tb})
			e.fault("docker network connect %s and %s", a.ID, b.ID)
			e.c.Connect(a)
			e.c.Connect(b)
			time.Sleep(5 * time.Second)
			e.killLeader(k)
		},
		floor: floor(checker.Floor{checker.CountFaults: 4, checker.CountLeaderChanges: 2, countMoved: 3}),
	},
}

// killLeader kills the leader of shard k for `down`, watching that another
// node takes over, then starts it again and lets it catch up.
func (e *env) killLeader(k uint32) {
	v, term := e.c.Leader(k)
	e.fault("docker kill %s (leader of shard %d) for %v", v.ID, k, down)
	e.c.Kill(v)
	e.hold(down, map[uint32]*container{k: v}, map[uint32]uint64{k: term})
	e.fault("docker start %s", v.ID)
	e.c.Start(v)
	time.Sleep(5 * time.Second)
}

// TestContainers runs each scenario on its own cluster of containers: the
// workload through the proxy while nodes are cut off the network and
// killed, then every checker.
func TestContainers(t *testing.T) {
	gate(t)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) { runScenario(t, sc) })
	}
}

func runScenario(t *testing.T, sc scenario) {
	start := time.Now()
	c := startCluster(t, sc.nodes, 2, sc.replicas)
	c.WaitReady(3 * time.Minute)
	t.Logf("cluster ready in %v", time.Since(start).Round(100*time.Millisecond))
	h := workload.NewHistory()
	e := &env{t: t, c: c, h: h, lt: c.TrackLeaders()}
	proxy := c.ProxyAddr()
	dial := func(ctx context.Context) (*client.Client, error) {
		return client.Dial(ctx, proxy, client.WithProxyOnly(), client.WithAttemptTimeout(5*time.Second))
	}
	cfg := workload.Defaults
	cfg.Prefix = sc.name
	wl, err := workload.Start(cfg, h, dial)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wl.Stop)
	time.Sleep(3 * time.Second)
	sc.faults(e)
	c.Restore()
	c.WaitReady(2 * time.Minute)
	time.Sleep(2 * time.Second)
	wl.Stop()
	e.lt.Stop()
	for _, l := range e.lt.Log() {
		t.Logf("leader change: %s", l)
	}
	h.Count(checker.CountLeaderChanges, e.lt.Changes())

	final := readFinal(t, proxy, sc.name)
	in := checker.Input{History: h, Final: final, Floor: sc.floor, LinearizeTimeout: 5 * time.Second, LinearizeBudget: 90 * time.Second}
	note := "replica-digests=stale-listings"
	reps, err := c.ReplicaStates(60 * time.Second)
	if err != nil {
		t.Errorf("replica agreement: %v", err)
		note = "replicas=skipped"
	} else {
		in.Replicas = reps
	}
	// Last, with the nodes stopped: every replica's Raft log, entry by entry.
	logs, err := c.ShardLogs()
	if err != nil {
		t.Errorf("replica logs: %v", err)
	} else {
		in.Logs = logs
	}
	report := checker.Judge(t, sc.name, in, e.lt.Terms(), start, fmt.Sprintf("%s=%d", countMoved, h.Counts()[countMoved]), note)
	if report.OK() {
		selfCheck(t, h, final)
	}
}

// selfCheck shows the checkers fail on this run's data: the real final
// state with one acknowledged task dropped must be reported as lost.
func selfCheck(t *testing.T, h *workload.History, final *workload.Final) {
	t.Helper()
	acked := map[string]bool{}
	for _, op := range h.Ops() {
		if op.Kind == workload.KindInsert && op.Outcome == workload.OK {
			for _, in := range op.Inserts {
				acked[in.ID] = true
			}
		}
	}
	for _, task := range final.Tasks {
		if !acked[task.ID] {
			continue
		}
		if r := checker.All(checker.Input{History: h, Final: final.Without(task.ID)}); !r.Has(checker.NameLost, task.ID) {
			t.Errorf("self-check: acknowledged task %s dropped from the final state not reported as lost: %v", task.ID, r.Violations)
		} else {
			t.Logf("self-check: dropping acknowledged task %s from the final state is reported: %s", task.ID, r.Violations[0])
		}
		return
	}
	t.Errorf("self-check: no acknowledged task present at the end")
}

// readFinal lists every task under prefix through the proxy (linearizable
// reads at the shard leaders), retrying for a minute.
func readFinal(t *testing.T, proxy, prefix string) *workload.Final {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, err := client.Dial(ctx, proxy, client.WithProxyOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for {
		final, err := workload.ReadFinal(ctx, cl, prefix)
		if err == nil {
			return final
		}
		if ctx.Err() != nil {
			t.Fatalf("read final state: %v", err)
		}
		t.Logf("read final state: %v (retrying)", err)
		time.Sleep(time.Second)
	}
}
