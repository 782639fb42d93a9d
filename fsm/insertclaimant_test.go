package fsm

import (
	"testing"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// TestInsertClaimant: from FormatInsertClaimant a task inserted available by
// a request that names a claimant records it as its claimant, and that
// changes no claim: the task counts as available, not claimed, another
// claimant may change it or claim it, and the claim counts no expired
// lease. A delayed insert records none (it would be held), and a held
// task's first claim no longer counts an expired lease either. Below the
// format nothing of this applies. Both stores.
func TestInsertClaimant(t *testing.T) {
	for name, open := range map[string]func(testing.TB, Options) *Machine{
		"memory": func(testing.TB, Options) *Machine { return New(Options{}) },
		"disk":   diskMachine,
	} {
		t.Run(name, func(t *testing.T) {
			m := open(t, Options{})
			mod := func(now int64, md *fsmpb.Modify) *fsmpb.Result {
				md.Group = "g"
				return m.ApplyCommand(uint64(now), &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: now, Modify: md})
			}
			claim := func(now int64, queue string) *fsmpb.ClaimResult {
				return m.ApplyCommand(uint64(now), &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: now,
					Claim: &fsmpb.Claim{Claimant: "worker", Queues: []string{queue}, Lease: 100, Limit: 5}}).GetClaim()
			}
			m.ApplyCommand(1, SetFormatCommand(FormatHeaders))
			if got := mod(2, &fsmpb.Modify{Claimant: "producer", Inserts: []*fsmpb.Insert{{Id: "old", Queue: "g/old"}}}).GetModify().GetInserted()[0]; got.Claimant != "" {
				t.Fatalf("format %d recorded the inserter: %v", FormatHeaders, got)
			}
			m.ApplyCommand(3, SetFormatCommand(FormatInsertClaimant))
			res := mod(4, &fsmpb.Modify{Claimant: "producer", Inserts: []*fsmpb.Insert{
				{Id: "a", Queue: "g/q"}, {Id: "b", Queue: "g/q"}, {Id: "later", Queue: "g/q", At: 50},
				{Id: "h", Queue: "g/h", At: 20, Held: true}}})
			got := res.GetModify().GetInserted()
			if got[0].Claimant != "producer" || got[1].Claimant != "producer" || got[2].Claimant != "" || got[3].Claimant != "producer" {
				t.Fatalf("inserted %v: want producer on a, b and the held h, none on the delayed one", got)
			}
			if st := m.Queues("g/q", 0); len(st) != 1 || st[0].Available != 2 || st[0].Claimed != 0 || st[0].Delayed != 1 {
				t.Fatalf("stats %+v: want 2 available, 0 claimed, 1 delayed", st)
			}
			// Another claimant changes b: not held, so allowed.
			if res := mod(5, &fsmpb.Modify{Claimant: "someone", Changes: []*fsmpb.Change{{Id: "b", Version: 1, Priority: ptr(int32(-1))}}}); res.Failure != nil {
				t.Fatalf("another claimant's change of b: %v", res.Failure)
			}
			c := claim(6, "g/q")
			if len(c.GetTasks()) != 2 || c.ExpiredLeases != 0 || c.Tasks[0].Id != "a" || c.Tasks[0].Claimant != "worker" {
				t.Fatalf("claim: %v, want a and b for worker and no expired lease", c)
			}
			if c := claim(30, "g/h"); len(c.GetTasks()) != 1 || c.ExpiredLeases != 0 {
				t.Fatalf("claim of the held task after its time: %v, want it with no expired lease", c)
			}
			// A lease that ran out still counts.
			if c := claim(200, "g/q"); len(c.GetTasks()) != 3 || c.ExpiredLeases != 2 {
				t.Fatalf("claim after the leases ran out: %v, want 3 tasks, 2 expired leases", c)
			}
		})
	}
}

// TestAnswerBytesCountHeaders: from FormatInsertClaimant a claim bounded by
// bytes counts a task's headers (up to 4 KiB of them), so a committed claim
// can always be answered; at FormatHeaders it did not, and still does not.
func TestAnswerBytesCountHeaders(t *testing.T) {
	big := map[string]string{"a": string(make([]byte, 2000)), "b": string(make([]byte, 1000))}
	for _, f := range []uint32{FormatHeaders, FormatInsertClaimant} {
		m := New(Options{})
		m.ApplyCommand(1, SetFormatCommand(f))
		m.ApplyCommand(2, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 2, Modify: &fsmpb.Modify{Group: "g",
			Inserts: []*fsmpb.Insert{{Id: "a", Queue: "g/q", Headers: big}}}})
		res := m.ApplyCommand(3, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 3,
			Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 100, Limit: 1, MaxBytes: 1000}}).GetClaim()
		if want := f < FormatInsertClaimant; (len(res.GetTasks()) == 1) != want {
			t.Errorf("format %d: a claim bounded at 1000 bytes took %d tasks of 3 KB of headers, want taken %v", f, len(res.GetTasks()), want)
		}
	}
	if n := AnswerBytes(&fsmpb.Task{Id: "a", Headers: big}); n < 3000 {
		t.Errorf("AnswerBytes of a task with 3000 bytes of headers: %d", n)
	}
}
