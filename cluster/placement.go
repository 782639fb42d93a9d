package cluster

import (
	"context"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// Placement works in two levels, both level-triggered so that a crash at
// any point resumes where it stopped:
//
//   - The controller on the meta leader (control.Controller.PlaceOnce)
//     decides each shard's replica set and records it in the map (the
//     intent), as do the operator's AddNode and RemoveNode: replace replicas on draining or
//     removed nodes, fill up to the replication factor, and move one replica
//     at a time from the most to the least loaded member.
//   - Each shard's leader drives its Raft configuration towards the map's
//     replica set, one configuration change at a time with the previous
//     configuration index: remove dead voters first, add new replicas as
//     non-voters, promote them once they have caught up, and only then
//     remove the surplus (handing leadership off first if it is itself).
//     control.NextConfigChange decides each change; reconcileShardConfig
//     makes it.

// catchUpLag is how far (in log entries) a non-voter may trail the leader's
// commit index to be promoted.
const catchUpLag = 256

// changeConfig runs one configuration change with the previous
// configuration's index, so two concurrent changes cannot both apply.
func changeConfig(ctx context.Context, r *raft.Raft, change func(prev uint64) raft.IndexFuture) error {
	f := r.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	return waitFuture(ctx, change(f.Index()))
}

// reconcileConfigs runs on every node: for each shard it leads, one step of
// bringing the Raft configuration to the map's replica set.
func (n *Node) reconcileConfigs() {
	for sleepUntil(n.stop, max(n.cfg.Tuning.HeartbeatTimeout/2, 500*time.Millisecond)) {
		cm := n.meta.Map()
		health := n.gossip.snapshot()
		for _, s := range n.LocalShards() {
			if !s.IsLeader() {
				continue
			}
			sh := control.FindShard(cm, s.id)
			if sh == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), n.cfg.Tuning.ApplyTimeout)
			if err := n.reconcileShardConfig(ctx, s, cm, sh, health); err != nil {
				n.log.Warn("shard membership change", "shard", s.id, "err", err)
			}
			cancel()
		}
		n.retireReplicas(cm)
	}
}

// reconcileShardConfig makes one change of the shard's Raft configuration
// towards the map's replica set (control.NextConfigChange).
func (n *Node) reconcileShardConfig(ctx context.Context, s *Shard, cm *metapb.ClusterMap, sh *metapb.Shard, health map[string]gossipMember) error {
	r := s.g.raft
	f := r.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	var servers []control.Server
	for _, srv := range f.Configuration().Servers {
		servers = append(servers, control.Server{ID: string(srv.ID), Address: string(srv.Address), Voter: srv.Suffrage == raft.Voter})
	}
	next, err := control.NextConfigChange(cm, sh, servers, n.cfg.ID, func(id string) bool { return health[id].Health == HealthDead })
	if err != nil {
		return err
	}
	id, addr := raft.ServerID(next.ID), raft.ServerAddress(next.Address)
	change := func(what string, fn func(prev uint64) raft.IndexFuture) error {
		n.log.Info("shard membership change", "shard", s.id, "change", what)
		return changeConfig(ctx, r, fn)
	}
	switch next.Kind {
	case control.ConfigRemoveDead:
		return change("remove dead "+next.ID, func(prev uint64) raft.IndexFuture { return r.RemoveServer(id, prev, 0) })
	case control.ConfigAddNonvoter:
		return change("add non-voter "+next.ID, func(prev uint64) raft.IndexFuture { return r.AddNonvoter(id, addr, prev, 0) })
	case control.ConfigPromote:
		if !caughtUp(ctx, n.peerc, s, next.ID, next.Address) {
			return nil // wait: snapshot install or log catch-up under way
		}
		return change("promote "+next.ID, func(prev uint64) raft.IndexFuture { return r.AddVoter(id, addr, prev, 0) })
	case control.ConfigHandOff:
		n.log.Info("handing off leadership of a shard this node leaves", "shard", s.id, "to", next.ID)
		return waitFuture(ctx, r.LeadershipTransferToServer(id, addr))
	case control.ConfigRemove:
		return change("remove "+next.ID, func(prev uint64) raft.IndexFuture { return r.RemoveServer(id, prev, 0) })
	}
	return nil
}

// caughtUp asks a replica how far it has applied the shard.
func caughtUp(ctx context.Context, pc *peerClient, s *Shard, id, addr string) bool {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	r := pc.report(cctx, addr)
	rep := replicaOf(r, s.id)
	return r.GetNode() == id && rep != nil && rep.AppliedIndex+catchUpLag >= s.g.raft.CommitIndex()
}

// retireReplicas stops local replicas the map no longer places here, once
// the map has said so for a while (the shard's leader removes the replica
// from the Raft configuration only after its replacement votes), and
// deletes their data.
func (n *Node) retireReplicas(cm *metapb.ClusterMap) {
	if cm.ClusterId == "" || control.FindNode(cm, n.cfg.ID) == nil {
		return // not a member (yet): keep everything
	}
	grace := 10 * n.cfg.Tuning.ElectionTimeout
	n.mu.Lock()
	if n.unplacedSince == nil {
		n.unplacedSince = map[uint32]time.Time{}
	}
	var retire []*Shard
	for id, s := range n.shards {
		sh := control.FindShard(cm, id)
		if sh != nil && slices.Contains(sh.Replicas, n.cfg.ID) {
			delete(n.unplacedSince, id)
			continue
		}
		since, ok := n.unplacedSince[id]
		if !ok {
			n.unplacedSince[id] = n.cfg.Clock()
			continue
		}
		// A leader hands its replica off first, unless the shard is gone
		// from the map altogether (removed: nobody takes over). Without
		// waiting out the grace: a shard removed for good (ids are never
		// reused, so one at or below the map's last id that the map does
		// not list was dropped; a higher one is a shard a stale map does
		// not know yet), and a replica whose removal from its group's Raft
		// configuration it saw committed (nothing counts on it any more).
		// The grace covers what this replica cannot see: a leader stops
		// sending to a server it removed, so the commit may not reach it.
		removed := sh == nil && id <= control.LastShard(cm)
		settled := removed || (sh != nil && s.leftGroup(n.cfg.ID))
		if (settled || n.cfg.Clock().Sub(since) > grace) && (!s.IsLeader() || sh == nil) {
			retire = append(retire, s)
			delete(n.shards, id)
			n.localShards.Store(int32(len(n.shards)))
			delete(n.unplacedSince, id)
		}
	}
	n.mu.Unlock()
	for _, s := range retire {
		n.log.Info("retiring shard replica no longer placed here", "shard", s.id)
		if err := s.close(); err != nil {
			n.log.Warn("close retired replica", "shard", s.id, "err", err)
		}
		if err := writeRetiredMark(n.cfg.DataDir, s.id, cm.Epoch); err != nil {
			n.log.Warn("mark retired replica", "shard", s.id, "err", err)
		}
		if err := os.RemoveAll(s.g.dir); err != nil {
			n.log.Warn("delete retired replica", "shard", s.id, "err", err)
			continue
		}
		// Were this lost to a crash, the replica's next start would drop
		// the entries itself (adoptLog).
		if err := n.raftLog.Group(s.id).Reset(); err != nil {
			n.log.Warn("drop retired replica's Raft log entries", "shard", s.id, "err", err)
		}
		if err := n.state.drop(s.id); err != nil {
			n.log.Warn("drop retired replica's state", "shard", s.id, "err", err)
		}
	}
}

// leftGroup reports whether node self's replica s saw its own removal from
// the group's Raft configuration committed.
func (s *Shard) leftGroup(self string) bool {
	r := s.g.raft
	f := r.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) == self {
			return false
		}
	}
	stats := r.Stats()
	at, err1 := strconv.ParseUint(stats["latest_configuration_index"], 10, 64)
	commit, err2 := strconv.ParseUint(stats["commit_index"], 10, 64)
	return err1 == nil && err2 == nil && at > 0 && at <= commit
}

// Leaving reports whether this node is on its way out (draining or removed
// in its map, or no longer in the meta group's configuration): its own view
// of the cluster may be stale, so it should not answer for the cluster. It
// returns a member's address to ask instead, when it knows one.
func (n *Node) Leaving() (bool, string) {
	cm := n.meta.Map()
	self := control.FindNode(cm, n.cfg.ID)
	leaving := self != nil && self.Membership != NodeMember
	if f := n.metaGroup.raft.GetConfiguration(); f.Error() == nil && self != nil {
		in := false
		for _, srv := range f.Configuration().Servers {
			in = in || string(srv.ID) == n.cfg.ID
		}
		leaving = leaving || !in
	}
	if !leaving {
		return false, ""
	}
	if addr, id := n.metaGroup.raft.LeaderWithID(); addr != "" && string(id) != n.cfg.ID {
		return true, string(addr)
	}
	for _, node := range cm.Nodes {
		if node.Membership == NodeMember && node.Id != n.cfg.ID {
			return true, node.Address
		}
	}
	return true, ""
}

// MetaConfiguration is this node's view of the meta group's Raft
// configuration: the servers membership has added.
func (n *Node) MetaConfiguration() (raft.Configuration, error) {
	f := n.metaGroup.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return raft.Configuration{}, err
	}
	return f.Configuration(), nil
}
