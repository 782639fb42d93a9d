package cluster

import (
	"os"
	"slices"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// Shards come and go on a live cluster. The control plane
// (control.Controller's AddShards, RemoveShard, RebalanceSlots) decides and
// records; this file is the node's side. Each initial replica of a new
// shard bootstraps its group (reconcileShards); a new shard serves nothing
// until slots move to it. A retiring shard's slots move away; the slot
// mover drops it from the map once it serves no slot, and its replicas
// retire their groups (retireReplicas). A rebalance weighs the slots by
// their tasks, which each shard's leader counts (slotLoadOn, slotpeer.go).

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
		node := control.FindNode(cm, r)
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
