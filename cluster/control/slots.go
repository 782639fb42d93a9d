package control

import (
	"cmp"
	"slices"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// PlanNewShard places a new shard: the next id, the replication factor's
// least loaded members (ties by id), and as preferred leader the one of
// them that is preferred for the fewest shards. Nil when no node is a
// member. Deterministic in the map.
func PlanNewShard(cm *metapb.ClusterMap) *metapb.Shard {
	var members []string
	for _, node := range cm.Nodes {
		if node.Membership == member {
			members = append(members, node.Id)
		}
	}
	if len(members) == 0 {
		return nil
	}
	load, preferred := map[string]int{}, map[string]int{}
	id := LastShard(cm)
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

// Move is one slot of a plan and the shard it goes to.
type Move struct {
	Slot uint32
	To   uint32
}

// SlotPlan is a list of planned slot moves.
type SlotPlan []Move

// ByTarget groups the plan's slots by the shard they go to.
func (p SlotPlan) ByTarget() map[uint32][]uint32 {
	out := map[uint32][]uint32{}
	for _, m := range p {
		out[m.To] = append(out[m.To], m.Slot)
	}
	return out
}

// PlanSlots plans the moves that leave the serving (not retiring) shards
// with slot counts within one of each other and retiring shards with none.
// A slot that is moving stays out of the plan. Donors give up, among their
// slots, first those of retiring shards, then the heaviest (by load, tasks
// per slot; nil balances by count) while the receiver is lighter than the
// donor would be after it, else the lightest: the tasks even out as the
// counts do, and the copies stay small when they cannot. Deterministic in
// its inputs.
func PlanSlots(cm *metapb.ClusterMap, load map[uint32]uint64) SlotPlan {
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
		if mv := MoveOfSlot(cm, uint32(s)); mv != nil {
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
	var plan SlotPlan
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
		if sh := FindShard(cm, id); sh != nil && sh.Retiring {
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
			plan = append(plan, Move{Slot: s, To: to})
			count[d]--
			count[to]++
			tasks[d] -= load[s]
			tasks[to] += load[s]
		}
	}
	return plan
}

// PlanMoveOffRetiring is the part of PlanSlots that moves the slots of
// retiring shards, grouped by the shard they go to.
func PlanMoveOffRetiring(cm *metapb.ClusterMap) map[uint32][]uint32 {
	out := map[uint32][]uint32{}
	for to, slots := range PlanSlots(cm, nil).ByTarget() {
		for _, s := range slots {
			if sh := FindShard(cm, cm.Slots[s]); sh != nil && sh.Retiring {
				out[to] = append(out[to], s)
			}
		}
	}
	return out
}

// RetiringKind is what the slot mover does for retiring shards when no
// move is under way.
type RetiringKind int

const (
	// RetiringNone: no shard is retiring.
	RetiringNone RetiringKind = iota
	// RetiringMoveOff: a retiring shard still serves slots: move them
	// away (PlanMoveOffRetiring).
	RetiringMoveOff
	// RetiringDrop: a retiring shard serves no slot: drop it from the map
	// (OP_DROP_SHARD); its replicas then retire their groups.
	RetiringDrop
)

// NextRetiring is the slot mover's next chore for the first retiring shard
// in the map, and that shard's id.
func NextRetiring(cm *metapb.ClusterMap) (RetiringKind, uint32) {
	for _, sh := range cm.Shards {
		if !sh.Retiring {
			continue
		}
		if slices.Contains(cm.Slots, sh.Id) {
			return RetiringMoveOff, sh.Id
		}
		return RetiringDrop, sh.Id
	}
	return RetiringNone, 0
}
