package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// leaderBalancer hands each shard's leadership to its preferred replica (the
// first alive voter in the map's replica list, control.PreferredLeader). The
// map spreads first replicas evenly, so leaders spread within one of each
// other after bootstrap and after a node returns.
type leaderBalancer struct {
	self            string
	electionTimeout time.Duration
	log             *slog.Logger
	stop            <-chan struct{}
	// local lists the replicas hosted here; clusterMap is the map as this
	// node has it.
	local      func() []*Shard
	clusterMap func() *metapb.ClusterMap
	gossip     *gossip
	peerc      *peerClient
	clock      *clockGuard
	disk       *diskGuard
}

// run balances the leaders of the shards this node leads until stop closes.
func (b *leaderBalancer) run() {
	backoff := make(map[uint32]time.Time)
	interval := max(2*b.electionTimeout, 2*time.Second)
	for sleepUntil(b.stop, interval) {
		cm := b.clusterMap()
		health := b.gossip.snapshot()
		for _, s := range b.local() {
			if !s.IsLeader() || time.Now().Before(backoff[s.id]) {
				continue
			}
			sh := control.FindShard(cm, s.id)
			if sh == nil {
				continue
			}
			pref := b.preferred(s, sh, health)
			if pref == nil || string(pref.ID) == b.self {
				continue
			}
			if why := notReadyToLead(b.peerc, s, pref); why != "" {
				b.log.Debug("not handing shard leadership to preferred replica", "shard", s.id, "to", pref.ID, "why", why)
				continue
			}
			b.log.Info("handing shard leadership to preferred replica", "shard", s.id, "to", pref.ID)
			ctx, cancel := context.WithTimeout(context.Background(), 2*b.electionTimeout+time.Second)
			err := waitFuture(ctx, s.g.raft.LeadershipTransferToServer(pref.ID, pref.Address))
			cancel()
			if err != nil {
				b.log.Warn("leadership transfer failed", "shard", s.id, "to", pref.ID, "err", err)
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
func notReadyToLead(pc *peerClient, s *Shard, to *raft.Server) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r := pc.report(ctx, string(to.Address))
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

// preferred is the voter of s that should lead it (control.PreferredLeader),
// or nil: a peer may lead when gossip sees it alive, its clock is near this
// node's and its disk has space; this node, when mayNotLead says nothing.
func (b *leaderBalancer) preferred(s *Shard, sh *metapb.Shard, health map[string]gossipMember) *raft.Server {
	f := s.g.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	var voters []string
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			voters = append(voters, string(srv.ID))
		}
	}
	id := control.PreferredLeader(sh, voters, func(id string) bool {
		if id == b.self {
			return mayNotLead(b.clock, b.disk) == ""
		}
		return health[id].Health == HealthAlive && !b.clock.peerFar(id) && !health[id].Meta.DiskLow
	})
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) == id {
			return &srv
		}
	}
	return nil
}
