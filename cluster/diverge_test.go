package cluster_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// gauge reads one series of a node's registry (-1: absent).
func gauge(t *testing.T, c *harness.Cluster, i int, name, shard string) float64 {
	t.Helper()
	families, err := c.Nodes[i].Server().Registry.Gather()
	if err != nil {
		t.Fatalf("%s: gather metrics: %v", c.Nodes[i].ID, err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "shard" && l.GetValue() == shard {
					return m.Gauge.GetValue()
				}
			}
		}
	}
	return -1
}

// replicaRole is node's role for a shard in a cluster-wide Status asked of
// node asker ("" if it is not listed).
func replicaRole(t *testing.T, c *harness.Cluster, asker int, shard uint32, node string) *taskstorepb.ReplicaStatus {
	t.Helper()
	st, err := taskstorepb.NewAdminClient(c.Conn(asker)).Status(ctxT(t, 10*time.Second), &taskstorepb.StatusRequest{})
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	for _, s := range st.Shards {
		if s.Id != shard {
			continue
		}
		for _, rs := range s.ReplicaStatus {
			if rs.Node == node {
				return rs
			}
		}
	}
	return nil
}

// refuses checks that node i answers neither a write, nor a linearizable
// or stale read of the shard, but points elsewhere.
func refuses(t *testing.T, c *harness.Cluster, i int, shard uint32, queue string) {
	t.Helper()
	ts := taskstorepb.NewTaskStoreClient(c.Conn(i))
	_, err := ts.Modify(ctxT(t, 10*time.Second), &taskstorepb.ModifyRequest{
		Inserts: []*taskstorepb.TaskInsert{{Queue: queue, Value: []byte("must not land")}}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("%s accepted a write for diverged shard %d: %v", c.Nodes[i].ID, shard, err)
	}
	for _, stale := range []bool{false, true} {
		_, err := ts.Tasks(ctxT(t, 10*time.Second), &taskstorepb.TasksRequest{Shard: shard, Queue: queue, Stale: stale})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("%s answered a read (stale=%v) of diverged shard %d: %v", c.Nodes[i].ID, stale, shard, err)
		}
		// It names the replica it points at (not "leader is <blank> at").
		if m := status.Convert(err).Message(); !strings.Contains(m, "diverged") || strings.Contains(m, "  ") {
			t.Fatalf("%s refuses diverged shard %d with %q", c.Nodes[i].ID, shard, m)
		}
		for _, d := range status.Convert(err).Details() {
			if nl, ok := d.(*taskstorepb.NotLeader); ok && nl.LeaderAddress == c.Nodes[i].Addr {
				t.Fatalf("%s points clients at itself for its diverged shard", c.Nodes[i].ID)
			}
		}
	}
}

// TestDivergedReplicaStopsAndIsRebuilt makes one follower's state differ
// from the others' (an entry applied to its machine alone, which is what a
// divergence looks like), lets a checkpoint pass and runs the comparison:
// that replica must stop serving and voting, say so in status and metrics,
// stay stopped across a restart, and come back identical after a rebuild,
// while the other two serve throughout.
func TestDivergedReplicaStopsAndIsRebuilt(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	queue := "div/q"
	shard := c.ShardOf(queue)
	label := fmt.Sprint(shard)
	for i := 0; i < 5; i++ {
		insert(t, c, queue, fmt.Sprintf("d%d", i), "x")
	}
	leader := c.Leader(shard)
	bad := (leader + 1) % 3
	badID := c.Nodes[bad].ID

	// Before any divergence, replicas agree and nobody stops.
	c.ForceCheckpoint(shard)
	c.CheckReplicas()
	for i := range c.Nodes {
		if d := c.Nodes[i].Server().Node.Diverged(shard); d != nil {
			t.Fatalf("%s diverged before anything differed: %v", c.Nodes[i].ID, d)
		}
	}

	c.Diverge(bad, shard, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: &fsmpb.Modify{Group: "div",
		Inserts: []*fsmpb.Insert{{Id: "intruder", Queue: queue, Value: []byte("only here")}}}})
	index := c.ForceCheckpoint(shard)
	c.CheckReplicas()

	node := c.Nodes[bad].Server().Node
	d := node.Diverged(shard)
	if d == nil {
		t.Fatalf("%s applied an entry the others did not, and is not marked diverged", badID)
	}
	if d.Index != index || slices.Contains(d.Majority, badID) || len(d.Majority) != 2 || string(d.Digest) == string(d.MajorityDigest) {
		t.Fatalf("divergence %v, want index %d and the two other nodes as the majority", d, index)
	}
	for i := range c.Nodes {
		if i != bad && c.Nodes[i].Server().Node.Diverged(shard) != nil {
			t.Fatalf("healthy %s was marked diverged", c.Nodes[i].ID)
		}
	}
	if node.Shard(shard) != nil {
		t.Fatalf("%s still runs its diverged replica", badID)
	}
	if _, err := node.ShardByID(shard); err == nil {
		t.Fatalf("%s still hands out its diverged replica", badID)
	}
	refuses(t, c, bad, shard, queue)
	// The other two keep serving, whichever of them leads.
	insert(t, c, queue, "after", "x")
	if got := get(t, c, queue, "intruder"); got != nil {
		t.Fatalf("the healthy replicas serve the diverged replica's task: %v", got)
	}
	if v := gauge(t, c, bad, "taskstore_shard_diverged", label); v != 1 {
		t.Fatalf("taskstore_shard_diverged on %s = %v, want 1", badID, v)
	}
	if v := gauge(t, c, (bad+1)%3, "taskstore_shard_diverged", label); v != 0 {
		t.Fatalf("taskstore_shard_diverged on a healthy node = %v, want 0", v)
	}
	for asker := range c.Nodes {
		if rs := replicaRole(t, c, asker, shard, badID); rs.GetRole() != cluster.RoleDiverged || rs.GetDivergence().GetIndex() != index {
			t.Fatalf("status asked of %s shows %s as %v, want diverged at %d", c.Nodes[asker].ID, badID, rs, index)
		}
	}

	// A restart does not bring it back.
	c.Kill(bad)
	c.Restart(bad)
	node = c.Nodes[bad].Server().Node
	time.Sleep(time.Second) // let reconciliation run: it must not reopen the shard
	if node.Shard(shard) != nil || node.Diverged(shard) == nil {
		t.Fatalf("%s serves its diverged replica again after a restart", badID)
	}
	refuses(t, c, bad, shard, queue)
	if v := gauge(t, c, bad, "taskstore_shard_diverged", label); v != 1 {
		t.Fatalf("taskstore_shard_diverged after restart = %v, want 1", v)
	}

	// Rebuild, asked of the diverged node itself: it finds the leader.
	admin := taskstorepb.NewAdminClient(c.Conn(bad))
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := admin.RebuildReplica(ctxT(t, 20*time.Second), &taskstorepb.RebuildReplicaRequest{Shard: shard, Node: badID})
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("rebuild: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitDigestsAgree(t, c, shard)
	deadline = time.Now().Add(60 * time.Second)
	for {
		rs := replicaRole(t, c, (bad+1)%3, shard, badID)
		if rs.GetRole() == "follower" || rs.GetRole() == "leader" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rebuilt replica is %v, want a voter again", rs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if node.Diverged(shard) != nil {
		t.Fatal("still marked diverged after the rebuild")
	}
	if v := gauge(t, c, bad, "taskstore_shard_diverged", label); v != 0 {
		t.Fatalf("taskstore_shard_diverged after rebuild = %v, want 0", v)
	}
	// It serves again: a stale read of its own copy.
	res, err := taskstorepb.NewTaskStoreClient(c.Conn(bad)).Tasks(ctxT(t, 10*time.Second), &taskstorepb.TasksRequest{Shard: shard, Queue: queue, Stale: true})
	if err != nil {
		t.Fatalf("rebuilt replica does not serve: %v", err)
	}
	if len(res.Tasks) != 6 {
		t.Fatalf("rebuilt replica holds %d tasks, want 6", len(res.Tasks))
	}
	// And the next checkpoint finds everyone in agreement.
	c.ForceCheckpoint(shard)
	c.CheckReplicas()
	for i := range c.Nodes {
		if d := c.Nodes[i].Server().Node.Diverged(shard); d != nil {
			t.Fatalf("%s diverged after the rebuild: %v", c.Nodes[i].ID, d)
		}
	}
}

// TestRebuildRefusesAHealthyReplica: rebuilding costs a copy of the shard
// and a vote while it catches up, so only a diverged replica is rebuilt.
func TestRebuildRefusesAHealthyReplica(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	_, err := taskstorepb.NewAdminClient(c.Conn(0)).RebuildReplica(ctxT(t, 10*time.Second),
		&taskstorepb.RebuildReplicaRequest{Shard: 1, Node: c.Nodes[(c.Leader(1)+1)%3].ID})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("rebuild of a healthy replica: %v, want FailedPrecondition", err)
	}
	_, err = taskstorepb.NewAdminClient(c.Conn(0)).RebuildReplica(ctxT(t, 10*time.Second),
		&taskstorepb.RebuildReplicaRequest{Shard: 1, Node: c.Nodes[0].ID, Wipe: true})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("wipe asked by a client: %v, want InvalidArgument", err)
	}
}

// TestHealthyReplicasNeverDiverge runs inserts and claims on every shard
// while checkpoints pass and every node compares, again and again: no
// replica may be marked diverged, and no disagreement reported.
func TestHealthyReplicasNeverDiverge(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			queue := fmt.Sprintf("g%d/q", w)
			for i := 0; !stop.Load(); i++ {
				ctx := ctxT(t, 5*time.Second)
				ts := c.TaskStore(queue)
				_, _ = ts.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: queue, Value: []byte(fmt.Sprint(i))}}})
				if i%3 == 0 {
					_, _ = ts.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{queue}, Limit: 2})
				}
			}
		}(w)
	}
	for round := 0; round < 4; round++ {
		for _, sh := range []uint32{1, 2} {
			c.ForceCheckpoint(sh)
		}
		c.CheckReplicas()
		time.Sleep(200 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	for _, sh := range []uint32{1, 2} {
		idx := c.ForceCheckpoint(sh)
		c.CheckReplicas()
		// Every replica checkpointed the same digest at the same index.
		var digests [][32]byte
		for _, n := range c.Nodes {
			for _, cp := range n.Server().Node.Shard(sh).Machine().Checkpoints() {
				if cp.Index == idx {
					digests = append(digests, cp.Digest)
				}
			}
		}
		if len(digests) != 3 || digests[0] != digests[1] || digests[1] != digests[2] {
			t.Fatalf("shard %d checkpoint at %d: %d digests, not all equal", sh, idx, len(digests))
		}
	}
	for i, n := range c.Nodes {
		for _, sh := range []uint32{1, 2} {
			if d := n.Server().Node.Diverged(sh); d != nil {
				t.Fatalf("%s marked healthy shard %d diverged: %v", n.ID, sh, d)
			}
			if v := gauge(t, c, i, "taskstore_shard_replicas_disagree", fmt.Sprint(sh)); v != 0 {
				t.Fatalf("%s reports shard %d replicas disagree", n.ID, sh)
			}
			if rs := replicaRole(t, c, i, sh, n.ID); rs.GetDisagreement() != "" || len(rs.GetCheckpoints()) == 0 {
				t.Fatalf("%s's status of shard %d: %v", n.ID, sh, rs)
			}
		}
	}
}

// TestIdleShardTicks: a leader whose machine clock stood still proposes a
// tick, which moves the clock to the leader's time; a busy one does not.
func TestIdleShardTicks(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	s := c.Nodes[c.Leader(1)].Server().Node.Shard(1)
	before := s.Machine().AppliedIndex()
	ticked, err := s.TickIfIdle(ctxT(t, 10*time.Second), 0)
	if err != nil || !ticked {
		t.Fatalf("tick on an idle leader: %v %v", ticked, err)
	}
	if s.Machine().AppliedIndex() <= before {
		t.Fatal("the tick was not applied")
	}
	if ticked, err := s.TickIfIdle(ctxT(t, 10*time.Second), time.Minute/2); err != nil || ticked {
		t.Fatalf("ticked a shard whose clock just moved: %v %v", ticked, err)
	}
	follower := c.Nodes[(c.Leader(1)+1)%3].Server().Node.Shard(1)
	if ticked, err := follower.TickIfIdle(ctxT(t, 10*time.Second), 0); err != nil || ticked {
		t.Fatalf("a follower ticked: %v %v", ticked, err)
	}
}

// TestDivergedLeaderStepsDown: in the recorded divergence
// (testing/checker/testdata/replica-divergence) the replica that diverged was
// the shard's leader. It judges itself like any replica: it hands off
// leadership and stops, and the other two go on serving.
func TestDivergedLeaderStepsDown(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	queue := "divl/q"
	shard := c.ShardOf(queue)
	insert(t, c, queue, "a", "x")
	bad := c.Leader(shard)
	c.Diverge(bad, shard, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: &fsmpb.Modify{Group: "divl",
		Inserts: []*fsmpb.Insert{{Id: "intruder", Queue: queue}}}})
	c.ForceCheckpoint(shard)
	c.CheckReplicas()
	if c.Nodes[bad].Server().Node.Diverged(shard) == nil {
		t.Fatalf("diverged leader %s did not stop", c.Nodes[bad].ID)
	}
	refuses(t, c, bad, shard, queue)
	insert(t, c, queue, "b", "x")
	if l := c.Leader(shard); l == bad || l < 0 {
		t.Fatalf("shard led by %d after its diverged leader %d stopped", l, bad)
	}
	if got := get(t, c, queue, "intruder"); got != nil {
		t.Fatalf("the healthy replicas serve the diverged leader's task: %v", got)
	}
}
