package control

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// testMap builds a map from a compact spec: nodes as "id" (member),
// "id-" (draining) or "id x" (removed); shards as "n1,n2,n3>n2" (replicas,
// then the preferred leader after '>', else the first replica), numbered
// from 1.
func testMap(rf int, nodes []string, shards ...string) *metapb.ClusterMap {
	cm := &metapb.ClusterMap{ClusterId: "c", ReplicationFactor: uint32(rf)}
	for _, spec := range nodes {
		st := member
		switch {
		case strings.HasSuffix(spec, "-"):
			st, spec = draining, strings.TrimSuffix(spec, "-")
		case strings.HasSuffix(spec, " x"):
			st, spec = removed, strings.TrimSuffix(spec, " x")
		}
		cm.Nodes = append(cm.Nodes, &metapb.Node{Id: spec, Address: spec + ":1", Membership: st})
	}
	for i, spec := range shards {
		reps, pref, _ := strings.Cut(spec, ">")
		sh := &metapb.Shard{Id: uint32(i + 1), PreferredLeader: pref}
		if reps != "" {
			sh.Replicas = strings.Split(reps, ",")
		}
		NormalizeShard(sh)
		cm.Shards = append(cm.Shards, sh)
	}
	return cm
}

func stepString(s Step) string {
	switch s.Kind {
	case StepNone:
		return "none"
	case StepSetReplicas:
		return fmt.Sprintf("set %d %s>%s", s.Shard.Id, strings.Join(s.Shard.Replicas, ","), s.Shard.PreferredLeader)
	case StepHandOffMeta:
		return "hand off meta"
	case StepRemoveNode:
		return "remove " + s.Node
	}
	return "?"
}

// TestNextPlacement: given a map, the one change the placement controller
// makes next.
func TestNextPlacement(t *testing.T) {
	three := []string{"n1", "n2", "n3"}
	for _, tc := range []struct {
		name string
		cm   *metapb.ClusterMap
		self string
		want string
	}{
		{"no map yet", &metapb.ClusterMap{}, "n1", "none"},
		{"balanced", testMap(3, three, "n1,n2,n3>n1", "n1,n2,n3>n2", "n1,n2,n3>n3"), "n1", "none"},
		{"no members", testMap(1, []string{"n1-"}, "n1"), "n1", "none"},
		// A draining node's replica goes to the least loaded member that
		// lacks the shard, and its preference goes along.
		{"replace a draining replica", testMap(2, []string{"n1", "n2", "n3", "n4-"}, "n1,n4>n4", "n2,n3", "n1,n2"),
			"n1", "set 1 n1,n3>n3"},
		// A node removed for good: replaced just the same.
		{"replace a removed replica", testMap(2, []string{"n1", "n2", "n3 x"}, "n1,n3>n3", "n1,n2>n2"),
			"n1", "set 1 n1,n2>n2"},
		// Nowhere to go: a removed node's replica is dropped...
		{"drop a removed replica", testMap(2, []string{"n1", "n2 x"}, "n1,n2>n2"), "n1", "set 1 n1>n1"},
		// ... a draining node's kept until a node joins.
		{"keep a draining replica with nowhere to go", testMap(2, []string{"n1", "n2-"}, "n1,n2"), "n1", "none"},
		{"drop a surplus draining replica", testMap(1, []string{"n1", "n2-"}, "n1,n2>n2"), "n1", "set 1 n1>n1"},
		{"fill up to the replication factor", testMap(3, three, "n1,n2,n3", "n1,n2>n2", "n1,n2,n3>n3"), "n1", "set 2 n1,n2,n3>n2"},
		// A node joined: one replica moves from the most loaded (first by
		// id among equals) to it, with its preference.
		{"balance replicas onto a new node", testMap(3, []string{"n1", "n2", "n3", "n4"}, "n1,n2,n3>n1", "n1,n2,n3>n2", "n1,n2,n3>n3"),
			"n1", "set 1 n4,n2,n3>n4"},
		{"balance preferred leaders", testMap(3, three, "n1,n2,n3>n1", "n1,n2,n3>n1", "n1,n2,n3>n1"),
			"n1", "set 1 n1,n2,n3>n2"},
		{"remove a drained node", testMap(2, []string{"n1", "n2", "n3-"}, "n1,n2", "n2,n1>n2"), "n1", "remove n3"},
		{"the drained meta leader hands off", testMap(2, []string{"n1", "n2", "n3-"}, "n1,n2", "n2,n1>n2"), "n3", "hand off meta"},
		// Replicas first: a drained node leaves only once nothing else is
		// to do.
		{"replicas before removal", testMap(2, []string{"n1", "n2", "n3-", "n4-"}, "n1,n2", "n1,n4>n4"), "n1", "set 2 n1,n2>n2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stepString(NextPlacement(tc.cm, tc.self)); got != tc.want {
				t.Fatalf("next step %q, want %q", got, tc.want)
			}
		})
	}
}

// TestPlacementLeavesTheMapAlone: planning reads the map, never writes it.
func TestPlacementLeavesTheMapAlone(t *testing.T) {
	cm := testMap(3, []string{"n1", "n2", "n3", "n4-"}, "n1,n2,n4>n4", "n1,n2>n2")
	before := fmt.Sprint(cm.Shards)
	if PlanPlacement(cm) == nil {
		t.Fatal("no plan")
	}
	if after := fmt.Sprint(cm.Shards); after != before {
		t.Fatalf("the map changed: %s -> %s", before, after)
	}
}

func TestNormalizeShard(t *testing.T) {
	for _, tc := range []struct {
		replicas   []string
		pref, want string
	}{
		{[]string{"a", "b"}, "b", "b"},
		{[]string{"a", "b"}, "", "a"},  // from before the field
		{[]string{"a", "b"}, "c", "a"}, // not a replica
		{nil, "c", ""},
	} {
		sh := &metapb.Shard{Replicas: tc.replicas, PreferredLeader: tc.pref}
		NormalizeShard(sh)
		if sh.PreferredLeader != tc.want || !reflect.DeepEqual(sh.Replicas, tc.replicas) {
			t.Errorf("%v>%q: got %q, want %q", tc.replicas, tc.pref, sh.PreferredLeader, tc.want)
		}
	}
}
