package fsm

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// validatedCommands are the commands a node validates most: one insert,
// and a claim+commit (a delete with the next claim).
func validatedCommands() map[string]*fsmpb.Command {
	return map[string]*fsmpb.Command{
		"insert": {Op: fsmpb.Op_OP_MODIFY, ClientId: "c1", Modify: &fsmpb.Modify{Group: "g",
			Inserts: []*fsmpb.Insert{{Id: "0192a3b4c5d6e7f8", Queue: "g/q", Value: make([]byte, 64)}}}},
		"claim-delete": {Op: fsmpb.Op_OP_MODIFY_CLAIM, ClientId: "c1", Modify: &fsmpb.Modify{Group: "g", Claimant: "w1",
			Deletes: []*fsmpb.Ref{{Id: "0192a3b4c5d6e7f8", Version: 3}},
			Claim:   &fsmpb.Claim{Queues: []string{"g/q"}, Claimant: "w1", Lease: int64(30 * time.Second), Limit: 1}}},
	}
}

// TestValidateAllocatesNothingWhenValid pins what bodies' comment
// promises, and the same for the whole check of the commands every write
// carries: Validate runs on the leader for each request, and an
// allocation there is garbage per request.
func TestValidateAllocatesNothingWhenValid(t *testing.T) {
	for name, cmd := range validatedCommands() {
		if err := Validate(cmd, Limits{}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := testing.AllocsPerRun(100, func() { _ = Validate(cmd, Limits{}) }); n != 0 {
			t.Errorf("%s: Validate allocates %.0f times per valid command, want 0", name, n)
		}
	}
}

func BenchmarkValidate(b *testing.B) {
	for name, cmd := range validatedCommands() {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := Validate(cmd, Limits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestValidateNamesTheFirstDuplicate: a task named twice is refused, the
// error naming both places, whether the ids so far are scanned (a few) or
// kept in a map (more), and in a batch's command with the batch's path.
func TestValidateNamesTheFirstDuplicate(t *testing.T) {
	inserts := func(n int) []*fsmpb.Insert {
		var ins []*fsmpb.Insert
		for i := range n {
			ins = append(ins, &fsmpb.Insert{Id: fmt.Sprintf("t%d", i), Queue: "g/q"})
		}
		return ins
	}
	for _, tc := range []struct {
		name    string
		inserts int
		dup     string
		want    string
	}{
		{"few", 3, "t1", `deletes[0].id: task "t1" is also named by inserts[1].id`},
		{"many", 20, "t2", `deletes[0].id: task "t2" is also named by inserts[2].id`},
		{"many, late", 20, "t19", `deletes[0].id: task "t19" is also named by inserts[19].id`},
	} {
		m := &fsmpb.Modify{Group: "g", Inserts: inserts(tc.inserts), Deletes: []*fsmpb.Ref{{Id: tc.dup, Version: 1}}}
		err := Validate(&fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: m}, Limits{})
		if err == nil || err.Error() != tc.want || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
		m = &fsmpb.Modify{Group: "g", Inserts: inserts(tc.inserts), Deletes: []*fsmpb.Ref{{Id: "other", Version: 1}}}
		if err := Validate(&fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: m}, Limits{}); err != nil {
			t.Errorf("%s, no duplicate: %v", tc.name, err)
		}
	}
	// Within a batch the fields carry the batch's path.
	sub := &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: &fsmpb.Modify{Group: "g", Inserts: inserts(2), Changes: []*fsmpb.Change{{Id: "t0", Version: 1}}}}
	ok := &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: &fsmpb.Modify{Group: "g", Inserts: inserts(1)}}
	err := Validate(&fsmpb.Command{Op: fsmpb.Op_OP_BATCH, Batch: []*fsmpb.Command{ok, sub}}, Limits{})
	if want := `batch[1].changes[0].id: task "t0" is also named by batch[1].inserts[0].id`; err == nil || err.Error() != want {
		t.Errorf("batch: got %v, want %q", err, want)
	}
	// A bad field of a claim inside a modify is named from the command.
	cl := &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY_CLAIM, Modify: &fsmpb.Modify{Group: "g", Claimant: "w",
		Claim: &fsmpb.Claim{Queues: []string{"g/q", ""}, Claimant: "w", Lease: int64(time.Second), Limit: 1}}}
	if err, want := Validate(cl, Limits{}), "claim.queues[1]: required"; err == nil || err.Error() != want {
		t.Errorf("claim: got %v, want %q", err, want)
	}
}
