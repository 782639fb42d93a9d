package cluster

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/cluster/peerpb"
)

// Shards come and go on a live cluster. AddShards records new
// shards with replicas placed like any other's; each initial replica
// bootstraps the new group (reconcileShards). A new shard serves nothing
// until slots move to it. RemoveShard marks a shard retiring and moves its
// slots away; the slot mover drops the retiring shard from the map once it
// serves no slot, and its replicas retire their groups (retireReplicas).
// RebalanceSlots evens out the slots, weighing them by their tasks.

// AddShards adds count shards, or with total > 0 as many as it takes to
// have total (a retry adds none twice); only on the meta leader.
func (n *Node) AddShards(ctx context.Context, count, total int) ([]*metapb.Shard, error) {
	if !n.metaReady.Load() {
		return nil, n.metaNotLeader()
	}
	cm := n.meta.Map()
	if total > 0 {
		count = total - len(cm.Shards)
		if count <= 0 {
			return nil, nil
		}
	}
	if count <= 0 || count > 64 {
		return nil, fmt.Errorf("%w: add 1 to 64 shards at a time, not %d", ErrInvalidRequest, count)
	}
	if err := n.everyNodeMovesSlots(ctx, cm); err != nil {
		return nil, err
	}
	var out []*metapb.Shard
	for range count {
		cm = n.meta.Map()
		sh := control.PlanNewShard(cm)
		if sh == nil {
			return out, fmt.Errorf("%w: no member node to place a shard's replicas on", ErrRefused)
		}
		if err := n.proposeMeta(ctx, &metapb.Command{Op: metapb.Op_OP_ADD_SHARD, Shard: sh}); err != nil {
			return out, err
		}
		if findShard(n.meta.Map(), sh.Id) == nil {
			return out, fmt.Errorf("%w: shard %d was not added (the map changed meanwhile); try again", ErrRefused, sh.Id)
		}
		n.log.Info("shard added: it serves no slot until slots move to it", "shard", sh.Id, "replicas", sh.Replicas, "preferred_leader", sh.PreferredLeader)
		out = append(out, sh)
	}
	return out, nil
}

// bootstrapNewShard bootstraps a local replica of a shard added to the
// running cluster, while the shard still has its initial replicas: each of
// them does (the same configuration, as at a cluster's bootstrap); one
// that has state already is left alone.
func (n *Node) bootstrapNewShard(cm *metapb.ClusterMap, sh *metapb.Shard, s *Shard) {
	if len(sh.InitialReplicas) == 0 || !slices.Contains(sh.InitialReplicas, n.cfg.ID) ||
		!sameMembers(sh.Replicas, sh.InitialReplicas) {
		return
	}
	if _, err := os.Stat(retiredMark(n.cfg.DataDir, sh.Id)); err == nil {
		return // retired here before: a map from before that, replayed
	}
	var servers []raft.Server
	for _, r := range sh.InitialReplicas {
		node := findNode(cm, r)
		if node == nil || node.Address == "" {
			return // the map does not know where yet: the next change
		}
		servers = append(servers, raft.Server{ID: raft.ServerID(r), Address: raft.ServerAddress(node.Address)})
	}
	if err := s.g.bootstrap(servers); err != nil {
		n.log.Warn("bootstrap a new shard's group", "shard", sh.Id, "err", err)
	}
}

func sameMembers(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// RemoveShard marks a shard retiring and moves its slots to the others;
// only on the meta leader.
func (n *Node) RemoveShard(ctx context.Context, id uint32) ([]*metapb.SlotMove, error) {
	if !n.metaReady.Load() {
		return nil, n.metaNotLeader()
	}
	cm := n.meta.Map()
	sh := findShard(cm, id)
	if sh == nil {
		return nil, &NotFoundError{What: "shard", Name: fmt.Sprint(id)}
	}
	if err := n.everyNodeMovesSlots(ctx, cm); err != nil {
		return nil, err
	}
	if !sh.Retiring {
		if err := n.proposeMeta(ctx, &metapb.Command{Op: metapb.Op_OP_RETIRE_SHARD, Shard: &metapb.Shard{Id: id}}); err != nil {
			return nil, err
		}
		if sh = findShard(n.meta.Map(), id); sh == nil || !sh.Retiring {
			return nil, fmt.Errorf("%w: shard %d is the last one serving slots; add another first", ErrRefused, id)
		}
		n.log.Info("shard retiring: its slots move to the other shards, then its group is removed", "shard", id)
	}
	moves, err := n.ctl.MoveOffRetiring(ctx)
	n.wakeMover()
	return moves, err
}

// RebalanceSlots records (or with dryRun only plans) the moves that even
// out the serving shards' slots; only on the meta leader.
func (n *Node) RebalanceSlots(ctx context.Context, dryRun bool) ([]*metapb.SlotMove, error) {
	if !n.metaReady.Load() {
		return nil, n.metaNotLeader()
	}
	cm := n.meta.Map()
	load := n.slotLoad(ctx, cm)
	plan := control.PlanSlots(cm, load)
	if dryRun {
		var out []*metapb.SlotMove
		for _, m := range plan {
			out = append(out, &metapb.SlotMove{Slot: m.Slot, From: cm.Slots[m.Slot], To: m.To})
		}
		return out, nil
	}
	var out []*metapb.SlotMove
	for to, slots := range plan.ByTarget() {
		moves, err := n.MoveSlots(ctx, slots, to)
		out = append(out, moves...)
		if err != nil {
			return out, err
		}
	}
	slices.SortFunc(out, func(a, b *metapb.SlotMove) int { return cmp.Compare(a.Id, b.Id) })
	return out, nil
}

// slotLoad asks each shard's leader how many tasks its slots hold; a shard
// that does not answer counts as empty (the plan then balances by count).
func (n *Node) slotLoad(ctx context.Context, cm *metapb.ClusterMap) map[uint32]uint64 {
	out := map[uint32]uint64{}
	for _, sh := range cm.Shards {
		req := &peerpb.SlotLoadRequest{Shard: sh.Id}
		r, err := onLeader(ctx, n, sh.Id,
			func() (*peerpb.SlotLoadResponse, error) { return n.slotLoadHere(req) },
			func(ctx context.Context, pc peerpb.PeerClient) (*peerpb.SlotLoadResponse, error) {
				return pc.SlotLoad(ctx, req)
			})
		if err != nil {
			continue
		}
		for s, t := range r.Tasks {
			if int(s) < len(cm.Slots) && cm.Slots[s] == sh.Id {
				out[s] = t
			}
		}
	}
	return out
}

func (n *Node) slotLoadHere(req *peerpb.SlotLoadRequest) (*peerpb.SlotLoadResponse, error) {
	s := n.Shard(req.Shard)
	if s == nil || !s.IsLeader() {
		nl := notLeaderStep(s)
		return &peerpb.SlotLoadResponse{NotLeader: true, LeaderAddress: nl.LeaderAddress}, nil
	}
	out := &peerpb.SlotLoadResponse{Tasks: map[uint32]uint64{}}
	for slot, t := range s.machine.SlotTasks(uint32(n.slotTable())) {
		out.Tasks[slot] = uint64(t)
	}
	return out, nil
}

// SlotLoad implements peerpb.PeerServer.
func (p *peerServer) SlotLoad(_ context.Context, req *peerpb.SlotLoadRequest) (*peerpb.SlotLoadResponse, error) {
	if req.Shard == MetaGroupID {
		return nil, status.Error(codes.InvalidArgument, "the meta group holds no slots")
	}
	return p.n.slotLoadHere(req)
}
