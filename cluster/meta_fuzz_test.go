package cluster

import (
	"bytes"
	"io"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// smallMap is InitialMap with 8 hash slots instead of 1024: seeds stay
// small, so the fuzzer minimizes new inputs quickly.
func smallMap(nodes, shards int) *metapb.ClusterMap {
	cm := InitialMap("c", peers(nodes), shards, 3)
	for i := range cm.Slots[:8] {
		cm.Slots[i] = uint32(i%shards) + 1
	}
	cm.Slots = cm.Slots[:8]
	return cm
}

// lookUpEverything exercises what the node does with a map: routing, shard
// and node look-ups, and a snapshot.
func lookUpEverything(t *testing.T, f *metaFSM) {
	cm := f.Map()
	for _, g := range []string{"", "g", "jobs", "\x00"} {
		if id := shardOf(cm, g); id != 0 {
			control.FindShard(cm, id)
		}
	}
	for _, s := range cm.Shards {
		control.FindShard(cm, s.Id)
		for _, r := range s.Replicas {
			control.FindNode(cm, r)
		}
	}
	if _, err := f.Snapshot(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
}

// FuzzMetaRestore: the meta group's snapshot reader never panics; garbage
// is an error that leaves the map as it was; what it accepts snapshots back
// to an equal map.
func FuzzMetaRestore(f *testing.F) {
	for _, cm := range []*metapb.ClusterMap{smallMap(3, 4), smallMap(5, 10), {}} {
		b, err := proto.Marshal(cm)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x22, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		m := newMetaFSM()
		before := smallMap(3, 2)
		m.cm = proto.Clone(before).(*metapb.ClusterMap)
		if err := m.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
			if !proto.Equal(m.Map(), before) {
				t.Fatal("failed restore changed the map")
			}
			return
		}
		lookUpEverything(t, m)
		snap, err := m.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		m2 := newMetaFSM()
		if err := m2.Restore(io.NopCloser(bytes.NewReader(snap.(metaSnapshot)))); err != nil {
			t.Fatalf("re-snapshot of an accepted map: %v", err)
		}
		if !proto.Equal(m.Map(), m2.Map()) {
			t.Fatal("map changed through a snapshot")
		}
	})
}

// FuzzApplyMeta: any decodable meta command with a known op applies to a
// map without panicking (an unknown op panics on purpose: see applyMeta),
// and the map stays usable.
func FuzzApplyMeta(f *testing.F) {
	init := smallMap(3, 4)
	for _, cmd := range []*metapb.Command{
		{Op: metapb.Op_OP_INIT, Init: init},
		{Op: metapb.Op_OP_INIT},
		{Op: metapb.Op_OP_UPDATE_NODE, Node: &metapb.Node{Id: "n4", Address: "127.0.0.1:7104"}},
		{Op: metapb.Op_OP_UPDATE_NODE, Node: &metapb.Node{Id: "n1", HttpAddress: "127.0.0.1:8101"}},
		{Op: metapb.Op_OP_UPDATE_NODE},
		{Op: metapb.Op_OP_SET_REPLICAS, Shard: &metapb.Shard{Id: 2, Replicas: []string{"n1", "n4"}}},
		{Op: metapb.Op_OP_SET_REPLICAS, Shard: &metapb.Shard{Id: 99}},
		{Op: metapb.Op_OP_SET_REPLICAS},
		{Op: metapb.Op_OP_SET_NODE_STATE, Node: &metapb.Node{Id: "n2", State: "draining"}},
		{Op: metapb.Op_OP_SET_NODE_STATE, Node: &metapb.Node{Id: "n3", Membership: NodeRemoved}},
		{Op: metapb.Op_OP_SET_NODE_STATE, Node: &metapb.Node{Id: "n3", State: "bogus"}},
		{Op: metapb.Op_OP_SET_NODE_STATE},
	} {
		b, err := proto.Marshal(cmd)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, true)
		f.Add(b, false)
	}
	f.Fuzz(func(t *testing.T, data []byte, fresh bool) {
		var cmd metapb.Command
		if proto.Unmarshal(data, &cmd) != nil {
			return
		}
		switch cmd.Op {
		case metapb.Op_OP_INIT, metapb.Op_OP_UPDATE_NODE, metapb.Op_OP_SET_REPLICAS, metapb.Op_OP_SET_NODE_STATE:
		default:
			return // applyMeta panics on unknown ops by design
		}
		m := newMetaFSM()
		if !fresh {
			m.cm = proto.Clone(init).(*metapb.ClusterMap)
		}
		before := proto.Clone(m.cm)
		changed := applyMeta(m.cm, &cmd)
		if !changed && !proto.Equal(before, m.cm) {
			t.Fatalf("%v reported no change but changed the map", &cmd)
		}
		lookUpEverything(t, m)
	})
}
