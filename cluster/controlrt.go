package cluster

import (
	"context"
	"fmt"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/fsm"
)

// controlRuntime is the node as the control plane sees it
// (control.Runtime): a type of its own, so that the interface's methods
// do not add to Node's.
type controlRuntime struct{ n *Node }

var _ control.Runtime = controlRuntime{}

// Control is the meta leader's control plane: the operator's requests
// (AddNode, RemoveNode, AddShards, RemoveShard, RebalanceSlots, MoveSlots)
// go to it. On a node that does not lead the meta group they return a
// *NotLeaderError for shard 0 that names the leader.
func (n *Node) Control() *control.Controller { return n.ctl }

func (r controlRuntime) Map() *metapb.ClusterMap { return r.n.meta.Map() }

func (r controlRuntime) Leading() error {
	if !r.n.metaLead.ready.Load() {
		return r.n.metaLead.notLeader()
	}
	return nil
}

func (r controlRuntime) Propose(ctx context.Context, cmd *metapb.Command) error {
	return r.n.metaLead.propose(ctx, cmd)
}

func (r controlRuntime) AddMetaVoter(ctx context.Context, id, addr string) error {
	mr := r.n.metaGroup.raft
	return changeConfig(ctx, mr, func(prev uint64) raft.IndexFuture {
		return mr.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), prev, 0)
	})
}

func (r controlRuntime) RemoveMetaVoter(ctx context.Context, id string) error {
	mr := r.n.metaGroup.raft
	return changeConfig(ctx, mr, func(prev uint64) raft.IndexFuture {
		return mr.RemoveServer(raft.ServerID(id), prev, 0)
	})
}

func (r controlRuntime) TransferMetaLeadership(ctx context.Context) error {
	return waitFuture(ctx, r.n.metaGroup.raft.LeadershipTransfer())
}

func (r controlRuntime) Gossiped(id string) (control.Gossiped, bool) {
	g, ok := r.n.gossip.snapshot()[id]
	return control.Gossiped{Address: g.Meta.Address, GossipAddress: g.GossipAddress, HTTPAddress: g.Meta.HTTPAddress}, ok
}

func (r controlRuntime) WakeMover() { r.n.mover.wakeUp() }

// EveryNodeMovesSlots asks each node that is not removed for the highest
// state format its binary knows (this node answers for itself).
func (r controlRuntime) EveryNodeMovesSlots(ctx context.Context, cm *metapb.ClusterMap) error {
	n := r.n
	for _, node := range cm.Nodes {
		if node.Membership == NodeRemoved {
			continue
		}
		var f uint32
		if node.Id == n.cfg.ID {
			f = n.format.max()
		} else if r := n.peerc.report(ctx, node.Address); r != nil && r.Node == node.Id {
			f = r.MaxStateFormat
		} else {
			return fmt.Errorf("%w: node %s does not answer; every node must run a version that moves slots before a move starts", ErrRefused, node.Id)
		}
		if f < fsm.FormatSlotMoves {
			return fmt.Errorf("%w: node %s runs an older version (state format %d; moving slots needs %d): upgrade every node first", ErrRefused, node.Id, f, fsm.FormatSlotMoves)
		}
	}
	return nil
}

// SlotLoad asks each shard's leader how many tasks its slots hold.
func (r controlRuntime) SlotLoad(ctx context.Context, cm *metapb.ClusterMap) map[uint32]uint64 {
	return r.n.shardLeaders().slotLoad(ctx, cm)
}
