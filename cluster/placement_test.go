package cluster

import (
	"fmt"
	"slices"
	"testing"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// settle applies planPlacement until it has nothing left to do.
func settle(t *testing.T, cm *metapb.ClusterMap) int {
	t.Helper()
	steps := 0
	for plan := control.PlanPlacement(cm); plan != nil; plan = control.PlanPlacement(cm) {
		applyMeta(cm, &metapb.Command{Op: metapb.Op_OP_SET_REPLICAS, Shard: plan})
		if steps++; steps > 1000 {
			t.Fatal("placement does not converge")
		}
	}
	return steps
}

func loads(cm *metapb.ClusterMap) map[string]int {
	l := map[string]int{}
	for _, s := range cm.Shards {
		for _, r := range s.Replicas {
			l[r]++
		}
	}
	return l
}

func TestPlacementGrowsShrinksAndStaysBalanced(t *testing.T) {
	cm := InitialMap("c", peers(3), 8, 3)
	if settle(t, cm) != 0 {
		t.Fatal("the initial map is already balanced, yet placement changed it")
	}
	for _, id := range []string{"n4", "n5"} {
		applyMeta(cm, &metapb.Command{Op: metapb.Op_OP_UPDATE_NODE, Node: &metapb.Node{Id: id, Address: id + ":1", Membership: NodeMember}})
	}
	moves := settle(t, cm)
	l := loads(cm)
	for _, id := range []string{"n1", "n2", "n3", "n4", "n5"} {
		if l[id] < 4 || l[id] > 5 { // 24 replicas over 5 nodes: 4 or 5 each
			t.Fatalf("after growing (%d moves): loads %v", moves, l)
		}
	}
	firsts := map[string]int{}
	for _, s := range cm.Shards {
		if len(s.Replicas) != 3 || len(slices.Compact(slices.Sorted(slices.Values(s.Replicas)))) != 3 {
			t.Fatalf("shard %d replicas %v", s.Id, s.Replicas)
		}
		firsts[s.PreferredLeader]++
	}
	for _, id := range []string{"n1", "n2", "n3", "n4", "n5"} {
		if firsts[id] < 1 || firsts[id] > 2 { // 8 preferred leaders over 5 nodes
			t.Fatalf("preferred leaders %v, want 1 or 2 each", firsts)
		}
	}

	// Drain n2: its replicas move to the others, RF kept.
	applyMeta(cm, &metapb.Command{Op: metapb.Op_OP_SET_NODE_STATE, Node: &metapb.Node{Id: "n2", Membership: NodeDraining}})
	settle(t, cm)
	if control.HostsAny(cm, "n2") {
		t.Fatalf("n2 still hosts replicas: %v", cm.Shards)
	}
	l = loads(cm)
	for _, id := range []string{"n1", "n3", "n4", "n5"} {
		if l[id] != 6 {
			t.Fatalf("after draining n2: loads %v, want 6 each", l)
		}
	}

	// With only RF members left, draining one more keeps its replicas
	// (nowhere to go) rather than dropping below the replication factor.
	for _, id := range []string{"n4", "n5"} {
		applyMeta(cm, &metapb.Command{Op: metapb.Op_OP_SET_NODE_STATE, Node: &metapb.Node{Id: id, Membership: NodeDraining}})
	}
	settle(t, cm)
	applyMeta(cm, &metapb.Command{Op: metapb.Op_OP_SET_NODE_STATE, Node: &metapb.Node{Id: "n3", Membership: NodeDraining}})
	settle(t, cm)
	for _, s := range cm.Shards {
		if len(s.Replicas) != 3 {
			t.Fatalf("shard %d dropped to %v", s.Id, s.Replicas)
		}
	}
	if fmt.Sprint(loads(cm)["n1"]) != "8" {
		t.Fatalf("loads %v", loads(cm))
	}
}
