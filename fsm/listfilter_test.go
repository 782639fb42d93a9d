package fsm

import (
	"fmt"
	"slices"
	"testing"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// TestListFilters lists one queue with each filter: the
// tasks returned are exactly those that match, in claim order.
func TestListFilters(t *testing.T) {
	m := newMachine(t, Options{})
	in := func(id, key string, at int64, attempt uint32, err string) *fsmpb.Insert {
		return &fsmpb.Insert{Id: id, Queue: "g/q", Key: key, At: at, Attempt: attempt, Err: err}
	}
	m.ApplyCommand(1, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 100, Modify: &fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{
		in("a", "user-1", 0, 0, ""),
		in("b", "user-2", 0, 3, "timeout talking to db"),
		in("c", "order-1", 0, 5, "bad input"),
		in("d", "", 1000, 1, "timeout"), // delayed until 1000
		in("e", "user-3", 0, 0, ""),
	}}})
	// w1 claims the first two available (a, b by id), with a lease to 600.
	m.ApplyCommand(2, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 100, Claim: &fsmpb.Claim{Claimant: "w1", Queues: []string{"g/q"}, Lease: 500, Limit: 2}})
	yes := true
	for _, tc := range []struct {
		name string
		f    ListFilter
		want []string
	}{
		{"none", ListFilter{}, []string{"c", "e", "a", "b", "d"}},
		{"claimed", ListFilter{State: Claimed}, []string{"a", "b"}},
		{"claimed (bool)", ListFilter{Claimed: &yes}, []string{"a", "b"}},
		{"available", ListFilter{State: Available}, []string{"c", "e"}},
		{"delayed", ListFilter{State: Delayed}, []string{"d"}},
		{"claimant", ListFilter{Claimant: "w1"}, []string{"a", "b"}},
		{"claimant nobody", ListFilter{Claimant: "w2"}, nil},
		{"key prefix", ListFilter{KeyPrefix: "user-"}, []string{"e", "a", "b"}},
		{"min attempt", ListFilter{MinAttempt: 3}, []string{"c", "b"}},
		{"err", ListFilter{ErrContains: "timeout"}, []string{"b", "d"}},
		{"all at once", ListFilter{State: Claimed, KeyPrefix: "user-", MinAttempt: 1, ErrContains: "db"}, []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tasks, next, err := m.ListFiltered("g/q", "", 100, tc.f, true, 0)
			if err != nil || next != "" {
				t.Fatalf("err %v, next %q", err, next)
			}
			var got []string
			for _, task := range tasks {
				got = append(got, task.Id)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	// Leases run out: at 700 the claimed tasks are available again, still
	// w1's by claimant.
	m.ApplyCommand(3, &fsmpb.Command{Op: fsmpb.Op_OP_TICK, Now: 700})
	if tasks, _, _ := m.ListFiltered("g/q", "", 100, ListFilter{State: Claimed}, true, 0); len(tasks) != 0 {
		t.Errorf("claimed after the leases ran out: %v", tasks)
	}
	if tasks, _, _ := m.ListFiltered("g/q", "", 100, ListFilter{State: Available, Claimant: "w1"}, true, 0); len(tasks) != 2 {
		t.Errorf("available and last claimed by w1: %v, want a and b", tasks)
	}
}

// TestListFilterPagesAFewAtATime: a filtered page looks at no more than
// listScanLimit tasks, so a rare match deep in a big queue takes several
// (possibly empty) pages; following the tokens finds every match once, even
// while tasks are inserted between pages.
func TestListFilterPagesAFewAtATime(t *testing.T) {
	m := newMachine(t, Options{})
	const n = 3*listScanLimit + 17
	var want []string
	var inserts []*fsmpb.Insert
	for i := range n {
		id := fmt.Sprintf("t%06d", i)
		in := &fsmpb.Insert{Id: id, Queue: "g/q"}
		if i%5000 == 4999 {
			in.Attempt, in.Err = 9, "poison"
			want = append(want, id)
		}
		inserts = append(inserts, in)
	}
	for i := 0; i < len(inserts); i += 1000 {
		m.ApplyCommand(uint64(i+1), &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 100, Modify: &fsmpb.Modify{Group: "g", Inserts: inserts[i:min(i+1000, len(inserts))]}})
	}
	var got []string
	token, pages, idx := "", 0, uint64(n+1)
	for {
		tasks, next, err := m.ListFiltered("g/q", token, 100, ListFilter{MinAttempt: 9, ErrContains: "poison"}, true, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			got = append(got, task.Id)
		}
		pages++
		// Writes between pages: a task before the position and one after,
		// neither matching.
		idx++
		m.ApplyCommand(idx, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 100, Modify: &fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{
			{Id: fmt.Sprintf("a-%d", pages), Queue: "g/q"}, {Id: fmt.Sprintf("z-%d", pages), Queue: "g/q"}}}})
		if next == "" {
			break
		}
		token = next
	}
	if !slices.Equal(got, want) {
		t.Errorf("found %v over %d pages, want %v", got, pages, want)
	}
	if pages < 4 {
		t.Errorf("%d pages for %d tasks: a filtered page must stop after %d", pages, n, listScanLimit)
	}
}
