package control

import (
	"slices"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// StepKind is what the placement controller does next.
type StepKind int

const (
	// StepNone: the placement is as it should be.
	StepNone StepKind = iota
	// StepSetReplicas: record Shard's new replica set and preferred
	// leader (OP_SET_REPLICAS).
	StepSetReplicas
	// StepHandOffMeta: the meta leader itself is drained; it hands the
	// meta group's leadership off, and the next leader removes it.
	StepHandOffMeta
	// StepRemoveNode: Node is drained (no replica left in the map): take
	// it out of the meta group's configuration, then record it removed.
	StepRemoveNode
)

// Step is one change the placement controller makes.
type Step struct {
	Kind  StepKind
	Shard *metapb.Shard // StepSetReplicas
	Node  string        // StepRemoveNode
}

// NextPlacement is the placement controller's next step on the meta leader
// self: first a replica set to record (PlanPlacement), else the retirement
// of a drained node that hosts no replica any more. Deterministic in the
// map.
func NextPlacement(cm *metapb.ClusterMap, self string) Step {
	if cm.ClusterId == "" {
		return Step{}
	}
	if plan := PlanPlacement(cm); plan != nil {
		return Step{Kind: StepSetReplicas, Shard: plan}
	}
	for _, node := range cm.Nodes {
		if node.Membership != draining || HostsAny(cm, node.Id) {
			continue
		}
		if node.Id == self {
			return Step{Kind: StepHandOffMeta}
		}
		return Step{Kind: StepRemoveNode, Node: node.Id}
	}
	return Step{}
}

// PlanPlacement returns the next replica set to record, or nil when the
// placement is as it should be. It is deterministic in the map. In order:
// replace replicas on nodes that are leaving, fill shards up to the
// replication factor, move one replica from the most to the least loaded
// member, and last even out the preferred leaders.
func PlanPlacement(cm *metapb.ClusterMap) *metapb.Shard {
	var members []string
	state := map[string]metapb.NodeState{}
	for _, node := range cm.Nodes {
		state[node.Id] = node.Membership
		if node.Membership == member {
			members = append(members, node.Id)
		}
	}
	slices.Sort(members)
	if len(members) == 0 {
		return nil
	}
	load := map[string]int{}
	for _, s := range cm.Shards {
		for _, r := range s.Replicas {
			load[r]++
		}
	}
	// least loaded member not already in replicas.
	pick := func(replicas []string) string {
		best := ""
		for _, m := range members {
			if slices.Contains(replicas, m) {
				continue
			}
			if best == "" || load[m] < load[best] {
				best = m
			}
		}
		return best
	}
	rf := min(int(cm.ReplicationFactor), len(members))
	shards := slices.Clone(cm.Shards)
	slices.SortFunc(shards, func(a, b *metapb.Shard) int { return int(a.Id) - int(b.Id) })
	// 1. Replace replicas on nodes that are leaving.
	for _, s := range shards {
		for i, r := range s.Replicas {
			if state[r] == member {
				continue
			}
			next := slices.Clone(s.Replicas)
			if t := pick(s.Replicas); t != "" {
				next[i] = t
				// The replacement takes over the preference too: keeps the
				// preferred-leader spread.
				return replaced(s, next, r, t)
			} else if len(s.Replicas) > int(cm.ReplicationFactor) || (state[r] == removed && len(s.Replicas) > 1) {
				// Surplus, or on a node removed for good: drop it.
				next = slices.Delete(next, i, i+1)
			} else {
				continue // draining, nowhere to go: keep it until a node joins
			}
			return replaced(s, next, r, "")
		}
	}
	// 2. Fill shards below the replication factor.
	for _, s := range shards {
		if len(s.Replicas) < rf {
			if t := pick(s.Replicas); t != "" {
				return replaced(s, append(slices.Clone(s.Replicas), t), "", "")
			}
		}
	}
	// 3. Balance: move one replica from the most to the least loaded member
	// when they differ by more than one.
	most, least := members[0], members[0]
	for _, m := range members {
		if load[m] > load[most] {
			most = m
		}
		if load[m] < load[least] {
			least = m
		}
	}
	if load[most]-load[least] > 1 {
		for _, s := range shards {
			i := slices.Index(s.Replicas, most)
			if i >= 0 && !slices.Contains(s.Replicas, least) {
				next := slices.Clone(s.Replicas)
				next[i] = least
				return replaced(s, next, most, least)
			}
		}
	}
	// 4. Balance preferred leaders (which the leadership balancer
	// follows): move a preference, no Raft change.
	firsts := map[string]int{}
	for _, s := range shards {
		if len(s.Replicas) > 0 {
			firsts[s.PreferredLeader]++
		}
	}
	most, least = members[0], members[0]
	for _, m := range members {
		if firsts[m] > firsts[most] {
			most = m
		}
		if firsts[m] < firsts[least] {
			least = m
		}
	}
	if firsts[most]-firsts[least] <= 1 {
		return nil
	}
	for _, s := range shards {
		if len(s.Replicas) == 0 || s.PreferredLeader != most {
			continue
		}
		if slices.Contains(s.Replicas, least) {
			return &metapb.Shard{Id: s.Id, Replicas: slices.Clone(s.Replicas), PreferredLeader: least}
		}
	}
	return nil
}

// replaced is s with replicas next, where from (if set) was replaced by to
// (if set): a preference for from moves to to, and one for a replica that
// is gone moves to the first that is left.
func replaced(s *metapb.Shard, next []string, from, to string) *metapb.Shard {
	p := s.PreferredLeader
	if p == from && from != "" && to != "" {
		p = to
	}
	out := &metapb.Shard{Id: s.Id, Replicas: next, PreferredLeader: p}
	NormalizeShard(out)
	return out
}
