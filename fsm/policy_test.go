package fsm

import (
	"bytes"
	"fmt"
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

// TestRetention: OP_EXPIRE steps visit at most their bound of tasks and
// delete those created at least the policy's retain ago, except under an
// unexpired lease, returning a cursor until the walk is done; a retain is
// refused below FormatRetention and a step does nothing without one. The
// digest and a snapshot keep the retain. Both stores.
func TestRetention(t *testing.T) { onEachStore(t, retention) }

func retention(t *testing.T, newMachine func(testing.TB, Options) *Machine) {
	m := newMachine(t, Options{})
	idx := uint64(0)
	apply := func(cmd *fsmpb.Command) *fsmpb.Result {
		idx++
		return m.ApplyCommand(idx, cmd)
	}
	expire := func(now int64, from *fsmpb.ExpireResult, visit uint32) *fsmpb.ExpireResult {
		e := &fsmpb.Expire{Queue: "g/done", Visit: visit}
		if from != nil {
			e.Priority, e.At, e.Id = from.Priority, from.At, from.Id
		}
		return apply(&fsmpb.Command{Op: fsmpb.Op_OP_EXPIRE, Now: now, Expire: e}).GetExpire()
	}
	p := &fsmpb.QueuePolicy{Queue: "g/done", Retain: 1000}
	apply(SetFormatCommand(FormatPolicies))
	if res := apply(&fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Now: 1, Policy: p}); res.GetFailure().GetKind() != fsmpb.Failure_INVALID {
		t.Fatalf("a retain at FormatPolicies: %v, want INVALID", res)
	}
	apply(SetFormatCommand(FormatRetention))
	// 10 old tasks (created at 10), 5 young ones (created at 900), one
	// old one claimed.
	var old, young []*fsmpb.Insert
	for i := range 10 {
		old = append(old, &fsmpb.Insert{Id: fmt.Sprintf("old%d", i), Queue: "g/done", Priority: int32(i % 3)})
	}
	for i := range 5 {
		young = append(young, &fsmpb.Insert{Id: fmt.Sprintf("young%d", i), Queue: "g/done", Priority: int32(i % 3)})
	}
	apply(&fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: &fsmpb.Modify{Group: "g", Inserts: old}})
	apply(&fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 900, Modify: &fsmpb.Modify{Group: "g", Inserts: young}})
	claimed := apply(&fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 900, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/done"}, Lease: 10_000, Limit: 1}}).GetClaim().GetTasks()[0]
	if e := expire(1500, nil, 4); !e.Done || e.Deleted != 0 {
		t.Fatalf("a step without a policy: %v, want done, nothing deleted", e)
	}
	if res := apply(&fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Now: 1500, Policy: p}); res.Failure != nil {
		t.Fatal(res.Failure)
	}
	before := m.Digest()
	var deleted uint64
	steps := 0
	var cur *fsmpb.ExpireResult
	for {
		e := expire(1500, cur, 4)
		steps++
		deleted += e.Deleted
		if e.Deleted > 4 {
			t.Fatalf("a step of 4 visits deleted %d", e.Deleted)
		}
		if e.Done {
			break
		}
		cur = e
	}
	if steps != 4 || deleted != 9 {
		t.Fatalf("%d steps deleted %d tasks, want 4 steps of at most 4 (16 tasks) deleting the 9 unclaimed old ones", steps, deleted)
	}
	left, _, _ := m.List("g/done", "", 100, nil, false)
	if len(left) != 6 {
		t.Fatalf("left %d tasks, want the 5 young ones and the claimed old one", len(left))
	}
	for _, tk := range left {
		if !strings.HasPrefix(tk.Id, "young") && tk.Id != claimed.Id {
			t.Fatalf("%s survived", tk.Id)
		}
	}
	if m.Digest() == before {
		t.Fatal("the digest did not change")
	}
	b := persist(t, m)
	m2 := newMachine(t, Options{})
	if err := m2.Restore(nopCloser{bytes.NewBuffer(b)}); err != nil {
		t.Fatal(err)
	}
	if m2.Digest() != m.Digest() || m2.Retained()["g/done"] != 1000 {
		t.Fatalf("restored: retained %v, digest equal %v", m2.Retained(), m2.Digest() == m.Digest())
	}
}
