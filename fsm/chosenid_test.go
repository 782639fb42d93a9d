package fsm

import (
	"fmt"
	"slices"
	"testing"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// TestInsertsWithIDsTheLeaderChose: an insert whose id the leader chose
// (Insert.id_chosen_by_leader) is not looked up, and otherwise applies as
// any insert does: the same tasks, the same digest, the same claims and
// commits after it as a machine that looked each id up. Two inserts of one
// id in one Modify are still refused, and so is a client's id that a task
// has.
func TestInsertsWithIDsTheLeaderChose(t *testing.T) {
	onEachStore(t, func(t *testing.T, newM func(testing.TB, Options) *Machine) {
		chose, looked := newM(t, Options{}), newM(t, Options{})
		apply := func(index uint64, cmd func(chosen bool) *fsmpb.Command) []*fsmpb.Result {
			var out []*fsmpb.Result
			for i, m := range []*Machine{chose, looked} {
				out = append(out, m.ApplyCommand(index, cmd(i == 0)))
			}
			return out
		}
		inserts := func(from, n int, chosen bool) []*fsmpb.Insert {
			var ins []*fsmpb.Insert
			for i := from; i < from+n; i++ {
				in := &fsmpb.Insert{Id: fmt.Sprintf("%032x", i), Queue: fmt.Sprintf("g/q%d", i%3), Value: []byte("v"),
					IdChosenByLeader: chosen}
				if i%10 == 0 {
					in.Key = fmt.Sprintf("k%d", i)
				}
				ins = append(ins, in)
			}
			return ins
		}
		for r, res := range apply(1, func(chosen bool) *fsmpb.Command {
			return &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: &fsmpb.Modify{Group: "g", Inserts: inserts(0, 300, chosen)}}
		}) {
			if res.Failure != nil || len(res.Modify.Inserted) != 300 {
				t.Fatalf("machine %d: insert of 300: %v", r, res)
			}
		}
		// Claim some, then commit them with more inserts: changes and
		// deletes of tasks inserted with chosen ids.
		var claimed [2][]*fsmpb.Task
		for r, res := range apply(2, func(bool) *fsmpb.Command {
			return &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 20, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q0", "g/q1"}, Lease: 100, Limit: 50}}
		}) {
			if res.Failure != nil || len(res.Claim.Tasks) != 50 {
				t.Fatalf("machine %d: claim of 50: %v", r, res)
			}
			claimed[r] = res.Claim.Tasks
		}
		for r, res := range apply(3, func(chosen bool) *fsmpb.Command {
			m := &fsmpb.Modify{Group: "g", Claimant: "w", Inserts: inserts(300, 100, chosen)}
			for i, tk := range claimed[0] {
				if i%2 == 0 {
					m.Deletes = append(m.Deletes, &fsmpb.Ref{Id: tk.Id, Version: tk.Version})
				} else {
					m.Changes = append(m.Changes, &fsmpb.Change{Id: tk.Id, Version: tk.Version, Queue: "g/done"})
				}
			}
			return &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 30, Modify: m}
		}) {
			if res.Failure != nil || len(res.Modify.Inserted) != 100 || len(res.Modify.Changed) != 25 {
				t.Fatalf("machine %d: commit with inserts: %v", r, res)
			}
		}
		if !slices.EqualFunc(claimed[0], claimed[1], func(a, b *fsmpb.Task) bool { return a.Id == b.Id }) {
			t.Fatal("the machines claimed different tasks")
		}
		if chose.TaskCount() != 375 || looked.TaskCount() != 375 {
			t.Fatalf("task counts %d and %d, want 375", chose.TaskCount(), looked.TaskCount())
		}
		if chose.Digest() != looked.Digest() {
			t.Fatal("the machines' digests differ")
		}
		if a, b := slotTasks(chose, SlotOf("g", testSlots)), slotTasks(looked, SlotOf("g", testSlots)); !slices.Equal(a, b) {
			t.Fatalf("the machines hold different tasks:\n%v\n%v", a, b)
		}

		// What is still refused.
		twice := inserts(1001, 1, true)
		twice = append(twice, twice[0])
		res := chose.ApplyCommand(4, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 40, Modify: &fsmpb.Modify{Group: "g", Inserts: twice}})
		if errs := res.GetFailure().GetErrors(); len(errs) != 1 || errs[0].Category != fsmpb.RefError_INSERT_DUPLICATE_ID {
			t.Fatalf("one chosen id inserted twice: %v", res)
		}
		taken := inserts(1, 1, false) // a client's id that a task has
		res = chose.ApplyCommand(5, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 40, Modify: &fsmpb.Modify{Group: "g", Inserts: taken}})
		if errs := res.GetFailure().GetErrors(); len(errs) != 1 || errs[0].Category != fsmpb.RefError_INSERT_DUPLICATE_ID {
			t.Fatalf("a client's id that a task has: %v", res)
		}
		if chose.TaskCount() != 375 {
			t.Fatalf("refused inserts changed the state: %d tasks", chose.TaskCount())
		}
	})
}
