package fsm

import (
	"bytes"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// modifyClaimCmd is a worker's commit of (id, version) by delete that
// carries its next claim of one task of g/q.
func modifyClaimCmd(now int64, id string, version uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY_CLAIM, Now: now, Modify: &fsmpb.Modify{Group: "g", Claimant: "w",
		Deletes: []*fsmpb.Ref{{Id: id, Version: version}},
		Claim:   &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 100, Limit: 1}}}
}

// TestModifyClaim checks the claim part of a Modify against a Claim applied
// to the same state right after the transaction: same tasks, same versions,
// leases and counts, and nothing claimed when the transaction fails.
func TestModifyClaim(t *testing.T) {
	claimOf := func(c *fsmpb.Command) *fsmpb.Claim { return c.Modify.Claim }
	tests := []struct {
		name string
		cmd  *fsmpb.Command
		// wantFail: the command fails and the state is unchanged.
		wantFail bool
		// wantClaimed: ids claimed, in order.
		wantClaimed []string
	}{
		{name: "delete then claim the next", cmd: modifyClaimCmd(20, "a", 2), wantClaimed: []string{"b"}},
		{name: "stale delete claims nothing", cmd: modifyClaimCmd(20, "a", 1), wantFail: true},
		{name: "claim only", cmd: &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY_CLAIM, Now: 20, Modify: &fsmpb.Modify{Group: "g", Claimant: "w",
			Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 100, Limit: 5}}}, wantClaimed: []string{"b", "c"}},
		{name: "release then claim it back", cmd: &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY_CLAIM, Now: 20, Modify: &fsmpb.Modify{Group: "g", Claimant: "w",
			Changes: []*fsmpb.Change{{Id: "a", Version: 2, Priority: proto.Int32(9)}},
			Claim:   &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 100, Limit: 1}}}, wantClaimed: []string{"a"}},
		{name: "move into another claimed queue", cmd: &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY_CLAIM, Now: 20, Modify: &fsmpb.Modify{Group: "g", Claimant: "w",
			Changes: []*fsmpb.Change{{Id: "a", Version: 2, Queue: "g/done"}},
			Claim:   &fsmpb.Claim{Claimant: "w", Queues: []string{"g/done"}, Lease: 100, Limit: 2}}}, wantClaimed: []string{"a"}},
		{name: "nothing available", cmd: &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY_CLAIM, Now: 20, Modify: &fsmpb.Modify{Group: "g", Claimant: "w",
			Deletes: []*fsmpb.Ref{{Id: "a", Version: 2}},
			Claim:   &fsmpb.Claim{Claimant: "w", Queues: []string{"g/empty"}, Lease: 100, Limit: 1}}}, wantClaimed: nil},
		{name: "claim in another group", cmd: &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY_CLAIM, Now: 20, Modify: &fsmpb.Modify{Group: "g", Claimant: "w",
			Deletes: []*fsmpb.Ref{{Id: "a", Version: 2}},
			Claim:   &fsmpb.Claim{Claimant: "w", Queues: []string{"h/q"}, Lease: 100, Limit: 1}}}, wantFail: true},
	}
	setup := func() *Machine {
		m := newMachine(t, Options{})
		m.ApplyCommand(1, insertCmd(10, "a", "b", "c"))
		m.ApplyCommand(2, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: &fsmpb.Modify{Group: "h",
			Inserts: []*fsmpb.Insert{{Id: "x", Queue: "h/q"}}}})
		// w holds a (version 2).
		m.ApplyCommand(3, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 11, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 100, Limit: 1}})
		return m
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := setup()
			before := allTasks(m)
			res := m.ApplyCommand(4, tt.cmd)
			if tt.wantFail {
				if res.Failure == nil {
					t.Fatalf("got %v, want a failure", res)
				}
				if after := allTasks(m); len(after) != len(before) || !slices.EqualFunc(after, before, func(a, b *fsmpb.Task) bool { return proto.Equal(a, b) }) {
					t.Fatal("a failed command changed a task")
				}
				return
			}
			got := res.GetModify().GetClaim()
			if res.Failure != nil || got == nil {
				t.Fatalf("got %v, want a modify result with a claim part", res)
			}
			var ids []string
			for _, tk := range got.Tasks {
				ids = append(ids, tk.Id)
			}
			if len(ids) != len(tt.wantClaimed) || (len(ids) > 0 && ids[0] != tt.wantClaimed[0]) || len(ids) > 1 && ids[1] != tt.wantClaimed[1] {
				t.Fatalf("claimed %v, want %v", ids, tt.wantClaimed)
			}
			// The same claim as a separate command on the state the
			// transaction left must claim the same tasks, identically.
			ref := setup()
			mod := proto.Clone(tt.cmd).(*fsmpb.Command)
			mod.Op, mod.Modify.Claim = fsmpb.Op_OP_MODIFY, nil
			if r := ref.ApplyCommand(4, mod); r.Failure != nil {
				t.Fatalf("the transaction alone failed: %v", r)
			}
			want := ref.ApplyCommand(5, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: tt.cmd.Now, Claim: claimOf(tt.cmd)}).GetClaim()
			if !proto.Equal(got, want) {
				t.Fatalf("claim part %v, want what a Claim right after claims: %v", got, want)
			}
			if m.Digest() != ref.Digest() {
				t.Fatal("state after the combined command differs from modify-then-claim")
			}
		})
	}
}

// TestModifyClaimExactlyOnce: a retried combined request returns the first
// answer, claimed tasks included, without claiming again, also on a replica
// restored from a snapshot taken between the two.
func TestModifyClaimExactlyOnce(t *testing.T) {
	m := newMachine(t, Options{})
	m.ApplyCommand(1, insertCmd(10, "a", "b", "c"))
	m.ApplyCommand(2, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 11, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 100, Limit: 1}})
	cmd := modifyClaimCmd(20, "a", 2)
	cmd.ClientId, cmd.Seq = "c", 1
	data, err := EncodeCommand(cmd)
	if err != nil {
		t.Fatal(err)
	}
	first := m.Apply(&raft.Log{Index: 3, Type: raft.LogCommand, Data: data}).(*fsmpb.Result)
	if got := first.GetModify().GetClaim().GetTasks(); len(got) != 1 || got[0].Id != "b" || got[0].Version != 2 {
		t.Fatalf("first answer claimed %v, want b v2", got)
	}
	before := m.Digest()
	replica := newMachine(t, Options{})
	if err := replica.Restore(nopCloser{bytes.NewBuffer(persist(t, m))}); err != nil {
		t.Fatal(err)
	}
	for name, mm := range map[string]*Machine{"leader": m, "restored": replica} {
		again := mm.Apply(&raft.Log{Index: 4, Type: raft.LogCommand, Data: data}).(*fsmpb.Result)
		if !again.Replayed {
			t.Fatalf("%s: the retry's answer is not marked replayed", name)
		}
		again.Replayed = false
		if !proto.Equal(first, again) {
			t.Fatalf("%s: retry returned %v, want %v", name, again, first)
		}
		if mm.Digest() != before {
			t.Fatalf("%s: the retry changed the state", name)
		}
	}
	if tasks := m.Get([]string{"c"}); tasks[0].Claims != 0 {
		t.Fatalf("the retry claimed again: %v", tasks[0])
	}
}
