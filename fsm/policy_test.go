package fsm

import (
	"bytes"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// TestDeliveryLimit: with a queue policy of max_claims 3, a task whose third
// lease ran out without a commit is moved to the dead-letter queue by the
// claim that would be its fourth, with its last claimant, an error saying
// why, its source queue and claim count in headers, and its claims back at
// 0; the claim takes the next task instead. A task whose claims ended with
// a commit (a retry) is claimed again. Policies are refused below their
// format and with a dead-letter queue of another group, and survive a
// snapshot round trip. Both stores.
func TestDeliveryLimit(t *testing.T) { onEachStore(t, deliveryLimit) }

func deliveryLimit(t *testing.T, newMachine func(testing.TB, Options) *Machine) {
	m := newMachine(t, Options{})
	idx := uint64(0)
	apply := func(cmd *fsmpb.Command) *fsmpb.Result {
		idx++
		return m.ApplyCommand(idx, cmd)
	}
	policy := func(now int64, p *fsmpb.QueuePolicy) *fsmpb.Result {
		return apply(&fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Now: now, Policy: p})
	}
	claim := func(now int64, who string) *fsmpb.ClaimResult {
		return apply(&fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: now,
			Claim: &fsmpb.Claim{Claimant: who, Queues: []string{"g/work"}, Lease: 100, Limit: 1}}).GetClaim()
	}
	apply(SetFormatCommand(FormatInsertClaimant))
	want := &fsmpb.QueuePolicy{Queue: "g/work", MaxClaims: 3, DeadLetter: "g/dead"}
	if res := policy(1, want); res.GetFailure().GetKind() != fsmpb.Failure_INVALID {
		t.Fatalf("a policy below FormatPolicies: %v, want INVALID", res)
	}
	apply(SetFormatCommand(FormatPolicies))
	for _, bad := range []*fsmpb.QueuePolicy{
		{Queue: "g/work", MaxClaims: 3, DeadLetter: "h/dead"},
		{Queue: "g/work", MaxClaims: 3},
		{Queue: "g/work", MaxClaims: 3, DeadLetter: "g/work"},
	} {
		if res := policy(2, bad); res.GetFailure().GetKind() != fsmpb.Failure_INVALID {
			t.Fatalf("policy %v: %v, want INVALID", bad, res)
		}
		if err := Validate(&fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Policy: bad}, Limits{}); err == nil {
			t.Fatalf("Validate accepted policy %v", bad)
		}
	}
	if err := Validate(&fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Policy: want}, Limits{}); err != nil {
		t.Fatalf("Validate refused %v: %v", want, err)
	}
	if res := policy(3, want); res.Failure != nil || res.GetPolicy().GetPrevious() != nil {
		t.Fatalf("set policy: %v", res)
	}
	if qs := m.Queues("g/work", 1); len(qs) != 1 || qs[0].Policy.GetMaxClaims() != 3 || qs[0].Total != 0 {
		t.Fatalf("an empty queue with a policy lists as %+v", qs)
	}
	apply(&fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 4, Modify: &fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{
		{Id: "poison", Queue: "g/work", Priority: 9, Key: "k", Headers: map[string]string{"trace": "t1"}},
		{Id: "retried", Queue: "g/work", Priority: 5},
		{Id: "ok", Queue: "g/work"}}}})
	// Three claims of poison whose leases run out.
	now := int64(10)
	for i, who := range []string{"w1", "w2", "w3"} {
		c := claim(now, who)
		if len(c.GetTasks()) != 1 || c.Tasks[0].Id != "poison" || c.Tasks[0].Claims != uint32(i+1) {
			t.Fatalf("claim %d: %v, want poison", i+1, c)
		}
		now += 200
	}
	// The fourth moves it and takes the next.
	c := claim(now, "w4")
	if len(c.GetTasks()) != 1 || c.Tasks[0].Id != "retried" {
		t.Fatalf("the claim after 3 lease expiries: %v, want retried (poison dead-lettered)", c)
	}
	dead, _, err := m.List("g/dead", "", 10, nil, false)
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead-letter queue: %v (%v)", dead, err)
	}
	d := dead[0]
	if d.Id != "poison" || d.Claimant != "w3" || d.Claims != 0 || d.Key != "k" || d.At != now ||
		d.Headers[HeaderDeadLetterFrom] != "g/work" || d.Headers[HeaderDeadLetterClaims] != "3" || d.Headers["trace"] != "t1" ||
		!strings.Contains(d.Err, "claimed 3 times") {
		t.Fatalf("dead-lettered task %v", d)
	}
	// retried: its claims end with commits (the claimant cleared), so it
	// is claimed past the limit.
	for range 3 {
		now += 10
		if res := apply(&fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: now, Modify: &fsmpb.Modify{Group: "g", Claimant: c.Tasks[0].Claimant,
			Changes: []*fsmpb.Change{{Id: "retried", Version: c.Tasks[0].Version, Attempt: ptr(uint32(1))}}}}); res.Failure != nil {
			t.Fatalf("retry: %v", res.Failure)
		}
		now += 10
		if c = claim(now, "w5"); len(c.GetTasks()) != 1 || c.Tasks[0].Id != "retried" {
			t.Fatalf("claim of a committed retry: %v", c)
		}
	}
	if c.Tasks[0].Claims != 4 {
		t.Fatalf("retried claimed %d times, want 4", c.Tasks[0].Claims)
	}

	// A snapshot round trip keeps the policy (and the digest).
	b := persist(t, m)
	m2 := newMachine(t, Options{})
	if err := m2.Restore(nopCloser{bytes.NewBuffer(b)}); err != nil {
		t.Fatal(err)
	}
	if m2.Digest() != m.Digest() {
		t.Fatal("digest changed through a snapshot")
	}
	if qs := m2.Queues("g/work", 1); len(qs) != 1 || qs[0].Policy.GetDeadLetter() != "g/dead" {
		t.Fatalf("restored: %+v", qs)
	}
	// Clearing it answers the previous one.
	if res := policy(now, &fsmpb.QueuePolicy{Queue: "g/work"}); res.GetPolicy().GetPrevious().GetMaxClaims() != 3 {
		t.Fatalf("clear: %v", res)
	}
	if qs := m.Queues("g/work", 1); len(qs) != 1 || qs[0].Policy != nil {
		t.Fatalf("after clearing: %+v", qs)
	}
}
