package control

import (
	"slices"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// Node membership states, as the map records them.
const (
	member   = metapb.NodeState_NODE_MEMBER
	draining = metapb.NodeState_NODE_DRAINING
	removed  = metapb.NodeState_NODE_REMOVED
)

// FindShard returns the map's record of shard id, or nil.
func FindShard(cm *metapb.ClusterMap, id uint32) *metapb.Shard {
	for _, s := range cm.Shards {
		if s.Id == id {
			return s
		}
	}
	return nil
}

// FindNode returns the map's record of node id, or nil.
func FindNode(cm *metapb.ClusterMap, id string) *metapb.Node {
	for _, n := range cm.Nodes {
		if n.Id == id {
			return n
		}
	}
	return nil
}

// MoveOfSlot returns the move of slot under way, if any.
func MoveOfSlot(cm *metapb.ClusterMap, slot uint32) *metapb.SlotMove {
	for _, m := range cm.Moves {
		if m.Slot == slot {
			return m
		}
	}
	return nil
}

// LastShard is the highest shard id ever used.
func LastShard(cm *metapb.ClusterMap) uint32 {
	last := cm.LastShard
	for _, s := range cm.Shards {
		last = max(last, s.Id)
	}
	return last
}

// HostsAny reports whether the map places a replica of any shard on node id.
func HostsAny(cm *metapb.ClusterMap, id string) bool {
	for _, s := range cm.Shards {
		if slices.Contains(s.Replicas, id) {
			return true
		}
	}
	return false
}

// NormalizeShard makes sure a shard names a preferred leader among its
// replicas: entries and snapshots from before the field name none, and then
// the first replica was the preferred one; a name that is not a replica
// falls back the same way. Deterministic in the record, so every replica
// of the meta group agrees (the meta state machine applies it too).
func NormalizeShard(sh *metapb.Shard) {
	if !slices.Contains(sh.Replicas, sh.PreferredLeader) {
		sh.PreferredLeader = ""
		if len(sh.Replicas) > 0 {
			sh.PreferredLeader = sh.Replicas[0]
		}
	}
}

// PreferredLeader is the replica of sh that should lead it: the first of
// its preferred leader, then its replicas in list order, that is one of
// voters and that mayLead accepts; "" if none is.
func PreferredLeader(sh *metapb.Shard, voters []string, mayLead func(id string) bool) string {
	for _, id := range append([]string{sh.PreferredLeader}, sh.Replicas...) {
		if id != "" && slices.Contains(voters, id) && mayLead(id) {
			return id
		}
	}
	return ""
}
