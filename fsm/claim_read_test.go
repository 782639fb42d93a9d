package fsm

import (
	"testing"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// TestClaimFindsNothing: the read that lets the leader answer a claim with
// no log entry says "nothing" only when a claim stamped with that time
// would certainly find nothing, and counts a task due, or a lease ending,
// exactly at that time as claimable.
func TestClaimFindsNothing(t *testing.T) {
	m := newMachine(t, Options{})
	idx := uint64(0)
	apply := func(cmd *fsmpb.Command) *fsmpb.Result {
		t.Helper()
		idx++
		res := m.ApplyCommand(idx, cmd)
		if res.Failure != nil {
			t.Fatalf("%v: %v", cmd, res.Failure)
		}
		return res
	}
	claim := func(queues ...string) *fsmpb.Command {
		return &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Claim: &fsmpb.Claim{Claimant: "w", Queues: queues, Lease: 100, Limit: 1}}
	}
	apply(&fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: &fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{
		{Id: "later", Queue: "g/delayed", At: 50},
		{Id: "p", Queue: "g/paused"},
		{Id: "l1", Queue: "g/limited"}, {Id: "l2", Queue: "g/limited"},
		{Id: "c", Queue: "g/claimed"}}}})
	apply(&fsmpb.Command{Op: fsmpb.Op_OP_PAUSE, Now: 10, Pause: &fsmpb.Pause{Queue: "g/paused", Paused: true}})
	apply(&fsmpb.Command{Op: fsmpb.Op_OP_LIMIT, Now: 10, Limit: &fsmpb.QueueLimit{Queue: "g/limited", MaxClaimed: 1}})
	// l1 claimed until 20+100 = 120: g/limited is at its limit until then.
	apply(&fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 20, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/limited"}, Lease: 100, Limit: 1}})
	// c claimed until 30+200 = 230.
	apply(&fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 30, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/claimed"}, Lease: 200, Limit: 1}})

	check := func(name string, cmd *fsmpb.Command, now int64, nothing bool) {
		t.Helper()
		if got := m.ClaimFindsNothing(cmd, now); got != nothing {
			t.Errorf("%s: ClaimFindsNothing at %d = %v, want %v", name, now, got, nothing)
		}
	}
	check("missing queue", claim("g/none"), 40, true)
	check("delayed, before its time", claim("g/delayed"), 49, true)
	check("delayed, at its time", claim("g/delayed"), 50, false)
	check("paused with a task", claim("g/paused"), 40, true)
	check("paused, and a delayed one due", claim("g/paused", "g/delayed"), 60, false)
	check("several groups: refused, proposed", claim("g/none", "h/none"), 40, false)
	// A limited queue at its limit finds nothing until a lease ends; any
	// pending time reached (here the delayed task's) may be a lease end the
	// machine's clock has not passed: proposed.
	check("at its limit, a pending time passed", claim("g/limited"), 60, false)
	apply(&fsmpb.Command{Op: fsmpb.Op_OP_TICK, Now: 60})
	check("at its limit", claim("g/limited"), 119, true)
	check("at its limit, the lease ends now", claim("g/limited"), 120, false)
	check("claimed, before the lease ends", claim("g/claimed"), 119, true)
	apply(&fsmpb.Command{Op: fsmpb.Op_OP_TICK, Now: 125})
	check("claimed, just before the lease ends", claim("g/claimed"), 229, true)
	check("claimed, the lease ends now", claim("g/claimed"), 230, false)

	// A request the session knows is always proposed: a retry gets the
	// recorded answer (or its refusal) from the log, never a fresh empty one.
	retry := claim("g/limited")
	retry.ClientId, retry.Seq, retry.Now = "c", 5, 130
	if res := apply(retry); len(res.GetClaim().GetTasks()) != 1 {
		t.Fatalf("claim after the lease: %v", res)
	}
	for _, seq := range []uint64{4, 5} {
		again := claim("g/limited")
		again.ClientId, again.Seq = "c", seq
		if m.ClaimFindsNothing(again, 140) {
			t.Errorf("seq %d of a session at seq 5: ClaimFindsNothing said nothing", seq)
		}
	}
	next := claim("g/limited")
	next.ClientId, next.Seq = "c", 6
	if !m.ClaimFindsNothing(next, 140) {
		t.Error("the session's next request on a full queue: want nothing")
	}
}
