package cluster

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// Status describes the cluster as this node sees it; unless localOnly it
// also asks every other member for its local view and merges the replicas'
// progress, so lag is computed from each replica's own numbers.
func (n *Node) Status(ctx context.Context, localOnly bool) *taskstorepb.StatusResponse {
	cm := n.meta.Map()
	st := n.localStatus(cm)
	if localOnly {
		return st
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	silent := map[string]bool{} // members that did not answer
	for _, node := range cm.Nodes {
		if node.Id == n.cfg.ID || node.Membership == NodeRemoved || node.Address == "" {
			continue
		}
		wg.Add(1)
		go func(id, addr string) {
			defer wg.Done()
			var peer *taskstorepb.StatusResponse
			conn, err := n.peers.get(addr)
			if err == nil {
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				// Wait for a connection (within the second) rather than fail
				// fast while a restarted peer's channel reconnects.
				peer, err = taskstorepb.NewAdminClient(conn).Status(cctx, &taskstorepb.StatusRequest{LocalOnly: true}, grpc.WaitForReady(true))
				cancel()
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				silent[id] = true
				return
			}
			mergeStatus(st, peer)
		}(node.Id, node.Address)
	}
	wg.Wait()
	for _, node := range st.Nodes {
		// Gossip takes seconds to suspect a node that died: until then a
		// member that gossip calls alive but that did not answer is shown
		// as suspect, not alive beside its under-replicated shards.
		if silent[node.Id] && node.Health == HealthAlive {
			node.Health = HealthSuspect
		}
	}
	computeLag(st.Meta)
	for _, s := range st.Shards {
		computeLag(s)
	}
	leads := map[string][]uint32{}
	for _, s := range st.Shards {
		if s.Leader != "" {
			leads[s.Leader] = append(leads[s.Leader], s.Id)
		}
	}
	for _, node := range st.Nodes {
		node.Leads = leads[node.Id]
	}
	return st
}

func (n *Node) localStatus(cm *metapb.ClusterMap) *taskstorepb.StatusResponse {
	st := &taskstorepb.StatusResponse{Node: n.cfg.ID}
	health := n.gossip.snapshot()
	seen := map[string]bool{}
	for _, node := range cm.Nodes {
		seen[node.Id] = true
		ns := &taskstorepb.NodeStatus{Id: node.Id, Address: node.Address, GossipAddress: node.GossipAddress,
			HttpAddress: node.HttpAddress, State: NodeStateName(node.Membership), Health: HealthUnknown}
		if m, ok := health[node.Id]; ok {
			ns.Health = m.Health
			// The meta leader copies gossip addresses into the map a little
			// after a node starts gossiping; until then show what gossip says.
			if ns.GossipAddress == "" {
				ns.GossipAddress = m.GossipAddress
			}
			if ns.HttpAddress == "" {
				ns.HttpAddress = m.Meta.HTTPAddress
			}
		}
		for _, s := range cm.Shards {
			if slices.Contains(s.Replicas, node.Id) {
				ns.Shards = append(ns.Shards, s.Id)
			}
		}
		st.Nodes = append(st.Nodes, ns)
	}
	// Nodes that gossip but are not in the map wait for `taskctl node add`.
	// One that died or left while waiting is nothing to list: not a
	// member, nothing to remove (it is listed again if it comes back).
	for id, m := range health {
		if seen[id] || m.Health == HealthDead || m.Health == HealthLeft {
			continue
		}
		st.Nodes = append(st.Nodes, &taskstorepb.NodeStatus{Id: id, Address: m.Meta.Address, GossipAddress: m.GossipAddress,
			HttpAddress: m.Meta.HTTPAddress, State: "waiting", Health: m.Health})
		seen[id] = true
	}
	if len(cm.Nodes) == 0 && !seen[n.cfg.ID] {
		// Before the map exists, at least describe this node (peers ask
		// for its gossip address while bootstrapping).
		st.Nodes = append(st.Nodes, &taskstorepb.NodeStatus{Id: n.cfg.ID, Address: n.addr, GossipAddress: n.cfg.GossipAddr,
			HttpAddress: n.cfg.HTTPAddr, State: "waiting", Health: HealthAlive})
	}
	free, measured := n.disk.freeBytes()
	for _, node := range st.Nodes {
		if node.Id == n.cfg.ID {
			if node.GossipAddress == "" {
				node.GossipAddress = n.cfg.GossipAddr
			}
			node.DiskLow = n.DiskLow()
			if measured {
				node.DiskFreeBytes, node.DiskMeasured = free, true
			}
		} else if m, ok := health[node.Id]; ok {
			node.DiskLow = m.Meta.DiskLow // until the node itself answers (Status)
		}
	}
	slices.SortFunc(st.Nodes, func(a, b *taskstorepb.NodeStatus) int { return cmp.Compare(a.Id, b.Id) })

	st.Meta = groupStatus(MetaGroupID, n.metaGroup.raft, n.cfg.ID, nil)
	if why := n.metaGroup.hold.Held(); why != "" {
		// It follows but does not vote: not a healthy voter yet.
		rs := st.Meta.ReplicaStatus[0]
		rs.Role, rs.Divergence = RoleHeld, &taskstorepb.Divergence{Damaged: why}
	}
	for _, s := range cm.Shards {
		var ss *taskstorepb.ShardStatus
		if local := n.Shard(s.Id); local != nil {
			ss = groupStatus(s.Id, local.g.raft, n.cfg.ID, local)
			n.mu.RLock()
			ss.ReplicaStatus[0].Disagreement = n.disagree[s.Id]
			n.mu.RUnlock()
		} else if d := n.Diverged(s.Id); d != nil {
			// Stopped: no Raft state to report, only why.
			ss = &taskstorepb.ShardStatus{Id: s.Id, ReplicaStatus: []*taskstorepb.ReplicaStatus{{Node: n.cfg.ID, Role: RoleDiverged, Divergence: d}}}
		} else {
			ss = &taskstorepb.ShardStatus{Id: s.Id}
		}
		ss.Replicas = slices.Clone(s.Replicas)
		ss.PreferredLeader = s.PreferredLeader
		ss.Retiring = s.Retiring
		if local := n.Shard(s.Id); local != nil {
			ss.Tasks = uint64(local.machine.TaskCount())
		}
		st.Shards = append(st.Shards, ss)
	}
	// A node that restarted has not yet replayed its copy of the map, but it
	// already runs (or refuses, as damaged or diverged) the replicas it has
	// on disk: report those too, so an operator sees a damaged replica at
	// once rather than after the node catches up.
	n.mu.RLock()
	var extra []uint32
	for id := range n.shards {
		if control.FindShard(cm, id) == nil {
			extra = append(extra, id)
		}
	}
	for id := range n.diverged {
		if control.FindShard(cm, id) == nil && n.shards[id] == nil {
			extra = append(extra, id)
		}
	}
	n.mu.RUnlock()
	slices.Sort(extra)
	for _, id := range extra {
		if local := n.Shard(id); local != nil {
			st.Shards = append(st.Shards, groupStatus(id, local.g.raft, n.cfg.ID, local))
		} else if d := n.Diverged(id); d != nil {
			st.Shards = append(st.Shards, &taskstorepb.ShardStatus{Id: id,
				ReplicaStatus: []*taskstorepb.ReplicaStatus{{Node: n.cfg.ID, Role: RoleDiverged, Divergence: d}}})
		}
	}
	slotCount := map[uint32]uint32{}
	for _, sh := range cm.Slots {
		slotCount[sh]++
	}
	for _, ss := range st.Shards {
		ss.Slots = slotCount[ss.Id]
	}
	for _, mv := range cm.Moves {
		st.Moves = append(st.Moves, MoveToAPI(mv))
	}
	for _, mv := range cm.Finished {
		st.FinishedMoves = append(st.FinishedMoves, MoveToAPI(mv))
	}
	return st
}

// RoleHeld is the role Status reports for a replica that follows its group
// but does not vote, having lost its Raft log or the proof of its vote.
const RoleHeld = "held"

// RoleDiverged is the role Status reports for a replica stopped because its
// state diverged from its shard's majority.
const RoleDiverged = "diverged"

// groupStatus reads one local Raft group's state.
func groupStatus(id uint32, r *raft.Raft, self string, s *Shard) *taskstorepb.ShardStatus {
	stats := r.Stats()
	num := func(k string) uint64 { v, _ := strconv.ParseUint(stats[k], 10, 64); return v }
	_, leader := r.LeaderWithID()
	ss := &taskstorepb.ShardStatus{Id: id, Leader: string(leader), Term: num("term")}
	role := replicaRole(r, self)
	if f := r.GetConfiguration(); f.Error() == nil && id == MetaGroupID {
		for _, srv := range f.Configuration().Servers {
			ss.Replicas = append(ss.Replicas, string(srv.ID))
		}
	}
	rs := &taskstorepb.ReplicaStatus{
		Node: self, Role: role, CommitIndex: num("commit_index"), AppliedIndex: num("applied_index"), LastIndex: num("last_log_index"),
	}
	if s != nil {
		rs.Checkpoints = checkpointsOf(s.machine)
		rs.LogBytes = uint64(s.LogBytes())
		rs.MemoryUsed = s.machine.MemoryUse(TaskOverheadBytes)
		if b := s.budget; b != nil {
			rs.MemoryBudget = b().GetBytes()
		}
	}
	ss.ReplicaStatus = append(ss.ReplicaStatus, rs)
	return ss
}

// mergeStatus folds a peer's local view into st.
func mergeStatus(st, peer *taskstorepb.StatusResponse) {
	// The peer knows its own disk best.
	for _, pn := range peer.Nodes {
		if pn.Id != peer.Node {
			continue
		}
		for _, node := range st.Nodes {
			if node.Id == pn.Id {
				node.DiskLow, node.DiskFreeBytes, node.DiskMeasured = pn.DiskLow, pn.DiskFreeBytes, pn.DiskMeasured
			}
		}
	}
	byID := map[uint32]*taskstorepb.ShardStatus{}
	for _, s := range st.Shards {
		byID[s.Id] = s
	}
	mergeShard := func(dst, src *taskstorepb.ShardStatus) {
		if dst == nil || src == nil {
			return
		}
		if src.Term > dst.Term || dst.Leader == "" {
			if src.Leader != "" {
				dst.Leader = src.Leader
			}
			dst.Term = max(dst.Term, src.Term)
		}
		dst.ReplicaStatus = append(dst.ReplicaStatus, src.ReplicaStatus...)
		// Tasks: the leader's replica's count, else any replica's.
		if src.Tasks > 0 && (dst.Tasks == 0 || src.Leader == peer.Node) {
			dst.Tasks = src.Tasks
		}
	}
	mergeShard(st.Meta, peer.Meta)
	for _, s := range peer.Shards {
		if len(s.ReplicaStatus) > 0 {
			mergeShard(byID[s.Id], s)
		}
	}
}

// computeLag sets each replica's lag behind the most advanced replica.
func computeLag(s *taskstorepb.ShardStatus) {
	if s == nil {
		return
	}
	var top uint64
	for _, r := range s.ReplicaStatus {
		top = max(top, r.AppliedIndex)
	}
	for _, r := range s.ReplicaStatus {
		if r.Role == RoleDiverged {
			continue // stopped: it reports no progress, and lags by design
		}
		r.Lag = top - r.AppliedIndex
	}
	slices.SortFunc(s.ReplicaStatus, func(a, b *taskstorepb.ReplicaStatus) int { return cmp.Compare(a.Node, b.Node) })
}

// Routing is the table clients and proxies route by.
func (n *Node) Routing() *taskstorepb.RoutingResponse {
	cm := n.meta.Map()
	rt := &taskstorepb.RoutingResponse{Slots: slices.Clone(cm.Slots), Epoch: cm.Epoch}
	for _, s := range cm.Shards {
		sr := &taskstorepb.ShardRoute{Id: s.Id}
		for _, r := range s.Replicas {
			addr := ""
			if node := control.FindNode(cm, r); node != nil {
				addr = node.Address
			}
			sr.Replicas = append(sr.Replicas, &taskstorepb.Replica{Id: r, Address: addr})
		}
		if local := n.Shard(s.Id); local != nil {
			addr, id := local.g.raft.LeaderWithID()
			sr.LeaderId, sr.LeaderAddress = string(id), string(addr)
		}
		rt.Shards = append(rt.Shards, sr)
	}
	return rt
}

// TransferLeader moves a shard's leadership; this node must lead it.
func (n *Node) TransferLeader(ctx context.Context, shard uint32, to string) (string, error) {
	s, err := n.ShardByID(shard)
	if err != nil {
		return "", err
	}
	if !s.IsLeader() {
		return "", s.notLeader()
	}
	// Hand it only to a replica that can take it now (notReadyToLead): raft
	// refuses every write until the target has caught up and won, and a
	// target that cannot append (a full disk) never does.
	var why []string
	for _, srv := range s.voters() {
		if string(srv.ID) == n.cfg.ID || to != "" && string(srv.ID) != to {
			continue
		}
		reason := notReadyToLead(n.peerc, s, &srv)
		if reason == "" && n.clock.peerFar(string(srv.ID)) {
			reason = "clock too far from this node's"
		}
		if reason != "" {
			why = append(why, fmt.Sprintf("%s: %s", srv.ID, reason))
			continue
		}
		if err := waitFuture(ctx, s.g.raft.LeadershipTransferToServer(srv.ID, srv.Address)); err != nil {
			return "", err
		}
		_, id := s.g.raft.LeaderWithID()
		return string(id), nil
	}
	if to != "" && len(why) == 0 {
		if to == n.cfg.ID {
			return n.cfg.ID, nil // it leads already
		}
		if control.FindNode(n.meta.Map(), to) == nil {
			return "", &NotFoundError{What: "node", Name: to}
		}
		return "", fmt.Errorf("%w: %s is not a voter of shard %d", ErrRefused, to, shard)
	}
	return "", fmt.Errorf("%w: no replica of shard %d can lead now (%s)", ErrRefused, shard, strings.Join(why, "; "))
}

// PeerConn returns the node's pooled connection to another node.
func (n *Node) PeerConn(addr string) (*grpc.ClientConn, error) { return n.peers.get(addr) }

// NodeStatus describes one node of the map as Status does.
func (n *Node) NodeStatus(id string) *taskstorepb.NodeStatus {
	for _, ns := range n.localStatus(n.meta.Map()).Nodes {
		if ns.Id == id {
			return ns
		}
	}
	return nil
}
