package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
		sh := planNewShard(cm)
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

// planNewShard places a new shard: the next id, the replication factor's
// least loaded members (ties by id), and as preferred leader the one of
// them that is preferred for the fewest shards. Deterministic in the map.
func planNewShard(cm *metapb.ClusterMap) *metapb.Shard {
	var members []string
	for _, node := range cm.Nodes {
		if node.Membership == NodeMember {
			members = append(members, node.Id)
		}
	}
	if len(members) == 0 {
		return nil
	}
	load, preferred := map[string]int{}, map[string]int{}
	id := lastShard(cm)
	for _, s := range cm.Shards {
		for _, r := range s.Replicas {
			load[r]++
		}
		preferred[s.PreferredLeader]++
	}
	slices.SortFunc(members, func(a, b string) int {
		return cmp.Or(cmp.Compare(load[a], load[b]), cmp.Compare(a, b))
	})
	rf := min(max(int(cm.ReplicationFactor), 1), len(members))
	replicas := slices.Clone(members[:rf])
	lead := replicas[0]
	for _, r := range replicas {
		if preferred[r] < preferred[lead] {
			lead = r
		}
	}
	slices.Sort(replicas)
	return &metapb.Shard{Id: id + 1, Replicas: replicas, PreferredLeader: lead, InitialReplicas: slices.Clone(replicas)}
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
	moves, err := n.moveOffRetiring(ctx)
	n.wakeMover()
	return moves, err
}

// moveOffRetiring records moves for the slots of retiring shards that are
// not moving yet, to the serving shards with the fewest slots.
func (n *Node) moveOffRetiring(ctx context.Context) ([]*metapb.SlotMove, error) {
	cm := n.meta.Map()
	plan := planSlots(cm, nil)
	var out []*metapb.SlotMove
	for to, slots := range plan.byTarget() {
		var off []uint32
		for _, s := range slots {
			if sh := findShard(cm, cm.Slots[s]); sh != nil && sh.Retiring {
				off = append(off, s)
			}
		}
		if len(off) == 0 {
			continue
		}
		moves, err := n.MoveSlots(ctx, off, to)
		out = append(out, moves...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// RebalanceSlots records (or with dryRun only plans) the moves that even
// out the serving shards' slots; only on the meta leader.
func (n *Node) RebalanceSlots(ctx context.Context, dryRun bool) ([]*metapb.SlotMove, error) {
	if !n.metaReady.Load() {
		return nil, n.metaNotLeader()
	}
	cm := n.meta.Map()
	load := n.slotLoad(ctx, cm)
	plan := planSlots(cm, load)
	if dryRun {
		var out []*metapb.SlotMove
		for _, m := range plan {
			out = append(out, &metapb.SlotMove{Slot: m.slot, From: cm.Slots[m.slot], To: m.to})
		}
		return out, nil
	}
	var out []*metapb.SlotMove
	for to, slots := range plan.byTarget() {
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

// plannedMove is one slot of a plan and where it goes.
type plannedMove struct {
	slot uint32
	to   uint32
}

type slotPlan []plannedMove

func (p slotPlan) byTarget() map[uint32][]uint32 {
	out := map[uint32][]uint32{}
	for _, m := range p {
		out[m.to] = append(out[m.to], m.slot)
	}
	return out
}

// planSlots plans the moves that leave the serving (not retiring) shards
// with slot counts within one of each other and retiring shards with none.
// A slot that is moving stays out of the plan. Donors give up, among their
// slots, first those of retiring shards, then the heaviest (by load) while
// the receiver is lighter than the donor would be after it, else the
// lightest: the tasks even out as the counts do, and the copies stay small
// when they cannot. Deterministic in its inputs.
func planSlots(cm *metapb.ClusterMap, load map[uint32]uint64) slotPlan {
	var serving []uint32
	for _, s := range cm.Shards {
		if !s.Retiring {
			serving = append(serving, s.Id)
		}
	}
	if len(serving) == 0 || len(cm.Slots) == 0 {
		return nil
	}
	slices.Sort(serving)
	count := map[uint32]int{}
	tasks := map[uint32]uint64{}
	owned := map[uint32][]uint32{} // shard -> its slots not moving
	for s, sh := range cm.Slots {
		if mv := moveOfSlot(cm, uint32(s)); mv != nil {
			count[mv.To]++ // it will be there
			tasks[mv.To] += load[uint32(s)]
			continue
		}
		count[sh]++
		tasks[sh] += load[uint32(s)]
		owned[sh] = append(owned[sh], uint32(s))
	}
	// Each serving shard's quota: an even share, the first ones one more.
	quota := map[uint32]int{}
	for i, id := range serving {
		quota[id] = len(cm.Slots) / len(serving)
		if i < len(cm.Slots)%len(serving) {
			quota[id]++
		}
	}
	var plan slotPlan
	// Donors: retiring shards first, then serving shards over quota.
	var donors []uint32
	for _, s := range cm.Shards {
		if s.Retiring && len(owned[s.Id]) > 0 {
			donors = append(donors, s.Id)
		}
	}
	for _, id := range serving {
		if count[id] > quota[id] {
			donors = append(donors, id)
		}
	}
	over := func(id uint32) int {
		if sh := findShard(cm, id); sh != nil && sh.Retiring {
			return count[id]
		}
		return count[id] - quota[id]
	}
	for _, d := range donors {
		slots := owned[d]
		// Heaviest first; ties by slot.
		slices.SortFunc(slots, func(a, b uint32) int { return cmp.Or(cmp.Compare(load[b], load[a]), cmp.Compare(a, b)) })
		for over(d) > 0 && len(slots) > 0 {
			// The receiver: the serving shard furthest under its quota,
			// then the lightest.
			var to uint32
			for _, id := range serving {
				if id == d || count[id] >= quota[id] {
					continue
				}
				if to == 0 || quota[id]-count[id] > quota[to]-count[to] ||
					quota[id]-count[id] == quota[to]-count[to] && tasks[id] < tasks[to] {
					to = id
				}
			}
			if to == 0 {
				break
			}
			pick := 0 // the heaviest, if that keeps the receiver lighter
			if tasks[to]+load[slots[0]] > tasks[d]-load[slots[0]] {
				pick = len(slots) - 1 // else the lightest
			}
			s := slots[pick]
			slots = slices.Delete(slots, pick, pick+1)
			plan = append(plan, plannedMove{slot: s, to: to})
			count[d]--
			count[to]++
			tasks[d] -= load[s]
			tasks[to] += load[s]
		}
	}
	return plan
}

// retiringWork is the slot mover's chore when no move is under way: move
// the slots of retiring shards away, and drop a retiring shard that serves
// none. It reports whether it changed anything.
func (n *Node) retiringWork(ctx context.Context) (bool, error) {
	cm := n.meta.Map()
	for _, sh := range cm.Shards {
		if !sh.Retiring {
			continue
		}
		if slices.Contains(cm.Slots, sh.Id) {
			moves, err := n.moveOffRetiring(ctx)
			return len(moves) > 0, err
		}
		if err := n.proposeMeta(ctx, &metapb.Command{Op: metapb.Op_OP_DROP_SHARD, Shard: &metapb.Shard{Id: sh.Id}}); err != nil {
			return false, err
		}
		if findShard(n.meta.Map(), sh.Id) != nil {
			return false, errors.New("the drop was ignored: a move still names the shard")
		}
		n.log.Info("shard removed: it served no slot any more; its replicas retire its group", "shard", sh.Id)
		return true, nil
	}
	return false, nil
}
