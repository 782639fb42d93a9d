package control

import (
	"context"
	"errors"
	"log/slog"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// Runtime is what the controller needs of the node it runs on, the meta
// group's leader: the map, the meta group's log and configuration, what
// gossip and the other nodes say, and the slot mover's wake-up. The node
// implements it; tests implement it over a map.
type Runtime interface {
	// Map returns a copy of the current cluster map.
	Map() *metapb.ClusterMap
	// Leading returns nil when this node leads the meta group (and may
	// propose), else an error that names the leader.
	Leading() error
	// Propose commits a meta command (only on the meta leader).
	Propose(ctx context.Context, cmd *metapb.Command) error
	// AddMetaVoter adds a node to the meta group's Raft configuration.
	AddMetaVoter(ctx context.Context, id, addr string) error
	// RemoveMetaVoter takes a node out of the meta group's Raft
	// configuration.
	RemoveMetaVoter(ctx context.Context, id string) error
	// TransferMetaLeadership hands the meta group's leadership to another
	// voter.
	TransferMetaLeadership(ctx context.Context) error
	// Gossiped is what this node's gossip says of node id, and whether it
	// gossips at all.
	Gossiped(id string) (Gossiped, bool)
	// EveryNodeMovesSlots refuses (ErrRefused) while a node of the map
	// runs a binary that does not know the slot-move ops, or does not
	// answer: its meta replica would stop at them.
	EveryNodeMovesSlots(ctx context.Context, cm *metapb.ClusterMap) error
	// SlotLoad is how many tasks each slot holds, as the shards' leaders
	// answer; a shard that does not answer is left out.
	SlotLoad(ctx context.Context, cm *metapb.ClusterMap) map[uint32]uint64
	// WakeMover makes the slot mover look at the map now.
	WakeMover()
}

// ErrDropIgnored is a drop of a retiring shard that the meta state machine
// ignored: a move still names the shard.
var ErrDropIgnored = errors.New("the drop was ignored: a move still names the shard")

// Controller carries out the planners' steps through a Runtime, one step a
// call: a crash at any point resumes from the map.
type Controller struct {
	rt   Runtime
	self string
	log  *slog.Logger
}

// New returns the controller of the node self.
func New(rt Runtime, self string, log *slog.Logger) *Controller {
	return &Controller{rt: rt, self: self, log: log}
}

// PlaceOnce makes at most one placement change (NextPlacement).
func (c *Controller) PlaceOnce(ctx context.Context) error {
	step := NextPlacement(c.rt.Map(), c.self)
	switch step.Kind {
	case StepSetReplicas:
		plan := step.Shard
		c.log.Info("placement change", "shard", plan.Id, "replicas", plan.Replicas, "preferred_leader", plan.PreferredLeader)
		return c.rt.Propose(ctx, &metapb.Command{Op: metapb.Op_OP_SET_REPLICAS, Shard: plan})
	case StepHandOffMeta:
		// The meta leader drains itself: hand the meta group off first.
		return c.rt.TransferMetaLeadership(ctx)
	case StepRemoveNode:
		// Drained: no replica left in the map; leave the meta group, then
		// record it.
		if err := c.rt.RemoveMetaVoter(ctx, step.Node); err != nil {
			return err
		}
		c.log.Info("node removed", "peer", step.Node)
		return c.rt.Propose(ctx, &metapb.Command{Op: metapb.Op_OP_SET_NODE_STATE, Node: NodeInState(step.Node, removed)})
	}
	return nil
}

// NodeInState is a node record for OP_SET_NODE_STATE: the enum and the
// older free-text name beside it, for older readers.
func NodeInState(id string, s metapb.NodeState) *metapb.Node {
	return &metapb.Node{Id: id, Membership: s, State: StateName(s)}
}

// StateName is the free-text name of a membership state that the map
// carries beside the enum.
func StateName(s metapb.NodeState) string {
	switch s {
	case member:
		return "member"
	case draining:
		return "draining"
	case removed:
		return "removed"
	}
	return ""
}

// MoveOffRetiring records moves for the slots of retiring shards that are
// not moving yet, to the serving shards with the fewest slots.
func (c *Controller) MoveOffRetiring(ctx context.Context) ([]*metapb.SlotMove, error) {
	var out []*metapb.SlotMove
	for to, off := range PlanMoveOffRetiring(c.rt.Map()) {
		moves, err := c.MoveSlots(ctx, off, to)
		out = append(out, moves...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// RetiringWork is the slot mover's chore when no move is under way
// (NextRetiring): move the slots of retiring shards away, and drop a
// retiring shard that serves none. It reports whether it changed anything.
func (c *Controller) RetiringWork(ctx context.Context) (bool, error) {
	switch kind, id := NextRetiring(c.rt.Map()); kind {
	case RetiringMoveOff:
		moves, err := c.MoveOffRetiring(ctx)
		return len(moves) > 0, err
	case RetiringDrop:
		if err := c.rt.Propose(ctx, &metapb.Command{Op: metapb.Op_OP_DROP_SHARD, Shard: &metapb.Shard{Id: id}}); err != nil {
			return false, err
		}
		if FindShard(c.rt.Map(), id) != nil {
			return false, ErrDropIgnored
		}
		c.log.Info("shard removed: it served no slot any more; its replicas retire its group", "shard", id)
		return true, nil
	}
	return false, nil
}
