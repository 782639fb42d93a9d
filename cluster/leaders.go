package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// balanceLeaders hands each shard's leadership to its preferred replica (the
// first alive voter in the map's replica list). The map spreads first
// replicas evenly, so leaders spread within one of each other after
// bootstrap and after a node returns.
func (n *Node) balanceLeaders() {
	backoff := make(map[uint32]time.Time)
	interval := max(2*n.cfg.Tuning.ElectionTimeout, 2*time.Second)
	for n.sleep(interval) {
		cm := n.meta.Map()
		health := n.gossip.snapshot()
		for _, s := range n.LocalShards() {
			if !s.IsLeader() || time.Now().Before(backoff[s.id]) {
				continue
			}
			sh := control.FindShard(cm, s.id)
			if sh == nil {
				continue
			}
			pref := n.preferredLeader(s, sh, health)
			if pref == nil || string(pref.ID) == n.cfg.ID {
				continue
			}
			if why := n.notReadyToLead(s, pref); why != "" {
				n.log.Debug("not handing shard leadership to preferred replica", "shard", s.id, "to", pref.ID, "why", why)
				continue
			}
			n.log.Info("handing shard leadership to preferred replica", "shard", s.id, "to", pref.ID)
			ctx, cancel := context.WithTimeout(context.Background(), 2*n.cfg.Tuning.ElectionTimeout+time.Second)
			err := waitFuture(ctx, s.g.raft.LeadershipTransferToServer(pref.ID, pref.Address))
			cancel()
			if err != nil {
				n.log.Warn("leadership transfer failed", "shard", s.id, "to", pref.ID, "err", err)
				backoff[s.id] = time.Now().Add(30 * time.Second)
			}
		}
	}
}

// maxTransferLag is how many entries a replica may be behind the leader's
// commit index and still be handed leadership. raft's transfer first
// replicates to the target and refuses every write meanwhile, for up to an
// election timeout; a replica far behind (or one that cannot append: a full
// disk) would make that pause long and then fail.
const maxTransferLag = 256

// notReadyToLead asks the replica itself whether it could take the shard
// over now: it answers, its disk has space, it runs the shard with a healthy
// role and it has applied all but maxTransferLag of what this leader has
// committed. It returns why not, or "".
func (n *Node) notReadyToLead(s *Shard, to *raft.Server) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r := n.askReport(ctx, string(to.Address))
	switch {
	case r == nil:
		return "does not answer"
	case r.Node != string(to.ID):
		return fmt.Sprintf("its address answers as %s", r.Node)
	case r.DiskLow:
		return "data disk nearly full"
	}
	rep := replicaOf(r, s.id)
	if rep == nil {
		return "does not run the shard"
	}
	if rep.Role != "follower" {
		return "replica is " + rep.Role
	}
	if commit := s.g.raft.CommitIndex(); rep.AppliedIndex+maxTransferLag < commit {
		return fmt.Sprintf("behind: applied %d of %d", rep.AppliedIndex, commit)
	}
	return ""
}

func (n *Node) preferredLeader(s *Shard, sh *metapb.Shard, health map[string]gossipMember) *raft.Server {
	f := s.g.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	// The preferred replica first, then the others in list order (it is
	// looked at twice: harmless).
	for _, id := range append([]string{sh.PreferredLeader}, sh.Replicas...) {
		if id != n.cfg.ID && (health[id].Health != HealthAlive || n.peerClockFar(id)) {
			continue
		}
		if id != n.cfg.ID && health[id].Meta.DiskLow {
			continue
		}
		if id == n.cfg.ID && n.mayNotLead() != "" {
			continue
		}
		for _, srv := range f.Configuration().Servers {
			if string(srv.ID) == id && srv.Suffrage == raft.Voter {
				return &srv
			}
		}
	}
	return nil
}
