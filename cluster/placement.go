package cluster

import (
	"context"
	"errors"
	"fmt"
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

// catchUpLag is how far (in log entries) a non-voter may trail the leader's
// commit index to be promoted.
const catchUpLag = 256

func (n *Node) metaNotLeader() error {
	addr, id := n.metaGroup.raft.LeaderWithID()
	return &NotLeaderError{Shard: MetaGroupID, LeaderID: string(id), LeaderAddress: string(addr)}
}

// changeConfig runs one configuration change with the previous
// configuration's index, so two concurrent changes cannot both apply.
func changeConfig(ctx context.Context, r *raft.Raft, change func(prev uint64) raft.IndexFuture) error {
	f := r.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	return waitFuture(ctx, change(f.Index()))
}

// runController is the meta leader's placement loop.
func (n *Node) runController() {
	for n.sleep(max(n.cfg.Tuning.HeartbeatTimeout, time.Second)) {
		if !n.metaReady.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.Tuning.ApplyTimeout)
		if err := n.ctl.PlaceOnce(ctx); err != nil && !errors.Is(err, ErrNotLeader) {
			n.log.Warn("placement", "err", err)
		}
		cancel()
	}
}

// reconcileConfigs runs on every node: for each shard it leads, one step of
// bringing the Raft configuration to the map's replica set.
func (n *Node) reconcileConfigs() {
	for n.sleep(max(n.cfg.Tuning.HeartbeatTimeout/2, 500*time.Millisecond)) {
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

func (n *Node) reconcileShardConfig(ctx context.Context, s *Shard, cm *metapb.ClusterMap, sh *metapb.Shard, health map[string]gossipMember) error {
	r := s.g.raft
	f := r.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	servers := f.Configuration().Servers
	in := func(id string) *raft.Server {
		for i := range servers {
			if string(servers[i].ID) == id {
				return &servers[i]
			}
		}
		return nil
	}
	addrOf := func(id string) raft.ServerAddress {
		if node := control.FindNode(cm, id); node != nil {
			return raft.ServerAddress(node.Address)
		}
		return ""
	}
	change := func(what string, fn func(prev uint64) raft.IndexFuture) error {
		n.log.Info("shard membership change", "shard", s.id, "change", what)
		return changeConfig(ctx, r, fn)
	}
	// 1. A dead voter the map no longer wants goes first (DESIGN §4).
	for _, srv := range servers {
		id := string(srv.ID)
		if !slices.Contains(sh.Replicas, id) && id != n.cfg.ID && health[id].Health == HealthDead {
			return change("remove dead "+id, func(prev uint64) raft.IndexFuture { return r.RemoveServer(srv.ID, prev, 0) })
		}
	}
	// 2. New replicas join as non-voters.
	for _, id := range sh.Replicas {
		if in(id) == nil {
			addr := addrOf(id)
			if addr == "" {
				return fmt.Errorf("replica %s has no address in the map", id)
			}
			return change("add non-voter "+id, func(prev uint64) raft.IndexFuture {
				return r.AddNonvoter(raft.ServerID(id), addr, prev, 0)
			})
		}
	}
	// 3. Promote non-voters that have caught up.
	for _, id := range sh.Replicas {
		if srv := in(id); srv != nil && srv.Suffrage == raft.Nonvoter {
			if !n.caughtUp(ctx, s, id, string(srv.Address)) {
				return nil // wait: snapshot install or log catch-up under way
			}
			return change("promote "+id, func(prev uint64) raft.IndexFuture {
				return r.AddVoter(raft.ServerID(id), srv.Address, prev, 0)
			})
		}
	}
	// 4. Every wanted replica votes: remove the surplus, handing off first
	// when the surplus is this leader.
	for _, srv := range servers {
		id := string(srv.ID)
		if slices.Contains(sh.Replicas, id) {
			continue
		}
		if id == n.cfg.ID {
			to := sh.PreferredLeader
			n.log.Info("handing off leadership of a shard this node leaves", "shard", s.id, "to", to)
			return waitFuture(ctx, r.LeadershipTransferToServer(raft.ServerID(to), addrOf(to)))
		}
		return change("remove "+id, func(prev uint64) raft.IndexFuture { return r.RemoveServer(srv.ID, prev, 0) })
	}
	return nil
}

// caughtUp asks a replica how far it has applied the shard.
func (n *Node) caughtUp(ctx context.Context, s *Shard, id, addr string) bool {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	r := n.askReport(cctx, addr)
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
		settled := removed || (sh != nil && n.leftGroup(s))
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
		if err := n.dropState(s.id); err != nil {
			n.log.Warn("drop retired replica's state", "shard", s.id, "err", err)
		}
	}
}

// leftGroup reports whether this node's replica of s saw its own removal
// from the group's Raft configuration committed.
func (n *Node) leftGroup(s *Shard) bool {
	r := s.g.raft
	f := r.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) == n.cfg.ID {
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
