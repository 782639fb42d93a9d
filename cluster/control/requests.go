package control

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// The operator's requests: each validates against the map, records its
// change through Runtime.Propose and answers from the map as it stands
// after. Only the meta leader carries them out; on any other node they
// return Runtime.Leading's error (which names the leader). Package cluster
// re-exports these errors, and the rpc edge maps them to gRPC codes.

// ErrInvalidRequest: a request that can never succeed as given.
var ErrInvalidRequest = errors.New("invalid request")

// ErrRefused: the request is valid but the cluster's state forbids it now
// (e.g. a removal that would leave too few replicas).
var ErrRefused = errors.New("refused")

// NotFoundError: a named node or shard does not exist.
type NotFoundError struct{ What, Name string }

func (e *NotFoundError) Error() string { return fmt.Sprintf("%s %q not found", e.What, e.Name) }

// maxShardsAtOnce bounds one AddShards request.
const maxShardsAtOnce = 64

// Gossiped is what gossip says of a node: the addresses it announces.
type Gossiped struct {
	Address, GossipAddress, HTTPAddress string
}

// MoveSlots records moves of slots to shard to (one per slot not already
// there) and returns them; the slot mover runs them. Every node must run a
// version that moves slots.
func (c *Controller) MoveSlots(ctx context.Context, slots []uint32, to uint32) ([]*metapb.SlotMove, error) {
	if err := c.rt.Leading(); err != nil {
		return nil, err
	}
	cm := c.rt.Map()
	if sh := FindShard(cm, to); sh == nil {
		return nil, &NotFoundError{What: "shard", Name: fmt.Sprint(to)}
	} else if sh.Retiring {
		return nil, fmt.Errorf("%w: shard %d is being removed: move slots to another shard", ErrRefused, to)
	}
	if len(slots) == 0 {
		return nil, fmt.Errorf("%w: name at least one slot", ErrInvalidRequest)
	}
	for _, s := range slots {
		if int(s) >= len(cm.Slots) {
			return nil, fmt.Errorf("%w: slot %d: the table has slots 0 to %d", ErrInvalidRequest, s, len(cm.Slots)-1)
		}
	}
	if err := c.rt.EveryNodeMovesSlots(ctx, cm); err != nil {
		return nil, err
	}
	// One entry records every move (a rebalance records hundreds).
	cmd := &metapb.Command{Op: metapb.Op_OP_MOVE_BEGIN}
	for _, s := range slots {
		if mv := MoveOfSlot(cm, s); mv != nil {
			if mv.To != to {
				return nil, fmt.Errorf("%w: slot %d is moving to shard %d already (move %d); wait for it to finish", ErrRefused, s, mv.To, mv.Id)
			}
			continue
		}
		if cm.Slots[s] != to {
			cmd.Moves = append(cmd.Moves, &metapb.SlotMove{Slot: s, From: cm.Slots[s], To: to, Begun: cm.Epoch})
		}
	}
	if len(cmd.Moves) > 0 {
		if err := c.rt.Propose(ctx, cmd); err != nil {
			return nil, err
		}
	}
	var out []*metapb.SlotMove
	cm = c.rt.Map()
	for _, s := range slots {
		mv := MoveOfSlot(cm, s)
		switch {
		case mv != nil && mv.To == to:
			out = append(out, mv)
		case mv == nil && cm.Slots[s] == to:
			// There already (or moved meanwhile).
		default:
			return out, fmt.Errorf("%w: the move of slot %d was not recorded (the map changed meanwhile); try again", ErrRefused, s)
		}
	}
	if len(cmd.Moves) > 0 && len(out) > 0 {
		c.log.Info("slot moves recorded", "moves", len(cmd.Moves), "to", to, "first", out[0].Id)
	}
	c.rt.WakeMover()
	return out, nil
}

// AddShards adds count shards, or with total > 0 as many as it takes to
// have total (a retry adds none twice). Each is placed by PlanNewShard; a
// new shard serves nothing until slots move to it.
func (c *Controller) AddShards(ctx context.Context, count, total int) ([]*metapb.Shard, error) {
	if err := c.rt.Leading(); err != nil {
		return nil, err
	}
	cm := c.rt.Map()
	if total > 0 {
		count = total - len(cm.Shards)
		if count <= 0 {
			return nil, nil
		}
	}
	if count <= 0 || count > maxShardsAtOnce {
		return nil, fmt.Errorf("%w: add 1 to %d shards at a time, not %d", ErrInvalidRequest, maxShardsAtOnce, count)
	}
	if err := c.rt.EveryNodeMovesSlots(ctx, cm); err != nil {
		return nil, err
	}
	var out []*metapb.Shard
	for range count {
		sh := PlanNewShard(c.rt.Map())
		if sh == nil {
			return out, fmt.Errorf("%w: no member node to place a shard's replicas on", ErrRefused)
		}
		if err := c.rt.Propose(ctx, &metapb.Command{Op: metapb.Op_OP_ADD_SHARD, Shard: sh}); err != nil {
			return out, err
		}
		if FindShard(c.rt.Map(), sh.Id) == nil {
			return out, fmt.Errorf("%w: shard %d was not added (the map changed meanwhile); try again", ErrRefused, sh.Id)
		}
		c.log.Info("shard added: it serves no slot until slots move to it", "shard", sh.Id, "replicas", sh.Replicas, "preferred_leader", sh.PreferredLeader)
		out = append(out, sh)
	}
	return out, nil
}

// RemoveShard marks a shard retiring and moves its slots to the others;
// the slot mover drops it from the map once it serves no slot
// (RetiringWork).
func (c *Controller) RemoveShard(ctx context.Context, id uint32) ([]*metapb.SlotMove, error) {
	if err := c.rt.Leading(); err != nil {
		return nil, err
	}
	cm := c.rt.Map()
	sh := FindShard(cm, id)
	if sh == nil {
		return nil, &NotFoundError{What: "shard", Name: fmt.Sprint(id)}
	}
	if err := c.rt.EveryNodeMovesSlots(ctx, cm); err != nil {
		return nil, err
	}
	if !sh.Retiring {
		if err := c.rt.Propose(ctx, &metapb.Command{Op: metapb.Op_OP_RETIRE_SHARD, Shard: &metapb.Shard{Id: id}}); err != nil {
			return nil, err
		}
		if sh = FindShard(c.rt.Map(), id); sh == nil || !sh.Retiring {
			return nil, fmt.Errorf("%w: shard %d is the last one serving slots; add another first", ErrRefused, id)
		}
		c.log.Info("shard retiring: its slots move to the other shards, then its group is removed", "shard", id)
	}
	moves, err := c.MoveOffRetiring(ctx)
	c.rt.WakeMover()
	return moves, err
}

// RebalanceSlots records (or with dryRun only plans) the moves that even
// out the serving shards' slots, weighed by their tasks (PlanSlots over
// Runtime.SlotLoad).
func (c *Controller) RebalanceSlots(ctx context.Context, dryRun bool) ([]*metapb.SlotMove, error) {
	if err := c.rt.Leading(); err != nil {
		return nil, err
	}
	cm := c.rt.Map()
	plan := PlanSlots(cm, c.rt.SlotLoad(ctx, cm))
	var out []*metapb.SlotMove
	if dryRun {
		for _, m := range plan {
			out = append(out, &metapb.SlotMove{Slot: m.Slot, From: cm.Slots[m.Slot], To: m.To})
		}
		return out, nil
	}
	for to, slots := range plan.ByTarget() {
		moves, err := c.MoveSlots(ctx, slots, to)
		out = append(out, moves...)
		if err != nil {
			return out, err
		}
	}
	slices.SortFunc(out, func(a, b *metapb.SlotMove) int { return cmp.Compare(a.Id, b.Id) })
	return out, nil
}

// AddNode makes a node a member of the map and a voter of the meta group
// (in that order of the group first: the new node must receive the map to
// learn which replicas it hosts). Without addr, the address the node
// gossips. Adding a member again is a no-op.
func (c *Controller) AddNode(ctx context.Context, id, addr string) (*metapb.Node, error) {
	if id == "" {
		return nil, fmt.Errorf("%w: node id is required", ErrInvalidRequest)
	}
	if err := c.rt.Leading(); err != nil {
		return nil, err
	}
	cm := c.rt.Map()
	if have := FindNode(cm, id); have != nil && have.Membership == member {
		return have, nil
	} else if have != nil && have.Membership != removed {
		return nil, fmt.Errorf("%w: node %s is %s", ErrInvalidRequest, id, StateName(have.Membership))
	}
	g, ok := c.rt.Gossiped(id)
	if addr == "" {
		if !ok || g.Address == "" {
			return nil, fmt.Errorf("%w: node %s is not gossiping: start it with --join, or give its address", ErrInvalidRequest, id)
		}
		addr = g.Address
	}
	node := NodeInState(id, member)
	node.Address, node.GossipAddress, node.HttpAddress = addr, g.GossipAddress, g.HTTPAddress
	if err := c.rt.AddMetaVoter(ctx, id, addr); err != nil {
		return nil, fmt.Errorf("add %s to the meta group: %w", id, err)
	}
	if err := c.rt.Propose(ctx, &metapb.Command{Op: metapb.Op_OP_UPDATE_NODE, Node: node}); err != nil {
		return nil, err
	}
	if err := c.rt.Propose(ctx, &metapb.Command{Op: metapb.Op_OP_SET_NODE_STATE, Node: NodeInState(id, member)}); err != nil {
		return nil, err
	}
	c.log.Info("node added", "peer", id, "addr", addr)
	return FindNode(c.rt.Map(), id), nil
}

// RemoveNode marks a node draining; PlaceOnce then moves its replicas away
// and takes it out of the meta group. Without force it refuses to leave
// fewer members than the replication factor. With force (a node dead for
// good) it takes the node out of the meta group at once and records it
// removed; placement replaces its replicas.
func (c *Controller) RemoveNode(ctx context.Context, id string, force bool) (*metapb.Node, error) {
	// Answered from this node's own view, before the leader check (the
	// caller forwards to the meta leader): the caller saw the node listed
	// as waiting by this node, and the leader's gossip may not have heard
	// of it yet.
	if FindNode(c.rt.Map(), id) == nil {
		if _, ok := c.rt.Gossiped(id); ok {
			return nil, fmt.Errorf("%w: %s is waiting to be added, not a member: there is nothing to remove; stop its process, and the node list drops it once gossip sees it gone", ErrInvalidRequest, id)
		}
	}
	if err := c.rt.Leading(); err != nil {
		return nil, err
	}
	cm := c.rt.Map()
	node := FindNode(cm, id)
	if node == nil || node.Membership == removed {
		return nil, &NotFoundError{What: "node", Name: id}
	}
	members := 0
	for _, m := range cm.Nodes {
		if m.Membership == member && m.Id != id {
			members++
		}
	}
	if members < int(cm.ReplicationFactor) && !force {
		return nil, fmt.Errorf("%w: removing %s would leave %d member(s) for a replication factor of %d; add a node first, or use --force for a node that is dead for good",
			ErrRefused, id, members, cm.ReplicationFactor)
	}
	if members == 0 {
		return nil, fmt.Errorf("%w: %s is the last member", ErrRefused, id)
	}
	if force {
		// Shard leaders remove dead voters before adding replacements.
		if err := c.rt.RemoveMetaVoter(ctx, id); err != nil {
			return nil, fmt.Errorf("remove %s from the meta group: %w", id, err)
		}
		if err := c.rt.Propose(ctx, &metapb.Command{Op: metapb.Op_OP_SET_NODE_STATE, Node: NodeInState(id, removed)}); err != nil {
			return nil, err
		}
		c.log.Warn("node removed by force", "peer", id)
		return FindNode(c.rt.Map(), id), nil
	}
	if err := c.rt.Propose(ctx, &metapb.Command{Op: metapb.Op_OP_SET_NODE_STATE, Node: NodeInState(id, draining)}); err != nil {
		return nil, err
	}
	c.log.Info("node draining", "peer", id, "force", force)
	return FindNode(c.rt.Map(), id), nil
}
