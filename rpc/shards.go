package rpc

import (
	"context"
	"time"

	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// Shard is what the task API (TaskStore) needs of one shard: propose a
// command, claim with a wait, read the state machine, and the shard's time.
// *cluster.Shard is the real one; client/clienttest serves the same API
// over in-process state machines through it, so that the fake and a node
// share every rule from request to answer.
type Shard interface {
	ID() uint32
	// Now is the time a command proposed now carries (the leader's clock,
	// never behind the machine's).
	Now() int64
	IsLeader() bool
	Propose(ctx context.Context, cmd *fsmpb.Command) (*fsmpb.Result, error)
	// Claim claims (an OP_CLAIM, proposed only when it may take a task:
	// an empty answer costs no log entry) and, while it claims nothing,
	// tries again as tasks become available, for up to wait.
	Claim(ctx context.Context, cmd *fsmpb.Command, wait time.Duration) (*fsmpb.Result, error)
	// Read runs fn on the shard's machine; linearizable unless stale.
	Read(ctx context.Context, stale bool, fn func(*fsm.Machine) error) error
}

// Shards finds the shards a request addresses. Errors are the cluster's
// (*cluster.NotLeaderError and the like), which toStatus maps.
type Shards interface {
	ShardFor(group string) (Shard, error)
	ShardByID(id uint32) (Shard, error)
	// LocalShards are the shards this server can read.
	LocalShards() []Shard
	// Clock is the server's time (TaskStore.Time).
	Clock() time.Time
}

// nodeShards is a node's shards.
type nodeShards struct{ n *cluster.Node }

func (ns nodeShards) ShardFor(group string) (Shard, error) {
	s, err := ns.n.ShardFor(group)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (ns nodeShards) ShardByID(id uint32) (Shard, error) {
	s, err := ns.n.ShardByID(id)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (ns nodeShards) LocalShards() []Shard {
	local := ns.n.LocalShards()
	out := make([]Shard, len(local))
	for i, s := range local {
		out[i] = s
	}
	return out
}

func (ns nodeShards) Clock() time.Time { return ns.n.Clock() }

// SlotTable implements slotTabler.
func (ns nodeShards) SlotTable() []uint32 { return ns.n.SlotTable() }

// slotTabler is a Shards that knows the routing table (slot -> shard): a
// node's does; the in-process fakes of client/clienttest have no slots.
type slotTabler interface{ SlotTable() []uint32 }
