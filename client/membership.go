package client

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// AddNode makes a waiting node (started with --join) a member. Any node
// forwards the call to the meta leader. Replicas move onto the new node in
// the background; watch Status (or use PlacementSettled).
func (c *Client) AddNode(ctx context.Context, id, addr string) (*taskstorepb.NodeStatus, error) {
	if id == "" {
		return nil, fmt.Errorf("add node: id is required: %w", ErrInvalid)
	}
	var resp *taskstorepb.AddNodeResponse
	err := c.call(ctx, "AddNode", target{anyNode: true}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewAdminClient(cc).AddNode(ctx, &taskstorepb.AddNodeRequest{Id: id, Address: addr})
		return err
	})
	return resp.GetNode(), err
}

// RemoveNode drains a node and removes it from the cluster; force removes a
// node that is dead for good at once.
func (c *Client) RemoveNode(ctx context.Context, id string, force bool) (*taskstorepb.NodeStatus, error) {
	if id == "" {
		return nil, fmt.Errorf("remove node: id is required: %w", ErrInvalid)
	}
	var resp *taskstorepb.RemoveNodeResponse
	err := c.call(ctx, "RemoveNode", target{anyNode: true}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewAdminClient(cc).RemoveNode(ctx, &taskstorepb.RemoveNodeRequest{Id: id, Force: force})
		return err
	})
	return resp.GetNode(), err
}

// PlacementSettled reports whether every shard's replicas, as the map
// places them, are voting members of the shard's Raft group and no other
// node still holds a replica; otherwise it says what is still moving.
func PlacementSettled(st *taskstorepb.StatusResponse) (bool, string) {
	for _, s := range st.Shards {
		want := map[string]bool{}
		for _, r := range s.Replicas {
			want[r] = true
		}
		seen := map[string]bool{}
		for _, rs := range s.ReplicaStatus {
			if !want[rs.Node] {
				return false, fmt.Sprintf("shard %d: the replica on %s is being removed (it retires once its removal from the shard's group is committed)", s.Id, rs.Node)
			}
			if rs.Role == "nonvoter" {
				return false, fmt.Sprintf("shard %d: %s is catching up (a non-voter until it has the log; then it is promoted to vote)", s.Id, rs.Node)
			}
			seen[rs.Node] = true
		}
		for r := range want {
			if !seen[r] {
				return false, fmt.Sprintf("shard %d: a replica is being added on %s (it joins as a non-voter)", s.Id, r)
			}
		}
	}
	return true, ""
}

// RebuildReplica replaces node's diverged replica of a shard with a copy of
// the healthy replicas (Admin.RebuildReplica). It returns once the
// replica was removed from the shard's group and deleted; it then rejoins,
// catches up and is promoted in the background (watch Status).
func (c *Client) RebuildReplica(ctx context.Context, shard uint32, node string) error {
	if shard == 0 || node == "" {
		return fmt.Errorf("rebuild replica: shard and node are required: %w", ErrInvalid)
	}
	return c.call(ctx, "RebuildReplica", target{anyNode: true}, 0, func(ctx context.Context, cc *grpc.ClientConn) error {
		_, err := taskstorepb.NewAdminClient(cc).RebuildReplica(ctx, &taskstorepb.RebuildReplicaRequest{Shard: shard, Node: node})
		return err
	})
}

// MoveSlots moves hash slots to shard to on the live cluster (their
// groups' writers see Unavailable for the moment of the move, which this
// client retries on its own). It returns the moves once they are recorded;
// they run one at a time: watch Status().Moves, or use WaitMoves.
func (c *Client) MoveSlots(ctx context.Context, slots []uint32, to uint32) ([]*taskstorepb.SlotMove, error) {
	if len(slots) == 0 || to == 0 {
		return nil, fmt.Errorf("move slots: name the slots and the shard to move them to: %w", ErrInvalid)
	}
	var resp *taskstorepb.MoveSlotsResponse
	err := c.call(ctx, "MoveSlots", target{anyNode: true}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewAdminClient(cc).MoveSlots(ctx, &taskstorepb.MoveSlotsRequest{Slots: slots, To: to})
		return err
	})
	return resp.GetMoves(), err
}

// WaitMoves waits until each of the moves has finished, calling progress
// (if set) with the moves still under way after each look. It returns an
// error naming the moves that were abandoned (the slot stayed where it
// was) and why.
func (c *Client) WaitMoves(ctx context.Context, moves []*taskstorepb.SlotMove, progress func(under []*taskstorepb.SlotMove)) error {
	pending := map[uint64]bool{}
	for _, m := range moves {
		pending[m.Id] = true
	}
	var failed []string
	stayed := map[uint64]time.Time{} // finished moves whose slot the table still puts on the source
	for len(pending) > 0 {
		st, err := c.Status(ctx, &taskstorepb.StatusRequest{})
		if err != nil {
			return err
		}
		listed, dropped := settledMoves(st, moves, pending)
		for _, m := range listed {
			delete(pending, m.Id)
			if m.Phase != "done" {
				failed = append(failed, fmt.Sprintf("slot %d stayed on shard %d (%s)", m.Slot, m.From, m.Error))
			}
		}
		if len(dropped) > 0 {
			// Their outcome: where the routing table puts their slots. A
			// slot no longer on its source moved (to the target, or on
			// from there by a later move). One still there stayed (the
			// move was abandoned) once the table says so for a few
			// seconds: the table may come from a node whose map trails.
			rt, err := c.Routing(ctx)
			if err != nil {
				return err
			}
			for _, m := range dropped {
				if int(m.Slot) < len(rt.Slots) && rt.Slots[m.Slot] != m.From {
					delete(pending, m.Id)
					continue
				}
				if first, ok := stayed[m.Id]; !ok {
					stayed[m.Id] = time.Now()
				} else if time.Since(first) > 3*time.Second {
					delete(pending, m.Id)
					failed = append(failed, fmt.Sprintf("slot %d stayed on shard %d", m.Slot, m.From))
				}
			}
		}
		if progress != nil {
			var under []*taskstorepb.SlotMove
			for _, m := range st.Moves {
				if pending[m.Id] {
					under = append(under, m)
				}
			}
			progress(under)
		}
		if len(pending) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("move slots: %s: %w", strings.Join(failed, "; "), ErrUnavailable)
	}
	return nil
}

// settledMoves sorts out which of the pending moves a node's status shows
// finished: listed among its last finished moves (with their outcome), or
// dropped from that list (it keeps the last 64 to finish, and moves run
// concurrently, so they finish out of id order). A node whose copy of the
// map trails may not know a move yet; it knows every move up to the
// newest one it lists (ids are given in order), so a pending move up to
// that id that it lists neither under way nor finished has finished.
func settledMoves(st *taskstorepb.StatusResponse, moves []*taskstorepb.SlotMove, pending map[uint64]bool) (listed, dropped []*taskstorepb.SlotMove) {
	var newest uint64
	under := map[uint64]bool{}
	for _, m := range st.Moves {
		under[m.Id] = true
		newest = max(newest, m.Id)
	}
	finished := map[uint64]bool{}
	for _, m := range st.FinishedMoves {
		newest = max(newest, m.Id)
		finished[m.Id] = true
		if pending[m.Id] {
			listed = append(listed, m)
		}
	}
	for _, m := range moves {
		if pending[m.Id] && !under[m.Id] && !finished[m.Id] && m.Id <= newest {
			dropped = append(dropped, m)
		}
	}
	return listed, dropped
}

// AddShards adds count shards (Raft groups) to the live cluster. They
// serve no slot until slots move to them: RebalanceSlots.
func (c *Client) AddShards(ctx context.Context, count int) ([]*taskstorepb.ShardStatus, error) {
	if count <= 0 {
		return nil, fmt.Errorf("add shards: count must be at least 1: %w", ErrInvalid)
	}
	// The total makes a retry of an attempt that did add them add none.
	rt, err := c.Routing(ctx)
	if err != nil {
		return nil, err
	}
	req := &taskstorepb.AddShardsRequest{Count: uint32(count), Total: uint32(len(rt.Shards) + count)}
	var resp *taskstorepb.AddShardsResponse
	err = c.call(ctx, "AddShards", target{anyNode: true}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewAdminClient(cc).AddShards(ctx, req)
		return err
	})
	return resp.GetShards(), err
}

// RemoveShard moves a shard's slots to the other shards and then retires
// it; it returns the moves (WaitMoves waits for them; the shard leaves the
// map shortly after the last).
func (c *Client) RemoveShard(ctx context.Context, shard uint32) ([]*taskstorepb.SlotMove, error) {
	if shard == 0 {
		return nil, fmt.Errorf("remove shard: a shard id is required: %w", ErrInvalid)
	}
	var resp *taskstorepb.RemoveShardResponse
	err := c.call(ctx, "RemoveShard", target{anyNode: true}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewAdminClient(cc).RemoveShard(ctx, &taskstorepb.RemoveShardRequest{Shard: shard})
		return err
	})
	return resp.GetMoves(), err
}

// RebalanceSlots moves slots so that every shard serves a fair share; with
// dryRun it only returns the plan.
func (c *Client) RebalanceSlots(ctx context.Context, dryRun bool) ([]*taskstorepb.SlotMove, error) {
	var resp *taskstorepb.RebalanceSlotsResponse
	err := c.call(ctx, "RebalanceSlots", target{anyNode: true}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewAdminClient(cc).RebalanceSlots(ctx, &taskstorepb.RebalanceSlotsRequest{DryRun: dryRun})
		return err
	})
	return resp.GetMoves(), err
}
