package cluster

import (
	"fmt"
	"io"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

func peers(n int) []Peer {
	var ps []Peer
	for i := 1; i <= n; i++ {
		ps = append(ps, Peer{ID: fmt.Sprintf("n%d", i), Address: fmt.Sprintf("127.0.0.1:%d", 7100+i)})
	}
	return ps
}

func TestInitialMapSpreadsReplicasAndPreferredLeaders(t *testing.T) {
	for _, tc := range []struct{ nodes, shards, rf, wantRF int }{
		{3, 8, 3, 3}, {5, 10, 3, 3}, {1, 4, 3, 1}, {2, 6, 3, 2},
	} {
		t.Run(fmt.Sprintf("%dn/%ds/rf%d", tc.nodes, tc.shards, tc.rf), func(t *testing.T) {
			cm := InitialMap("c", peers(tc.nodes), tc.shards, tc.rf)
			if int(cm.ReplicationFactor) != tc.wantRF {
				t.Fatalf("rf %d, want %d", cm.ReplicationFactor, tc.wantRF)
			}
			replicas, firsts := map[string]int{}, map[string]int{}
			for _, s := range cm.Shards {
				if len(s.Replicas) != tc.wantRF {
					t.Fatalf("shard %d has %d replicas", s.Id, len(s.Replicas))
				}
				seen := map[string]bool{}
				for _, r := range s.Replicas {
					if seen[r] {
						t.Fatalf("shard %d has %s twice", s.Id, r)
					}
					seen[r] = true
					replicas[r]++
				}
				firsts[s.PreferredLeader]++
			}
			spread := func(m map[string]int) int {
				lo, hi := 1<<30, 0
				for _, p := range peers(tc.nodes) {
					lo, hi = min(lo, m[p.ID]), max(hi, m[p.ID])
				}
				return hi - lo
			}
			if spread(replicas) > 1 || spread(firsts) > 1 {
				t.Fatalf("uneven: replicas %v, preferred leaders %v", replicas, firsts)
			}
			perShard := map[uint32]int{}
			for _, sh := range cm.Slots {
				perShard[sh]++
			}
			if len(cm.Slots) != 1024 || len(perShard) != tc.shards {
				t.Fatalf("slots %d over %d shards", len(cm.Slots), len(perShard))
			}
		})
	}
}

func TestMetaFSMInitIsIdempotentAndSnapshots(t *testing.T) {
	f := newMetaFSM()
	apply := func(i uint64, cmd *metapb.Command) {
		data, _ := proto.Marshal(cmd)
		f.Apply(&raft.Log{Index: i, Type: raft.LogCommand, Data: data})
	}
	first := InitialMap("a", peers(3), 4, 3)
	apply(1, &metapb.Command{Op: metapb.Op_OP_INIT, Init: first})
	apply(2, &metapb.Command{Op: metapb.Op_OP_INIT, Init: InitialMap("b", peers(5), 9, 3)})
	apply(3, &metapb.Command{Op: metapb.Op_OP_UPDATE_NODE, Node: &metapb.Node{Id: "n2", GossipAddress: "127.0.0.1:7202"}})
	cm := f.Map()
	if cm.ClusterId != "a" || len(cm.Shards) != 4 || len(cm.Nodes) != 3 {
		t.Fatalf("second init was applied: %v", cm)
	}
	if n := control.FindNode(cm, "n2"); n.GossipAddress != "127.0.0.1:7202" || n.Address != "127.0.0.1:7102" {
		t.Fatalf("update node: %v", n)
	}
	if cm.Epoch != 3 {
		t.Fatalf("epoch %d, want 3", cm.Epoch)
	}

	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := newMetaFSM()
	if err := g.Restore(sink); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(g.Map(), cm) {
		t.Fatalf("restored map differs")
	}
	if err := g.Restore(&memSink{data: []byte{0xff, 0xff, 0xff}}); err == nil {
		t.Fatal("garbage snapshot restored without error")
	}
}

type memSink struct {
	data []byte
	off  int
}

func (s *memSink) Write(p []byte) (int, error) { s.data = append(s.data, p...); return len(p), nil }
func (s *memSink) Read(p []byte) (int, error) {
	if s.off >= len(s.data) {
		return 0, io.EOF
	}
	n := copy(p, s.data[s.off:])
	s.off += n
	return n, nil
}
func (s *memSink) Close() error  { return nil }
func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { return nil }
