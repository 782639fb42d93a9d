package fsm

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// TestRate: a queue's rate is a token bucket in log time (rule 27). Each
// step claims at the entry's time stamp; the bucket (burst 3, one token
// per 100 ns) gives what it holds and no more, refills by the stamps, is
// kept across a change of rate and refused below FormatRate. Available,
// NextAt and ClaimFindsNothing agree with it. Both stores; the bucket
// survives a snapshot and restore.
func TestRate(t *testing.T) { onEachStore(t, rate) }

func rate(t *testing.T, newMachine func(testing.TB, Options) *Machine) {
	m := newMachine(t, Options{})
	idx := uint64(0)
	apply := func(cmd *fsmpb.Command) *fsmpb.Result {
		idx++
		return m.ApplyCommand(idx, cmd)
	}
	p := &fsmpb.QueuePolicy{Queue: "g/work", RateInterval: 100, Burst: 3}
	apply(SetFormatCommand(FormatRetention))
	if res := apply(&fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Now: 1, Policy: p}); res.GetFailure().GetKind() != fsmpb.Failure_INVALID {
		t.Fatalf("a rate at FormatRetention: %v, want INVALID", res)
	}
	apply(SetFormatCommand(FormatRate))
	for _, bad := range []*fsmpb.QueuePolicy{
		{Queue: "g/work", RateInterval: 100},
		{Queue: "g/work", Burst: 3},
		{Queue: "g/work", RateInterval: -1, Burst: 1},
		{Queue: "g/work", RateInterval: MaxRateInterval + 1, Burst: 1},
		{Queue: "g/work", RateInterval: 100, Burst: MaxBurst + 1},
	} {
		if res := apply(&fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Now: 1, Policy: bad}); res.GetFailure().GetKind() != fsmpb.Failure_INVALID {
			t.Fatalf("policy %v: %v, want INVALID", bad, res)
		}
	}
	var ins []*fsmpb.Insert
	for i := range 40 {
		ins = append(ins, &fsmpb.Insert{Id: fmt.Sprintf("t%02d", i), Queue: "g/work"})
	}
	apply(&fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: &fsmpb.Modify{Group: "g", Inserts: ins}})
	if res := apply(&fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Now: 1000, Policy: p}); res.Failure != nil {
		t.Fatal(res.Failure)
	}
	claimCmd := func(now int64, limit uint32) *fsmpb.Command {
		return &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: now, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/work"}, Lease: 1_000_000, Limit: limit}}
	}
	steps := []struct {
		name  string
		now   int64
		limit uint32
		want  int
	}{
		{"a full bucket gives its burst", 1000, 5, 3},
		{"then nothing", 1000, 1, 0},
		{"nor a token's time less 1 later", 1099, 1, 0},
		{"a token an interval later", 1100, 5, 1},
		{"one interval and a half: one more token", 1250, 5, 1},
		{"time spent waiting counts: two tokens", 1400, 5, 2},
		{"long idle: a full burst, never more", 5000, 10, 3},
		{"a claim of one takes one", 5100, 1, 1},
		{"two tokens in the bucket", 5300, 1, 1},
		{"one left", 5300, 5, 1},
	}
	for _, s := range steps {
		cmd := claimCmd(s.now, s.limit)
		empty := m.ClaimFindsNothing(cmd, s.now)
		if avail := m.Available("g/work", s.now, 10); avail != s.want && s.limit > 1 {
			t.Fatalf("%s: Available %d, want %d", s.name, avail, s.want)
		}
		res := apply(cmd)
		if got := len(res.GetClaim().GetTasks()); got != s.want {
			t.Fatalf("%s: claimed %d at %d, want %d", s.name, got, s.now, s.want)
		}
		if empty != (s.want == 0) {
			t.Fatalf("%s: ClaimFindsNothing %v, claimed %d", s.name, empty, s.want)
		}
	}
	// Empty now: the next token frees 100 after the last one spent.
	if at, ok := m.NextAt([]string{"g/work"}); !ok || at != 5400 {
		t.Fatalf("NextAt %d %v, want 5400 (the next token)", at, ok)
	}
	// A Modify's claim part takes tokens too.
	mc := &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY_CLAIM, Now: 5400, Modify: &fsmpb.Modify{Group: "g", Claimant: "w",
		Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/work"}, Lease: 1_000_000, Limit: 5}}}
	if got := len(apply(mc).GetModify().GetClaim().GetTasks()); got != 1 {
		t.Fatalf("a Modify's claim at 5400 took %d, want 1", got)
	}
	// A new rate keeps the bucket as empty as it was.
	if res := apply(&fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Now: 5400, Policy: &fsmpb.QueuePolicy{Queue: "g/work", RateInterval: 50, Burst: 4}}); res.Failure != nil {
		t.Fatal(res.Failure)
	}
	if n := len(apply(claimCmd(5400, 5)).GetClaim().GetTasks()); n != 0 {
		t.Fatalf("after a change of rate the empty bucket gave %d", n)
	}
	before := m.Digest()
	b := persist(t, m)
	m2 := newMachine(t, Options{})
	if err := m2.Restore(nopCloser{bytes.NewBuffer(b)}); err != nil {
		t.Fatal(err)
	}
	if m2.Digest() != before {
		t.Fatal("restored: the digest differs")
	}
	// Both decide alike from here.
	for _, now := range []int64{5420, 5499, 5500, 5560, 9000} {
		a, b := apply(claimCmd(now, 10)), m2.ApplyCommand(idx, claimCmd(now, 10))
		if len(a.GetClaim().GetTasks()) != len(b.GetClaim().GetTasks()) {
			t.Fatalf("at %d: the restored machine claimed %d, the first %d", now, len(b.GetClaim().GetTasks()), len(a.GetClaim().GetTasks()))
		}
	}
	if m2.Digest() != m.Digest() {
		t.Fatal("the digests parted")
	}
	// Clearing the policy removes the rate: the rest is claimed at once.
	apply(&fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Now: 9000, Policy: &fsmpb.QueuePolicy{Queue: "g/work"}})
	if n := len(apply(claimCmd(9000, 100)).GetClaim().GetTasks()); n == 0 {
		t.Fatal("no rate, yet nothing claimed")
	}
}

// TestRateOnDiskReopen: the bucket's state is in the on-disk store's small
// record: a machine reopened from the engine claims as the one before.
func TestRateOnDiskReopen(t *testing.T) {
	fs := vfs.NewMem()
	db, m := openOnDisk(t, fs)
	ref := New(diskTestOptions)
	idx := uint64(0)
	both := func(cmd *fsmpb.Command) {
		idx++
		m.ApplyCommand(idx, cmd)
		ref.ApplyCommand(idx, cmd)
	}
	both(SetFormatCommand(FormatRate))
	var ins []*fsmpb.Insert
	for i := range 20 {
		ins = append(ins, &fsmpb.Insert{Id: fmt.Sprintf("t%02d", i), Queue: "g/work"})
	}
	both(&fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: &fsmpb.Modify{Group: "g", Inserts: ins}})
	both(&fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Now: 10, Policy: &fsmpb.QueuePolicy{Queue: "g/work", RateInterval: 1000, Burst: 5}})
	both(&fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 100, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/work"}, Lease: 1_000_000, Limit: 4}})
	flushOnDisk(t, m)
	db.Close()
	db2, m2 := openOnDisk(t, fs)
	defer db2.Close()
	if m2.AppliedIndex() != idx || m2.Digest() != ref.Digest() {
		t.Fatalf("reopened at %d (want %d), digest equal %v", m2.AppliedIndex(), idx, m2.Digest() == ref.Digest())
	}
	claim := &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 100, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/work"}, Lease: 1_000_000, Limit: 4}}
	if n := len(m2.ApplyCommand(idx+1, claim).GetClaim().GetTasks()); n != 1 {
		t.Fatalf("the reopened machine claimed %d at the same time, want the 1 token left", n)
	}
}
