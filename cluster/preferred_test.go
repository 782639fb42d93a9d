package cluster

import (
	"bytes"
	"io"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// TestPreferredLeaderIsAField: the preferred leader is recorded as its own
// field, so a replica list in another order keeps it (it was the list's
// first entry, while meta.proto said the order meant nothing); records from before the field take their first replica; a
// preference for a node that is not a replica falls back the same way.
func TestPreferredLeaderIsAField(t *testing.T) {
	cm := InitialMap("c", peers(3), 3, 3)
	for _, s := range cm.Shards {
		if s.PreferredLeader != s.Replicas[0] {
			t.Fatalf("initial shard %d: preferred %q, replicas %v", s.Id, s.PreferredLeader, s.Replicas)
		}
	}
	set := func(s *metapb.Shard) {
		if !applyMeta(cm, &metapb.Command{Op: metapb.Op_OP_SET_REPLICAS, Shard: s}) {
			t.Fatalf("set %v not applied", s)
		}
	}
	set(&metapb.Shard{Id: 1, Replicas: []string{"n1", "n2", "n3"}, PreferredLeader: "n3"})
	set(&metapb.Shard{Id: 1, Replicas: []string{"n2", "n3", "n1"}, PreferredLeader: "n3"}) // reordered
	if got := control.FindShard(cm, 1).PreferredLeader; got != "n3" {
		t.Fatalf("after a reorder: preferred %q, want n3", got)
	}
	set(&metapb.Shard{Id: 1, Replicas: []string{"n2", "n1", "n3"}}) // older format: the first one
	if got := control.FindShard(cm, 1).PreferredLeader; got != "n2" {
		t.Fatalf("older-format entry: preferred %q, want n2", got)
	}
	set(&metapb.Shard{Id: 1, Replicas: []string{"n1", "n3"}, PreferredLeader: "n2"}) // not a replica
	if got := control.FindShard(cm, 1).PreferredLeader; got != "n1" {
		t.Fatalf("preference for a non-replica: preferred %q, want n1", got)
	}

	// A snapshot from before the field.
	old := &metapb.ClusterMap{ClusterId: "c", Shards: []*metapb.Shard{{Id: 1, Replicas: []string{"n3", "n1"}}}}
	data, _ := proto.Marshal(old)
	f := newMetaFSM()
	if err := f.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		t.Fatal(err)
	}
	if got := control.FindShard(f.Map(), 1).PreferredLeader; got != "n3" {
		t.Fatalf("old snapshot: preferred %q, want n3", got)
	}
}

// TestPlacementMovesPreferenceWithReplica: replacing the preferred replica
// of a leaving node gives its replacement the preference, and balancing
// preferred leaders changes the field, not the replica list.
func TestPlacementMovesPreferenceWithReplica(t *testing.T) {
	cm := InitialMap("c", peers(4), 4, 3)
	settle(t, cm)
	before := map[uint32][]string{}
	for _, s := range cm.Shards {
		before[s.Id] = slices.Clone(s.Replicas)
	}
	var victim *metapb.Shard
	for _, s := range cm.Shards {
		if s.PreferredLeader == "n2" {
			victim = s
		}
	}
	if victim == nil {
		t.Fatal("n2 is nobody's preferred leader")
	}
	id := victim.Id
	applyMeta(cm, &metapb.Command{Op: metapb.Op_OP_SET_NODE_STATE, Node: withState(&metapb.Node{Id: "n2"}, NodeDraining)})
	plan := control.PlanPlacement(cm)
	if plan == nil {
		t.Fatal("no plan for a draining node")
	}
	i := slices.Index(control.FindShard(cm, plan.Id).Replicas, "n2")
	if i < 0 {
		t.Fatalf("plan %v is not for a shard on n2", plan)
	}
	if plan.Id == id && plan.PreferredLeader != plan.Replicas[i] {
		t.Fatalf("n2's preference went to %q, not to its replacement %q", plan.PreferredLeader, plan.Replicas[i])
	}
	settle(t, cm)
	for _, s := range cm.Shards {
		if slices.Contains(s.Replicas, "n2") || !slices.Contains(s.Replicas, s.PreferredLeader) {
			t.Fatalf("after draining n2: shard %d replicas %v preferred %q", s.Id, s.Replicas, s.PreferredLeader)
		}
	}
}
