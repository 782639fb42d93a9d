package fsm

import (
	"fmt"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// TestAnswerBytesBoundsClaims: with Claim.max_bytes a claim takes only the
// tasks its answer can carry (the rest stay available), the claim part of a
// Modify counts the transaction's echo too, and with
// Modify.max_answer_bytes a transaction whose echo would not fit is refused
// and changes nothing.
func TestAnswerBytesBoundsClaims(t *testing.T) {
	value := make([]byte, 1000)
	m := newMachine(t, Options{})
	var ins []*fsmpb.Insert
	for i := range 10 {
		ins = append(ins, &fsmpb.Insert{Id: fmt.Sprintf("t%d", i), Queue: "g/q", Value: value})
	}
	if res := m.ApplyCommand(1, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: &fsmpb.Modify{Group: "g", Inserts: ins}}); res.Failure != nil {
		t.Fatal(res.Failure)
	}
	one := AnswerBytes(&fsmpb.Task{Id: "t0", Queue: "g/q", Claimant: "w", Value: value})
	claim := func(index uint64, limit uint32, maxBytes uint64) []*fsmpb.Task {
		res := m.ApplyCommand(index, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 20, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"},
			Lease: 100, Limit: limit, MaxBytes: maxBytes}})
		if res.Failure != nil {
			t.Fatal(res.Failure)
		}
		return res.Claim.Tasks
	}
	if got := claim(2, 5, 3*one+one/2); len(got) != 3 {
		t.Fatalf("claim of 5 with room for 3.5: %d tasks", len(got))
	}
	if got := claim(3, 2, 0); len(got) != 2 {
		t.Fatalf("unbounded claim of 2: %d tasks", len(got))
	}
	if got := claim(4, 5, one-1); len(got) != 0 {
		t.Fatalf("claim with room for none: %d tasks", len(got))
	}
	// 5 left. A transaction inserting one task and claiming: the insert's
	// echo leaves room for one claimed task of two.
	res := m.ApplyCommand(5, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY_CLAIM, Now: 20, Modify: &fsmpb.Modify{Group: "g", Claimant: "w",
		Inserts:        []*fsmpb.Insert{{Id: "n1", Queue: "g/other", Value: value}},
		MaxAnswerBytes: 2*one + 10,
		Claim:          &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 100, Limit: 5, MaxBytes: 2*one + 10}}})
	if res.Failure != nil || len(res.Modify.Inserted) != 1 || len(res.Modify.Claim.Tasks) != 1 {
		t.Fatalf("modify+claim: %v", res)
	}
	// A transaction whose echo is over max_answer_bytes is refused whole.
	before := m.TaskCount()
	res = m.ApplyCommand(6, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 20, Modify: &fsmpb.Modify{Group: "g",
		Inserts:        []*fsmpb.Insert{{Id: "n2", Queue: "g/other", Value: value}, {Id: "n3", Queue: "g/other", Value: value}},
		MaxAnswerBytes: 2*one - 10}})
	if res.Failure == nil || !strings.HasPrefix(res.Failure.Message, AnswerTooLarge) {
		t.Fatalf("over max_answer_bytes: %v", res)
	}
	if m.TaskCount() != before || len(m.Get([]string{"n2"})) != 0 {
		t.Fatal("a refused transaction changed the state")
	}
}
