package rpc

import (
	"context"
	"errors"

	"google.golang.org/grpc/metadata"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
)

// forwardedKey marks a membership call one node forwarded to the meta
// leader, so that it is forwarded at most once.
const forwardedKey = cluster.ForwardedKey

// metaLeader returns a client of the meta leader when err says this node is
// not it and the call was not forwarded already.
func (srv *Server) metaLeader(ctx context.Context, err error) (taskstorepb.AdminClient, context.Context, bool) {
	var nl *cluster.NotLeaderError
	if !errors.As(err, &nl) || nl.Shard != cluster.MetaGroupID || nl.LeaderAddress == "" {
		return nil, nil, false
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(forwardedKey)) > 0 {
		return nil, nil, false
	}
	conn, cerr := srv.node.PeerConn(nl.LeaderAddress)
	if cerr != nil {
		return nil, nil, false
	}
	return taskstorepb.NewAdminClient(conn), metadata.AppendToOutgoingContext(ctx, forwardedKey, "1"), true
}

// AddNode implements Admin.AddNode; any node forwards it to the meta leader.
func (srv *Server) AddNode(ctx context.Context, req *taskstorepb.AddNodeRequest) (*taskstorepb.AddNodeResponse, error) {
	if err := checkAddNode(req); err != nil {
		return nil, toStatus(err)
	}
	_, err := srv.node.Control().AddNode(ctx, req.Id, req.Address)
	if err != nil {
		if leader, fctx, ok := srv.metaLeader(ctx, err); ok {
			return leader.AddNode(fctx, req)
		}
		return nil, toStatus(err)
	}
	return &taskstorepb.AddNodeResponse{Node: srv.node.NodeStatus(req.Id)}, nil
}

// RemoveNode implements Admin.RemoveNode; any node forwards it to the meta
// leader.
func (srv *Server) RemoveNode(ctx context.Context, req *taskstorepb.RemoveNodeRequest) (*taskstorepb.RemoveNodeResponse, error) {
	_, err := srv.node.Control().RemoveNode(ctx, req.Id, req.Force)
	if err != nil {
		if leader, fctx, ok := srv.metaLeader(ctx, err); ok {
			return leader.RemoveNode(fctx, req)
		}
		return nil, toStatus(err)
	}
	return &taskstorepb.RemoveNodeResponse{Node: srv.node.NodeStatus(req.Id)}, nil
}

// askMember returns a member to forward a cluster-wide read to when this
// node is leaving (and the call was not forwarded already, nor local-only).
func (srv *Server) askMember(ctx context.Context, localOnly bool) (taskstorepb.AdminClient, context.Context, bool) {
	if localOnly {
		return nil, nil, false
	}
	leaving, addr := srv.node.Leaving()
	if !leaving || addr == "" {
		return nil, nil, false
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(forwardedKey)) > 0 {
		return nil, nil, false
	}
	conn, err := srv.node.PeerConn(addr)
	if err != nil {
		return nil, nil, false
	}
	return taskstorepb.NewAdminClient(conn), metadata.AppendToOutgoingContext(ctx, forwardedKey, "1"), true
}

// RebuildReplica implements Admin.RebuildReplica. Any node forwards it to
// the shard's leader, which removes the diverged replica from the group and
// then sends the same request with wipe to the replica's node.
func (srv *Server) RebuildReplica(ctx context.Context, req *taskstorepb.RebuildReplicaRequest) (*taskstorepb.RebuildReplicaResponse, error) {
	if req.Wipe { // a leader of an older version asks so (cluster.wipeRemote)
		if md, ok := metadata.FromIncomingContext(ctx); !ok || len(md.Get(forwardedKey)) == 0 {
			return nil, toStatus(invalid("wipe", "set only by the shard's leader, after it removed the replica from the group: use taskctl shard rebuild"))
		}
		if err := srv.node.WipeReplica(req.Shard); err != nil {
			return nil, toStatus(err)
		}
		return &taskstorepb.RebuildReplicaResponse{}, nil
	}
	err := srv.node.RebuildReplica(ctx, req.Shard, req.Node)
	if err != nil {
		if leader, fctx, ok := srv.shardLeader(ctx, err); ok {
			return leader.RebuildReplica(fctx, req)
		}
		return nil, toStatus(err)
	}
	return &taskstorepb.RebuildReplicaResponse{}, nil
}

// shardLeader returns a client of a shard's leader when err names it and
// the call was not forwarded already.
func (srv *Server) shardLeader(ctx context.Context, err error) (taskstorepb.AdminClient, context.Context, bool) {
	var nl *cluster.NotLeaderError
	if !errors.As(err, &nl) || nl.LeaderAddress == "" || nl.LeaderAddress == srv.node.Addr() {
		return nil, nil, false
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(forwardedKey)) > 0 {
		return nil, nil, false
	}
	conn, cerr := srv.node.PeerConn(nl.LeaderAddress)
	if cerr != nil {
		return nil, nil, false
	}
	return taskstorepb.NewAdminClient(conn), metadata.AppendToOutgoingContext(ctx, forwardedKey, "1"), true
}

// MoveSlots implements Admin.MoveSlots; any node forwards it to the meta
// leader, whose slot mover runs the moves.
func (srv *Server) MoveSlots(ctx context.Context, req *taskstorepb.MoveSlotsRequest) (*taskstorepb.MoveSlotsResponse, error) {
	if len(req.Slots) == 0 {
		return nil, toStatus(invalid("slots", "name at least one slot"))
	}
	if req.To == 0 {
		return nil, toStatus(invalid("to", "the shard to move the slots to is required"))
	}
	moves, err := srv.node.Control().MoveSlots(ctx, req.Slots, req.To)
	if err != nil {
		if leader, fctx, ok := srv.metaLeader(ctx, err); ok {
			return leader.MoveSlots(fctx, req)
		}
		return nil, toStatus(err)
	}
	out := &taskstorepb.MoveSlotsResponse{}
	for _, mv := range moves {
		out.Moves = append(out.Moves, cluster.MoveToAPI(mv))
	}
	return out, nil
}

// AddShards implements Admin.AddShards; any node forwards it to the meta
// leader.
func (srv *Server) AddShards(ctx context.Context, req *taskstorepb.AddShardsRequest) (*taskstorepb.AddShardsResponse, error) {
	count := int(req.Count)
	if count == 0 {
		count = 1
	}
	shards, err := srv.node.Control().AddShards(ctx, count, int(req.Total))
	if err != nil && len(shards) == 0 {
		if leader, fctx, ok := srv.metaLeader(ctx, err); ok {
			return leader.AddShards(fctx, req)
		}
		return nil, toStatus(err)
	}
	out := &taskstorepb.AddShardsResponse{}
	for _, sh := range shards {
		out.Shards = append(out.Shards, &taskstorepb.ShardStatus{Id: sh.Id, Replicas: sh.Replicas, PreferredLeader: sh.PreferredLeader})
	}
	return out, toStatus(err)
}

// RemoveShard implements Admin.RemoveShard; any node forwards it to the
// meta leader.
func (srv *Server) RemoveShard(ctx context.Context, req *taskstorepb.RemoveShardRequest) (*taskstorepb.RemoveShardResponse, error) {
	if req.Shard == 0 {
		return nil, toStatus(invalid("shard", "required (the meta group is not a shard)"))
	}
	moves, err := srv.node.Control().RemoveShard(ctx, req.Shard)
	if err != nil {
		if leader, fctx, ok := srv.metaLeader(ctx, err); ok {
			return leader.RemoveShard(fctx, req)
		}
		return nil, toStatus(err)
	}
	out := &taskstorepb.RemoveShardResponse{}
	for _, mv := range moves {
		out.Moves = append(out.Moves, cluster.MoveToAPI(mv))
	}
	return out, nil
}

// RebalanceSlots implements Admin.RebalanceSlots; any node forwards it to
// the meta leader.
func (srv *Server) RebalanceSlots(ctx context.Context, req *taskstorepb.RebalanceSlotsRequest) (*taskstorepb.RebalanceSlotsResponse, error) {
	moves, err := srv.node.Control().RebalanceSlots(ctx, req.DryRun)
	if err != nil {
		if leader, fctx, ok := srv.metaLeader(ctx, err); ok {
			return leader.RebalanceSlots(fctx, req)
		}
		return nil, toStatus(err)
	}
	out := &taskstorepb.RebalanceSlotsResponse{}
	for _, mv := range moves {
		out.Moves = append(out.Moves, cluster.MoveToAPI(mv))
	}
	return out, nil
}
