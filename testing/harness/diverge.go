package harness

import (
	"context"
	"time"

	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// Helpers for the run-time divergence checks: make one replica's
// state differ, force a checkpoint, run the comparison.

// Diverge applies cmd to node i's replica of a shard directly, bypassing
// Raft, as a replica that applied a different entry would have (cmd.Now
// defaults to the machine's clock, so no checkpoint is taken by it).
func (c *Cluster) Diverge(i int, shard uint32, cmd *fsmpb.Command) {
	c.t.Helper()
	n := c.Nodes[i]
	if n.srv == nil {
		c.t.Fatalf("%s is not running", n.ID)
	}
	s := n.srv.Node.Shard(shard)
	if s == nil {
		c.t.Fatalf("%s hosts no replica of shard %d", n.ID, shard)
	}
	m := s.Machine()
	if cmd.Now == 0 {
		cmd.Now = m.Clock()
	}
	m.ApplyCommand(m.AppliedIndex(), cmd)
}

// ForceCheckpoint commits, through the shard's leader, a tick one
// checkpoint period past the machine's clock, so every replica checkpoints
// at its index, and waits until every running replica listed its digest.
// It returns the index. Log time then runs a minute ahead of the wall
// clock, which nothing in a test minds (leader stamps never go backwards).
func (c *Cluster) ForceCheckpoint(shard uint32) uint64 {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var index uint64
	for index == 0 {
		if time.Now().After(deadline) {
			c.t.Fatalf("could not commit a checkpoint tick on shard %d", shard)
		}
		l := c.Leader(shard)
		s := c.Nodes[l].srv.Node.Shard(shard)
		if s == nil || !s.IsLeader() {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		data, err := fsm.EncodeCommand(&fsmpb.Command{Op: fsmpb.Op_OP_TICK, Now: s.Now() + fsm.CheckpointEvery})
		if err != nil {
			c.t.Fatal(err)
		}
		f := s.Raft().Apply(data, 5*time.Second)
		if f.Error() != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		index = f.Index()
	}
	for _, n := range c.Nodes {
		if n.srv == nil {
			continue
		}
		for {
			s := n.srv.Node.Shard(shard)
			if s == nil {
				break // not hosted, or stopped
			}
			if hasCheckpoint(s.Machine().Checkpoints(), index) {
				break
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("%s has no checkpoint at %d of shard %d", n.ID, index, shard)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return index
}

func hasCheckpoint(cps []fsm.Checkpoint, index uint64) bool {
	for _, cp := range cps {
		if cp.Index == index {
			return true
		}
	}
	return false
}

// CheckReplicas runs the checkpoint comparison once on every running node.
func (c *Cluster) CheckReplicas() {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, n := range c.Nodes {
		if n.srv != nil {
			n.srv.Node.CheckReplicas(ctx)
		}
	}
}
