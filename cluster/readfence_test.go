package cluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestReadFenceBelongsToItsTerm makes a shard leader step down and win
// again while its leadership watcher is stalled, as when LeaderCh drops the
// "lost" signal: until the watcher has run the new term's barrier, the
// replica must not count as ready, or a linearizable read in the new term
// could miss writes another leader committed in between. With a plain
// ready flag, the flag of the earlier term stayed set.
func TestReadFenceBelongsToItsTerm(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	const shard = 1
	insert(t, c, "fence/q", "before", "v")
	a := c.Leader(shard)
	if a < 0 {
		t.Fatal("no leader")
	}
	b := (a + 1) % len(c.Nodes)
	s := c.Nodes[a].Server().Node.Shard(shard)
	firstTerm := s.Raft().CurrentTerm()

	release := s.HoldLeadershipWatch()
	defer func() {
		if release != nil {
			release()
		}
	}()
	if err := c.TransferLeader(shard, b); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return c.Leader(shard) == b })
	insert(t, c, "fence/q", "between", "v") // committed by b, in b's term
	if err := c.TransferLeader(shard, a); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.Raft().State() == raft.Leader })
	if term := s.Raft().CurrentTerm(); term <= firstTerm {
		t.Fatalf("term %d, want past %d", term, firstTerm)
	}
	if s.IsLeader() {
		t.Fatal("the replica counts as ready in a term whose barrier has not run")
	}
	if err := s.ReadBarrier(ctxT(t, 5*time.Second)); err == nil {
		t.Fatal("ReadBarrier passed in a term whose barrier has not run")
	}
	release()
	release = nil
	waitFor(t, s.IsLeader)
}

// TestProposeKeepsItsCauses cuts a shard leader off from its followers and
// proposes with a short deadline: the error says the outcome is unknown
// and keeps the cause for errors.Is (it was formatted with %v, so
// errors.Is(err, context.DeadlineExceeded) failed).
func TestProposeKeepsItsCauses(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	const shard = 1
	insert(t, c, "causes/q", "before", "v")
	a := c.Leader(shard)
	if a < 0 {
		t.Fatal("no leader")
	}
	s := c.Nodes[a].Server().Node.Shard(shard)
	c.Isolate(a)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := s.Propose(ctx, &fsmpb.Command{Op: fsmpb.Op_OP_TICK})
	if !errors.Is(err, cluster.ErrUnknownOutcome) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Propose = %v; want it to wrap both ErrUnknownOutcome and context.DeadlineExceeded", err)
	}
}
