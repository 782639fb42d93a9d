package fsm

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// TestModifyScope: a caller limited to "demo/" that routes a request by a
// queue under it must not reach, by id, a task of the same group in a queue
// outside it (a token scoped to demo/ moved a task of queue "demo",
// the group's root queue, to "demo/stolen"). Every operation that names a
// task by id is refused whole; inside the scope the same operations apply,
// and without a scope nothing is checked.
func TestModifyScope(t *testing.T) {
	tests := []struct {
		name   string
		modify *fsmpb.Modify
		scope  []string
		// wantDenied: refused as out of scope; else it must apply.
		wantDenied bool
	}{
		{name: "change a root-queue task", wantDenied: true,
			modify: &fsmpb.Modify{Changes: []*fsmpb.Change{{Id: "root", Version: 1, Value: []byte("x")}}}},
		{name: "move a root-queue task into scope", wantDenied: true,
			modify: &fsmpb.Modify{Changes: []*fsmpb.Change{{Id: "root", Version: 1, Queue: "demo/stolen"}}}},
		{name: "delete a root-queue task", wantDenied: true,
			modify: &fsmpb.Modify{Deletes: []*fsmpb.Ref{{Id: "root", Version: 1}}}},
		{name: "depend on a root-queue task", wantDenied: true,
			modify: &fsmpb.Modify{Depends: []*fsmpb.Ref{{Id: "root", Version: 1}},
				Inserts: []*fsmpb.Insert{{Id: "n", Queue: "demo/x"}}}},
		{name: "one out-of-scope reference among good ones", wantDenied: true,
			modify: &fsmpb.Modify{Deletes: []*fsmpb.Ref{{Id: "mine", Version: 1}, {Id: "root", Version: 1}}}},
		{name: "a second prefix does not cover it", scope: []string{"demo/", "other-"}, wantDenied: true,
			modify: &fsmpb.Modify{Changes: []*fsmpb.Change{{Id: "root", Version: 1, Queue: "demo/stolen"}}}},
		{name: "change a task in scope", modify: &fsmpb.Modify{Changes: []*fsmpb.Change{{Id: "mine", Version: 1, Value: []byte("y")}}}},
		{name: "delete a task in scope", modify: &fsmpb.Modify{Deletes: []*fsmpb.Ref{{Id: "mine", Version: 1}}}},
		{name: "insert in scope", modify: &fsmpb.Modify{Inserts: []*fsmpb.Insert{{Id: "n", Queue: "demo/x"}}}},
		{name: "a prefix that covers the group", scope: []string{"demo"},
			modify: &fsmpb.Modify{Changes: []*fsmpb.Change{{Id: "root", Version: 1, Queue: "demo/moved"}}}},
		{name: "no scope: an unrestricted caller", scope: []string{},
			modify: &fsmpb.Modify{Changes: []*fsmpb.Change{{Id: "root", Version: 1, Queue: "demo/moved"}}}},
	}
	setup := func() *Machine {
		m := newMachine(t, Options{})
		m.ApplyCommand(1, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: &fsmpb.Modify{Group: "demo",
			Inserts: []*fsmpb.Insert{{Id: "root", Queue: "demo", Value: []byte("root's")}, {Id: "mine", Queue: "demo/x"}}}})
		return m
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := setup()
			before := allTasks(m)
			mod := proto.Clone(tt.modify).(*fsmpb.Modify)
			mod.Group = "demo"
			mod.Scope = []string{"demo/"}
			if tt.scope != nil {
				mod.Scope = tt.scope
			}
			cmd := &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 20, Modify: mod}
			if err := Validate(cmd, Limits{}); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			res := m.ApplyCommand(3, cmd)
			if !tt.wantDenied {
				if res.Failure != nil {
					t.Fatalf("refused: %v", res.Failure)
				}
				return
			}
			if !strings.HasPrefix(res.GetFailure().GetMessage(), OutOfScope) {
				t.Fatalf("got %v, want a failure starting with %q", res, OutOfScope)
			}
			if strings.Contains(res.GetFailure().GetMessage(), "root's") {
				t.Fatal("the refusal shows the task's value")
			}
			if after := allTasks(m); !slices.EqualFunc(after, before, func(a, b *fsmpb.Task) bool { return proto.Equal(a, b) }) {
				t.Fatal("a refused command changed a task")
			}
		})
	}
}

// TestValidateBoundsScope: the scope reaches the log, so it is bounded.
func TestValidateBoundsScope(t *testing.T) {
	cmd := insertCmd(10, "a")
	for range maxScope + 1 {
		cmd.Modify.Scope = append(cmd.Modify.Scope, "g/")
	}
	if err := Validate(cmd, Limits{}); err == nil {
		t.Fatalf("%d prefixes accepted", len(cmd.Modify.Scope))
	}
	cmd.Modify.Scope = []string{""}
	if err := Validate(cmd, Limits{}); err == nil {
		t.Fatal("an empty prefix accepted")
	}
}
