package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

var errNotLeader = errors.New("not the leader")

// checkErr fails unless err matches want: nil, a sentinel, or "not found".
func checkErr(t *testing.T, err, want error) {
	t.Helper()
	var nf *NotFoundError
	switch {
	case want == nil && err != nil:
		t.Fatalf("err %v, want none", err)
	case want != nil && errors.As(want, &nf):
		if !errors.As(err, &nf) {
			t.Fatalf("err %v, want not found", err)
		}
	case want != nil && !errors.Is(err, want):
		t.Fatalf("err %v, want %v", err, want)
	}
}

func moveString(ms []*metapb.SlotMove) string {
	var out []string
	for _, m := range ms {
		out = append(out, fmt.Sprintf("%d:%d>%d", m.Slot, m.From, m.To))
	}
	return strings.Join(out, " ")
}

// TestMoveSlots: which requests to move slots record what, and which are
// refused before anything is recorded.
func TestMoveSlots(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rt      *fakeRuntime
		slots   []uint32
		to      uint32
		err     error
		calls   string
		answer  string
		moving  []*metapb.SlotMove // under way before
		wantErr string
	}{
		{name: "not the leader", rt: &fakeRuntime{notLeader: errNotLeader}, slots: []uint32{0}, to: 2, err: errNotLeader},
		{name: "no such shard", slots: []uint32{0}, to: 9, err: &NotFoundError{}},
		{name: "to a retiring shard", slots: []uint32{0}, to: 3, err: ErrRefused},
		{name: "no slot", to: 2, err: ErrInvalidRequest},
		{name: "slot out of range", slots: []uint32{4}, to: 2, err: ErrInvalidRequest},
		{name: "an old node", rt: &fakeRuntime{oldNode: ErrRefused}, slots: []uint32{0}, to: 2, err: ErrRefused},
		{name: "moving elsewhere", slots: []uint32{0}, to: 2, moving: []*metapb.SlotMove{{Id: 7, Slot: 0, From: 1, To: 3}}, err: ErrRefused},
		// One entry for all; a slot there already is left out.
		{name: "recorded", slots: []uint32{0, 1, 2}, to: 2, calls: "move [0 2] to 2", answer: "0:1>2 2:1>2"},
		// Moving there already: answered, not recorded again.
		{name: "moving there", slots: []uint32{0}, to: 2, moving: []*metapb.SlotMove{{Id: 7, Slot: 0, From: 1, To: 2}}, answer: "0:1>2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := tc.rt
			if rt == nil {
				rt = &fakeRuntime{}
			}
			rt.cm = slotMap([]uint32{1, 2, 1, 3}, 3, 3)
			rt.cm.Moves = tc.moving
			moves, err := New(rt, "n1", slog.New(slog.DiscardHandler)).MoveSlots(context.Background(), tc.slots, tc.to)
			checkErr(t, err, tc.err)
			if got := strings.Join(rt.calls, "; "); got != tc.calls {
				t.Fatalf("calls %q, want %q", got, tc.calls)
			}
			if got := moveString(moves); got != tc.answer {
				t.Fatalf("answer %q, want %q", got, tc.answer)
			}
			if tc.err == nil && rt.wakes != 1 {
				t.Fatalf("the slot mover was woken %d times", rt.wakes)
			}
		})
	}
}

// TestShardRequests: adding, removing and rebalancing shards, from a map.
func TestShardRequests(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		cm    *metapb.ClusterMap
		do    func(c *Controller) (string, error)
		err   error
		calls string
		out   string
	}{
		{name: "add none", cm: slotMap([]uint32{1, 1}, 1),
			do: func(c *Controller) (string, error) { return shardsString(c.AddShards(ctx, 0, 0)) }, err: ErrInvalidRequest},
		{name: "add too many", cm: slotMap([]uint32{1, 1}, 1),
			do: func(c *Controller) (string, error) { return shardsString(c.AddShards(ctx, 65, 0)) }, err: ErrInvalidRequest},
		{name: "add two", cm: slotMap([]uint32{1, 1}, 1),
			do:    func(c *Controller) (string, error) { return shardsString(c.AddShards(ctx, 2, 0)) },
			calls: "add 2 n1>n1; add 3 n1>n1", out: "2 3"},
		// A total: a retry adds none twice.
		{name: "add up to a total", cm: slotMap([]uint32{1, 1}, 2),
			do:    func(c *Controller) (string, error) { return shardsString(c.AddShards(ctx, 0, 3)) },
			calls: "add 3 n1>n1", out: "3"},
		{name: "total reached", cm: slotMap([]uint32{1, 1}, 2),
			do: func(c *Controller) (string, error) { return shardsString(c.AddShards(ctx, 0, 2)) }},
		{name: "no member to place on", cm: func() *metapb.ClusterMap {
			cm := slotMap([]uint32{1, 1}, 1)
			cm.Nodes[0].Membership = draining
			return cm
		}(), do: func(c *Controller) (string, error) { return shardsString(c.AddShards(ctx, 1, 0)) }, err: ErrRefused},
		{name: "remove an unknown shard", cm: slotMap([]uint32{1, 2}, 2),
			do: func(c *Controller) (string, error) { return movesString(c.RemoveShard(ctx, 9)) }, err: &NotFoundError{}},
		{name: "remove the last serving shard", cm: slotMap([]uint32{1, 1}, 1),
			do: func(c *Controller) (string, error) { return movesString(c.RemoveShard(ctx, 1)) }, err: ErrRefused, calls: "retire 1"},
		{name: "remove a shard", cm: slotMap([]uint32{1, 2, 1, 2}, 2),
			do:    func(c *Controller) (string, error) { return movesString(c.RemoveShard(ctx, 2)) },
			calls: "retire 2; move [1 3] to 1", out: "1:2>1 3:2>1"},
		// Retiring already: the slots not moving yet move.
		{name: "remove again", cm: slotMap([]uint32{1, 2, 1, 2}, 2, 2),
			do:    func(c *Controller) (string, error) { return movesString(c.RemoveShard(ctx, 2)) },
			calls: "move [1 3] to 1", out: "1:2>1 3:2>1"},
		{name: "rebalance, dry run", cm: slotMap([]uint32{1, 1, 1, 1}, 2),
			do: func(c *Controller) (string, error) { return movesString(c.RebalanceSlots(ctx, true)) }, out: "0:1>2 1:1>2"},
		{name: "rebalance", cm: slotMap([]uint32{1, 1, 1, 1}, 2),
			do:    func(c *Controller) (string, error) { return movesString(c.RebalanceSlots(ctx, false)) },
			calls: "move [0 1] to 2", out: "0:1>2 1:1>2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &fakeRuntime{cm: tc.cm}
			out, err := tc.do(New(rt, "n1", slog.New(slog.DiscardHandler)))
			checkErr(t, err, tc.err)
			if got := strings.Join(rt.calls, "; "); got != tc.calls {
				t.Fatalf("calls %q, want %q", got, tc.calls)
			}
			if err == nil && out != tc.out {
				t.Fatalf("answer %q, want %q", out, tc.out)
			}
		})
	}
}

func shardsString(shs []*metapb.Shard, err error) (string, error) {
	var out []string
	for _, sh := range shs {
		out = append(out, fmt.Sprint(sh.Id))
	}
	return strings.Join(out, " "), err
}

func movesString(ms []*metapb.SlotMove, err error) (string, error) { return moveString(ms), err }

// TestNodeRequests: adding and removing nodes, from a map.
func TestNodeRequests(t *testing.T) {
	ctx := context.Background()
	add := func(id, addr string) func(c *Controller) (*metapb.Node, error) {
		return func(c *Controller) (*metapb.Node, error) { return c.AddNode(ctx, id, addr) }
	}
	remove := func(id string, force bool) func(c *Controller) (*metapb.Node, error) {
		return func(c *Controller) (*metapb.Node, error) { return c.RemoveNode(ctx, id, force) }
	}
	gossip := map[string]Gossiped{"n4": {Address: "n4:1", GossipAddress: "n4:2", HTTPAddress: "n4:3"}, "n5": {GossipAddress: "n5:2"}}
	for _, tc := range []struct {
		name      string
		nodes     []string
		notLeader bool
		do        func(c *Controller) (*metapb.Node, error)
		err       error
		calls     string
		state     metapb.NodeState // of the answer
	}{
		{name: "no id", nodes: []string{"n1"}, do: add("", ""), err: ErrInvalidRequest},
		{name: "add on a follower", nodes: []string{"n1"}, notLeader: true, do: add("n4", ""), err: errNotLeader},
		{name: "add a member again", nodes: []string{"n1", "n2"}, do: add("n2", ""), state: member},
		{name: "add a draining node", nodes: []string{"n1", "n2-"}, do: add("n2", ""), err: ErrInvalidRequest},
		{name: "add a node that does not gossip", nodes: []string{"n1"}, do: add("n6", ""), err: ErrInvalidRequest},
		{name: "add a node that gossips no address", nodes: []string{"n1"}, do: add("n5", ""), err: ErrInvalidRequest},
		// The meta group first, then the map.
		{name: "add by gossip", nodes: []string{"n1"}, do: add("n4", ""),
			calls: "join meta n4 n4:1; node n4 n4:1 n4:2 n4:3; state n4 member", state: member},
		{name: "add by address", nodes: []string{"n1"}, do: add("n6", "n6:1"),
			calls: "join meta n6 n6:1; node n6 n6:1  ; state n6 member", state: member},
		{name: "add a removed node back", nodes: []string{"n1", "n2 x"}, do: add("n2", "n2:9"),
			calls: "join meta n2 n2:9; node n2 n2:9  ; state n2 member", state: member},
		// Known to gossip, not to the map: said so even on a follower.
		{name: "remove a waiting node", nodes: []string{"n1"}, notLeader: true, do: remove("n4", false), err: ErrInvalidRequest},
		{name: "remove on a follower", nodes: []string{"n1", "n2"}, notLeader: true, do: remove("n2", false), err: errNotLeader},
		{name: "remove an unknown node", nodes: []string{"n1"}, do: remove("n9", false), err: &NotFoundError{}},
		{name: "remove a removed node", nodes: []string{"n1", "n2 x"}, do: remove("n2", false), err: &NotFoundError{}},
		{name: "remove below the replication factor", nodes: []string{"n1", "n2"}, do: remove("n2", false), err: ErrRefused},
		{name: "remove the last member", nodes: []string{"n1", "n2-"}, do: remove("n1", true), err: ErrRefused},
		{name: "remove", nodes: []string{"n1", "n2", "n3"}, do: remove("n3", false), calls: "state n3 draining", state: draining},
		{name: "remove by force", nodes: []string{"n1", "n2"}, do: remove("n2", true),
			calls: "leave meta n2; state n2 removed", state: removed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &fakeRuntime{cm: testMap(2, tc.nodes), gossip: gossip}
			if tc.notLeader {
				rt.notLeader = errNotLeader
			}
			node, err := tc.do(New(rt, "n1", slog.New(slog.DiscardHandler)))
			checkErr(t, err, tc.err)
			if got := strings.Join(rt.calls, "; "); got != tc.calls {
				t.Fatalf("calls %q, want %q", got, tc.calls)
			}
			if err == nil && node.GetMembership() != tc.state {
				t.Fatalf("answer %v, want state %v", node, tc.state)
			}
			if tc.err != nil && slices.ContainsFunc(rt.calls, func(c string) bool { return strings.HasPrefix(c, "state") }) {
				t.Fatalf("a refused request recorded %q", rt.calls)
			}
		})
	}
}
