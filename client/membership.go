package client

import (
	"context"
	"fmt"

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
				return false, fmt.Sprintf("shard %d: the replica on %s is being removed", s.Id, rs.Node)
			}
			if rs.Role == "nonvoter" {
				return false, fmt.Sprintf("shard %d: %s is catching up", s.Id, rs.Node)
			}
			seen[rs.Node] = true
		}
		for r := range want {
			if !seen[r] {
				return false, fmt.Sprintf("shard %d: a replica is being added on %s", s.Id, r)
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
