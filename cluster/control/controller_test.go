package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// fakeRuntime is a meta leader over a map, without Raft: it records what
// the controller asks for and applies the commands it proposes the way the
// meta state machine does for the ops the controller uses.
type fakeRuntime struct {
	cm         *metapb.ClusterMap
	calls      []string
	ignoreDrop bool
	notLeader  error               // Leading's answer
	gossip     map[string]Gossiped // nodes that gossip
	oldNode    error               // EveryNodeMovesSlots's answer
	load       map[uint32]uint64
	wakes      int
}

func (f *fakeRuntime) Map() *metapb.ClusterMap { return proto.Clone(f.cm).(*metapb.ClusterMap) }

func (f *fakeRuntime) Leading() error { return f.notLeader }

func (f *fakeRuntime) Propose(_ context.Context, cmd *metapb.Command) error {
	switch cmd.Op {
	case metapb.Op_OP_SET_REPLICAS:
		f.calls = append(f.calls, fmt.Sprintf("set %d %s>%s", cmd.Shard.Id, strings.Join(cmd.Shard.Replicas, ","), cmd.Shard.PreferredLeader))
		sh := FindShard(f.cm, cmd.Shard.Id)
		sh.Replicas, sh.PreferredLeader = slices.Clone(cmd.Shard.Replicas), cmd.Shard.PreferredLeader
	case metapb.Op_OP_SET_NODE_STATE:
		f.calls = append(f.calls, fmt.Sprintf("state %s %s", cmd.Node.Id, cmd.Node.State))
		FindNode(f.cm, cmd.Node.Id).Membership = cmd.Node.Membership
	case metapb.Op_OP_UPDATE_NODE:
		f.calls = append(f.calls, fmt.Sprintf("node %s %s %s %s", cmd.Node.Id, cmd.Node.Address, cmd.Node.GossipAddress, cmd.Node.HttpAddress))
		if FindNode(f.cm, cmd.Node.Id) == nil {
			f.cm.Nodes = append(f.cm.Nodes, &metapb.Node{Id: cmd.Node.Id})
		}
		FindNode(f.cm, cmd.Node.Id).Address = cmd.Node.Address
	case metapb.Op_OP_DROP_SHARD:
		f.calls = append(f.calls, fmt.Sprintf("drop %d", cmd.Shard.Id))
		if !f.ignoreDrop {
			f.cm.Shards = slices.DeleteFunc(f.cm.Shards, func(s *metapb.Shard) bool { return s.Id == cmd.Shard.Id })
		}
	case metapb.Op_OP_ADD_SHARD:
		f.calls = append(f.calls, fmt.Sprintf("add %d %s>%s", cmd.Shard.Id, strings.Join(cmd.Shard.Replicas, ","), cmd.Shard.PreferredLeader))
		f.cm.Shards = append(f.cm.Shards, proto.Clone(cmd.Shard).(*metapb.Shard))
		f.cm.LastShard = cmd.Shard.Id
	case metapb.Op_OP_RETIRE_SHARD:
		f.calls = append(f.calls, fmt.Sprintf("retire %d", cmd.Shard.Id))
		serving := 0
		for _, sh := range f.cm.Shards {
			if !sh.Retiring && sh.Id != cmd.Shard.Id {
				serving++
			}
		}
		if serving > 0 { // the last serving shard stays (ignored)
			FindShard(f.cm, cmd.Shard.Id).Retiring = true
		}
	case metapb.Op_OP_MOVE_BEGIN:
		var slots []uint32
		for _, m := range cmd.Moves {
			slots = append(slots, m.Slot)
			f.cm.LastMove++
			f.cm.Moves = append(f.cm.Moves, &metapb.SlotMove{Id: f.cm.LastMove, Slot: m.Slot, From: m.From, To: m.To})
		}
		f.calls = append(f.calls, fmt.Sprintf("move %v to %d", slots, cmd.Moves[0].To))
	default:
		return fmt.Errorf("unexpected op %v", cmd.Op)
	}
	return nil
}

// finishMoves completes the moves under way, as the slot mover would.
func (f *fakeRuntime) finishMoves() {
	for _, m := range f.cm.Moves {
		f.cm.Slots[m.Slot] = m.To
	}
	f.cm.Moves = nil
}

func (f *fakeRuntime) AddMetaVoter(_ context.Context, id, addr string) error {
	f.calls = append(f.calls, "join meta "+id+" "+addr)
	return nil
}

func (f *fakeRuntime) RemoveMetaVoter(_ context.Context, id string) error {
	f.calls = append(f.calls, "leave meta "+id)
	return nil
}

func (f *fakeRuntime) TransferMetaLeadership(context.Context) error {
	f.calls = append(f.calls, "hand off meta")
	return nil
}

func (f *fakeRuntime) Gossiped(id string) (Gossiped, bool) {
	g, ok := f.gossip[id]
	return g, ok
}

func (f *fakeRuntime) EveryNodeMovesSlots(context.Context, *metapb.ClusterMap) error {
	return f.oldNode
}

func (f *fakeRuntime) SlotLoad(context.Context, *metapb.ClusterMap) map[uint32]uint64 { return f.load }

func (f *fakeRuntime) WakeMover() { f.wakes++ }

// TestControllerDrainsANode: a node marked draining has its replicas
// replaced one change at a time (the preferences even out again), then it
// leaves the meta group, then is recorded removed; and then the controller
// has nothing more to do.
func TestControllerDrainsANode(t *testing.T) {
	rt := &fakeRuntime{cm: testMap(2, []string{"n1", "n2", "n3-"}, "n1,n3>n3", "n2,n3>n2")}
	c := New(rt, "n1", slog.New(slog.DiscardHandler))
	for range 6 {
		if err := c.PlaceOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"set 1 n1,n2>n2", "set 2 n2,n1>n2", "set 1 n1,n2>n1", "leave meta n3", "state n3 removed"}
	if !slices.Equal(rt.calls, want) {
		t.Fatalf("calls %q, want %q", rt.calls, want)
	}
}

// TestControllerHandsOffWhenItDrains: the meta leader never removes itself;
// it hands the meta group off for the next leader to do it.
func TestControllerHandsOffWhenItDrains(t *testing.T) {
	rt := &fakeRuntime{cm: testMap(1, []string{"n1", "n2-"}, "n1")}
	if err := New(rt, "n2", slog.New(slog.DiscardHandler)).PlaceOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := []string{"hand off meta"}; !slices.Equal(rt.calls, want) {
		t.Fatalf("calls %q, want %q", rt.calls, want)
	}
}

// TestControllerRetiresAShard: a retiring shard's slots move away, then it
// is dropped; a drop the map ignores is an error.
func TestControllerRetiresAShard(t *testing.T) {
	rt := &fakeRuntime{cm: slotMap([]uint32{1, 2, 3, 3}, 3, 3)}
	c := New(rt, "n1", slog.New(slog.DiscardHandler))
	for range 3 {
		if _, err := c.RetiringWork(context.Background()); err != nil {
			t.Fatal(err)
		}
		rt.finishMoves()
	}
	slices.Sort(rt.calls[:2]) // one call per target, in map order
	want := []string{"move [2] to 1", "move [3] to 2", "drop 3"}
	if !slices.Equal(rt.calls, want) {
		t.Fatalf("calls %q, want %q", rt.calls, want)
	}
	if changed, err := c.RetiringWork(context.Background()); changed || err != nil {
		t.Fatalf("nothing retiring, yet changed=%v err=%v", changed, err)
	}
	rt = &fakeRuntime{cm: slotMap([]uint32{1, 1}, 2, 2), ignoreDrop: true}
	if _, err := New(rt, "n1", slog.New(slog.DiscardHandler)).RetiringWork(context.Background()); !errors.Is(err, ErrDropIgnored) {
		t.Fatalf("ignored drop: err %v", err)
	}
}
