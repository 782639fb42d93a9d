package control

import (
	"fmt"
	"slices"
	"testing"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// slotMap is a map of shards 1..shards, slot i on shard slots[i], the
// shards in retiring retiring; every shard has replica n1.
func slotMap(slots []uint32, shards int, retiring ...uint32) *metapb.ClusterMap {
	cm := testMap(1, []string{"n1"})
	for id := uint32(1); id <= uint32(shards); id++ {
		cm.Shards = append(cm.Shards, &metapb.Shard{Id: id, Replicas: []string{"n1"}, PreferredLeader: "n1", Retiring: slices.Contains(retiring, id)})
	}
	cm.Slots = slices.Clone(slots)
	return cm
}

// TestPlanSlots: given a map (and the tasks per slot), the slot moves the
// rebalance records.
func TestPlanSlots(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cm    *metapb.ClusterMap
		load  map[uint32]uint64
		moves []*metapb.SlotMove // under way
		want  string
	}{
		{"balanced", slotMap([]uint32{1, 2, 1, 2}, 2), nil, nil, "[]"},
		{"within one", slotMap([]uint32{1, 2, 1}, 2), nil, nil, "[]"},
		{"no slots", slotMap(nil, 2), nil, nil, "[]"},
		// A new shard: the donor's first slots by id (no load).
		{"a new shard", slotMap([]uint32{1, 1, 1, 1}, 2), nil, nil, "[{0 2} {1 2}]"},
		// Quotas 2, 2, 1: the receivers take turns, the furthest under
		// quota first, ties by id.
		{"quota with a remainder", slotMap([]uint32{3, 3, 3, 3, 3}, 3), nil, nil, "[{0 1} {1 2} {2 1} {3 2}]"},
		// By load: the heaviest goes while the receiver stays lighter, else
		// the lightest.
		{"the heaviest first", slotMap([]uint32{1, 1, 1, 1}, 2), map[uint32]uint64{0: 1, 1: 2, 2: 4, 3: 3}, nil, "[{2 2} {0 2}]"},
		{"a slot too heavy to move stays", slotMap([]uint32{1, 1, 1, 1}, 2), map[uint32]uint64{0: 1, 1: 2, 2: 10, 3: 3}, nil, "[{0 2} {1 2}]"},
		// A retiring shard gives up every slot, to the emptiest receiver.
		{"off a retiring shard", slotMap([]uint32{1, 2, 3, 3}, 3, 3), nil, nil, "[{2 1} {3 2}]"},
		{"every shard retiring", slotMap([]uint32{1, 1}, 1, 1), nil, nil, "[]"},
		// A slot under way counts where it goes and is not planned again.
		{"a move under way", slotMap([]uint32{1, 1, 1, 1}, 2), nil, []*metapb.SlotMove{{Slot: 0, From: 1, To: 2}}, "[{1 2}]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cm.Moves = tc.moves
			if got := fmt.Sprint([]Move(PlanSlots(tc.cm, tc.load))); got != tc.want {
				t.Fatalf("plan %s, want %s", got, tc.want)
			}
		})
	}
}

func TestPlanMoveOffRetiring(t *testing.T) {
	// Shard 1 is over quota too, but only the retiring shard's slots move.
	cm := slotMap([]uint32{1, 1, 1, 1, 3, 3}, 3, 3)
	got := PlanMoveOffRetiring(cm)
	if want := map[uint32][]uint32{2: {4, 5}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("moves %v, want %v", got, want)
	}
	if got := PlanMoveOffRetiring(slotMap([]uint32{1, 2}, 2)); len(got) != 0 {
		t.Fatalf("nothing retiring, yet moves %v", got)
	}
}

func TestNextRetiring(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cm    *metapb.ClusterMap
		kind  RetiringKind
		shard uint32
	}{
		{"none", slotMap([]uint32{1, 2}, 2), RetiringNone, 0},
		{"slots to move", slotMap([]uint32{1, 2}, 2, 2), RetiringMoveOff, 2},
		{"emptied", slotMap([]uint32{1, 1}, 2, 2), RetiringDrop, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if kind, shard := NextRetiring(tc.cm); kind != tc.kind || shard != tc.shard {
				t.Fatalf("got %d %d, want %d %d", kind, shard, tc.kind, tc.shard)
			}
		})
	}
}

func TestPlanNewShard(t *testing.T) {
	for _, tc := range []struct {
		name string
		cm   *metapb.ClusterMap
		want string
	}{
		{"no members", testMap(3, []string{"n1-"}), "<nil>"},
		// The least loaded members, sorted; the preferred leader the one
		// preferred least often.
		{"least loaded", testMap(2, []string{"n1", "n2", "n3"}, "n1,n2>n1", "n1,n3>n1"), "3 [n2 n3]>n2 initial [n2 n3]"},
		{"fewer members than the factor", testMap(3, []string{"n1", "n2"}), "1 [n1 n2]>n1 initial [n1 n2]"},
		// Ids are never reused: past the map's last.
		{"after a dropped shard", func() *metapb.ClusterMap {
			cm := testMap(1, []string{"n1"}, "n1")
			cm.LastShard = 7
			return cm
		}(), "8 [n1]>n1 initial [n1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := "<nil>"
			if sh := PlanNewShard(tc.cm); sh != nil {
				got = fmt.Sprintf("%d %v>%s initial %v", sh.Id, sh.Replicas, sh.PreferredLeader, sh.InitialReplicas)
			}
			if got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}
