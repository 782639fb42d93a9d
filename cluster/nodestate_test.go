package cluster

import (
	"bytes"
	"io"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// TestNodeStateIsTyped: the meta log records membership as an enum. An
// entry of the older format (the name only) applies as the state it names,
// every node in the map carries both (the name for older readers), and a
// state no version knows is refused alike on every replica instead of
// being stored as a free string ("bogus" was stored).
func TestNodeStateIsTyped(t *testing.T) {
	cm := InitialMap("c", []Peer{{ID: "n1", Address: "a:1"}, {ID: "n2", Address: "a:2"}, {ID: "n3", Address: "a:3"}}, 2, 3)
	for _, n := range cm.Nodes {
		if n.Membership != NodeMember || n.State != "member" {
			t.Fatalf("initial map node %s: membership %v, state %q", n.Id, n.Membership, n.State)
		}
	}
	apply := func(node *metapb.Node) bool {
		return applyMeta(cm, &metapb.Command{Op: metapb.Op_OP_SET_NODE_STATE, Node: node})
	}
	if !apply(&metapb.Node{Id: "n2", State: "draining"}) { // the older format
		t.Fatal("a state by name was not applied")
	}
	if n := control.FindNode(cm, "n2"); n.Membership != NodeDraining || n.State != "draining" {
		t.Fatalf("n2 after an old-format entry: %v %q", n.Membership, n.State)
	}
	if !apply(withState(&metapb.Node{Id: "n2"}, NodeRemoved)) {
		t.Fatal("a typed state was not applied")
	}
	if n := control.FindNode(cm, "n2"); n.Membership != NodeRemoved || n.State != "removed" {
		t.Fatalf("n2 after a typed entry: %v %q", n.Membership, n.State)
	}
	for _, bad := range []*metapb.Node{{Id: "n3", State: "bogus"}, {Id: "n3"}, {Id: "n3", Membership: 42}} {
		if apply(bad) {
			t.Errorf("state %+v applied", bad)
		}
		if n := control.FindNode(cm, "n3"); n.Membership != NodeMember || n.State != "member" {
			t.Fatalf("n3 after %+v: %v %q", bad, n.Membership, n.State)
		}
	}
	// A node first heard of by gossip is a member.
	applyMeta(cm, &metapb.Command{Op: metapb.Op_OP_UPDATE_NODE, Node: &metapb.Node{Id: "n4", Address: "a:4"}})
	if n := control.FindNode(cm, "n4"); n.Membership != NodeMember || n.State != "member" {
		t.Fatalf("n4: %v %q", n.Membership, n.State)
	}
}

// TestMetaSnapshotFromBeforeTheEnumRestores: a snapshot of a map whose
// nodes carry only the state's name restores with the typed state.
func TestMetaSnapshotFromBeforeTheEnumRestores(t *testing.T) {
	old := &metapb.ClusterMap{ClusterId: "c", Nodes: []*metapb.Node{
		{Id: "n1", Address: "a:1", State: "member"},
		{Id: "n2", Address: "a:2", State: "draining"},
		{Id: "n3", Address: "a:3", State: "removed"},
	}}
	data, err := proto.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	f := newMetaFSM()
	if err := f.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		t.Fatal(err)
	}
	want := map[string]metapb.NodeState{"n1": NodeMember, "n2": NodeDraining, "n3": NodeRemoved}
	for _, n := range f.Map().Nodes {
		if n.Membership != want[n.Id] {
			t.Errorf("%s: membership %v, want %v", n.Id, n.Membership, want[n.Id])
		}
	}
	// And the entry format: an old OP_SET_NODE_STATE through Apply.
	cmd, _ := proto.Marshal(&metapb.Command{Op: metapb.Op_OP_SET_NODE_STATE, Node: &metapb.Node{Id: "n1", State: "removed"}})
	if changed, _ := f.Apply(&raft.Log{Index: 9, Type: raft.LogCommand, Data: cmd}).(bool); !changed {
		t.Fatal("old-format entry not applied")
	}
	if n := control.FindNode(f.Map(), "n1"); n.Membership != NodeRemoved {
		t.Fatalf("n1: %v", n.Membership)
	}
}
