package cluster

import (
	"context"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// controlRuntime is the node as the control plane sees it
// (control.Runtime): a type of its own, so that the interface's methods
// do not add to Node's.
type controlRuntime struct{ n *Node }

var _ control.Runtime = controlRuntime{}

func (r controlRuntime) Map() *metapb.ClusterMap { return r.n.meta.Map() }

func (r controlRuntime) Propose(ctx context.Context, cmd *metapb.Command) error {
	return r.n.proposeMeta(ctx, cmd)
}

func (r controlRuntime) RemoveMetaVoter(ctx context.Context, id string) error {
	mr := r.n.metaGroup.raft
	return r.n.changeConfig(ctx, mr, func(prev uint64) raft.IndexFuture {
		return mr.RemoveServer(raft.ServerID(id), prev, 0)
	})
}

func (r controlRuntime) TransferMetaLeadership(ctx context.Context) error {
	return waitFuture(ctx, r.n.metaGroup.raft.LeadershipTransfer())
}

func (r controlRuntime) MoveSlots(ctx context.Context, slots []uint32, to uint32) ([]*metapb.SlotMove, error) {
	return r.n.MoveSlots(ctx, slots, to)
}
