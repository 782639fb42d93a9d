package checker

import (
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/testing/workload"
)

// builder makes hand-made histories. Times are milliseconds after t0, both
// for the client's intervals and for the shard's clock (at, modified).
type builder struct {
	t0 time.Time
	h  *workload.History
}

func newBuilder() *builder {
	h := workload.NewHistory()
	return &builder{t0: h.Base(), h: h}
}

func (b *builder) ms(n int) time.Time { return b.t0.Add(time.Duration(n) * time.Millisecond) }

func (b *builder) tv(id string, v uint64, queue string, modified, at int) workload.TaskVersion {
	return workload.TaskVersion{ID: id, Version: v, Queue: queue, Modified: b.ms(modified), At: b.ms(at)}
}

func (b *builder) add(op *workload.Op, start, end int, outcome workload.Outcome) *workload.Op {
	op.Start, op.End, op.Outcome = b.ms(start), b.ms(end), outcome
	if op.Worker == "" {
		op.Worker = "w"
	}
	b.h.Add(op)
	return op
}

func (b *builder) insert(id string, start, end int, outcome workload.Outcome) *workload.Op {
	op := &workload.Op{Kind: workload.KindInsert, Inserts: []workload.Insert{{ID: id, Queue: "g/in"}}}
	if outcome == workload.OK {
		op.Tasks = []workload.TaskVersion{b.tv(id, 1, "g/in", start+1, start+1)}
	}
	return b.add(op, start, end, outcome)
}

// claim returns id at version v, claimed at shard time start+1 with a lease
// of lease ms.
func (b *builder) claim(id string, v uint64, start, end, lease int, claimant string) *workload.Op {
	t := b.tv(id, v, "g/in", start+1, start+1+lease)
	t.Claimant = claimant
	return b.add(&workload.Op{Kind: workload.KindClaim, Claimant: claimant, Queues: []string{"g/in"}, Tasks: []workload.TaskVersion{t}}, start, end, workload.OK)
}

func (b *builder) del(id string, v uint64, start, end int, outcome workload.Outcome) *workload.Op {
	return b.add(&workload.Op{Kind: workload.KindCommit, Deletes: []workload.Ref{{ID: id, Version: v}}}, start, end, outcome)
}

func (b *builder) move(id string, v uint64, to, claimant string, start, end int) *workload.Op {
	return b.add(&workload.Op{Kind: workload.KindCommit, Claimant: claimant, Changes: []workload.Change{{ID: id, Version: v, NewQueue: to}},
		Tasks: []workload.TaskVersion{b.tv(id, v+1, to, start+1, start+1)}}, start, end, workload.OK)
}

func (b *builder) read(id string, v uint64, start, end int) *workload.Op {
	op := &workload.Op{Kind: workload.KindRead, Reads: []string{id}}
	if v > 0 {
		op.Tasks = []workload.TaskVersion{b.tv(id, v, "g/in", 0, 0)}
	}
	return b.add(op, start, end, workload.OK)
}

func (b *builder) final(start int, tasks ...workload.TaskVersion) *workload.Final {
	return &workload.Final{Start: b.ms(start), End: b.ms(start + 10), Tasks: tasks}
}

// good is a history every checker accepts: inserts, claims (one lease run
// out and claimed again), commits by delete and move, a refused and an
// accepted transaction, unknown outcomes either way, reads.
func good() (*builder, *workload.Final) {
	b := newBuilder()
	b.insert("a", 0, 10, workload.OK)
	b.claim("a", 2, 20, 30, 1000, "w1")
	b.read("a", 2, 40, 50)
	b.del("a", 2, 60, 70, workload.OK)
	b.read("a", 0, 80, 90)

	b.insert("b", 0, 10, workload.OK)
	b.claim("b", 2, 20, 30, 100, "w1") // abandoned: the lease ends at 121
	b.claim("b", 3, 200, 210, 1000, "w2")
	b.move("b", 3, "g/done", "w2", 220, 230) // b v4 in g/done

	b.insert("c", 100, 10000, workload.Unknown) // never applied
	b.insert("d", 100, 10000, workload.Unknown) // applied
	b.del("b", 3, 300, 10000, workload.Unknown) // stale, cannot apply

	// A refused transaction: it depends on a stale version of b, so its
	// delete of e v2 and its insert of e.c did not happen.
	b.insert("e", 0, 10, workload.OK)
	b.claim("e", 2, 20, 30, 5000, "w1")
	b.add(&workload.Op{Kind: workload.KindTxn, Claimant: "w1",
		Depends: []workload.Ref{{ID: "b", Version: 3}}, Deletes: []workload.Ref{{ID: "e", Version: 2}},
		Inserts: []workload.Insert{{ID: "e.c", Queue: "g/out"}}, RefusedAll: true,
		Refused: []workload.Refused{{ID: "b", Version: 3, Category: "DEPEND_STALE", Current: 4}}}, 400, 410, workload.Failed)
	// And an accepted one.
	b.add(&workload.Op{Kind: workload.KindTxn, Claimant: "w1",
		Depends: []workload.Ref{{ID: "b", Version: 4}}, Deletes: []workload.Ref{{ID: "e", Version: 2}},
		Inserts: []workload.Insert{{ID: "e.c2", Queue: "g/out"}},
		Tasks:   []workload.TaskVersion{b.tv("e.c2", 1, "g/out", 421, 421)}}, 420, 430, workload.OK)

	// A zombie: claims z, sleeps past its lease, another claims it, the
	// zombie's commit is refused as stale.
	b.insert("z", 0, 10, workload.OK)
	b.claim("z", 2, 20, 30, 100, "zombie")
	b.claim("z", 3, 300, 310, 1000, "usurper")
	b.add(&workload.Op{Kind: workload.KindCommit, Claimant: "zombie", Deletes: []workload.Ref{{ID: "z", Version: 2}},
		Zombie: true, Usurped: true, RefusedAll: true,
		Refused: []workload.Refused{{ID: "z", Version: 2, Category: "DELETE_STALE", Current: 3}, {ID: "z", Version: 2, Category: "CLAIMED"}}}, 320, 330, workload.Failed)
	b.del("z", 3, 340, 350, workload.OK)

	final := b.final(20000,
		b.tv("b", 4, "g/done", 221, 221),
		b.tv("d", 1, "g/in", 200, 200),
		b.tv("e.c2", 1, "g/out", 421, 421))
	return b, final
}

func run(t *testing.T, b *builder, final *workload.Final) *Report {
	t.Helper()
	r := All(Input{History: b.h, Final: final, LinearizeTimeout: 5 * time.Second, LinearizeBudget: 20 * time.Second})
	t.Logf("%s", r.Summary())
	for _, v := range r.Violations {
		t.Logf("violation: %s", v)
	}
	return r
}

func TestGoodHistoryPasses(t *testing.T) {
	b, final := good()
	r := run(t, b, final)
	if !r.OK() {
		t.Fatalf("a correct history has %d violations", len(r.Violations))
	}
	for _, n := range []string{NameLost, NamePhantom, NameCommits, NameLeases, NameLinearizable} {
		if r.Checked[n] == 0 {
			t.Errorf("checker %s examined nothing", n)
		}
	}
}

func TestLostInsert(t *testing.T) {
	b, final := good()
	r := run(t, b, final.Without("d")) // d's insert was unknown: may be gone
	if !r.OK() {
		t.Fatalf("an unknown insert may be missing: %v", r.Violations)
	}
	b.insert("x", 500, 510, workload.OK)
	r = run(t, b, final)
	if !r.Has(NameLost, "x") {
		t.Fatalf("lost acknowledged insert of x not reported")
	}
	if !r.Has(NameLinearizable, "x") {
		t.Errorf("the final read of x (absent after an acknowledged insert) is not linearizable, yet not reported")
	}
	// An acknowledged task dropped from the final state.
	b, final = good()
	r = run(t, b, final.Without("b"))
	if !r.Has(NameLost, "b") {
		t.Fatalf("dropped task b not reported as lost")
	}
	// Deleted by a commit of unknown outcome: not lost.
	b, final = good()
	b.insert("y", 500, 510, workload.OK)
	b.del("y", 1, 520, 9000, workload.Unknown)
	if r := run(t, b, final); !r.OK() {
		t.Fatalf("a task deleted by an unknown commit reported: %v", r.Violations)
	}
}

func TestPhantom(t *testing.T) {
	// The refused transaction's child is present: a phantom, and the
	// transaction is half applied (e v2 is gone... or not).
	b, final := good()
	final.Tasks = append(final.Tasks, b.tv("e.c", 1, "g/out", 401, 401))
	r := run(t, b, final)
	if !r.Has(NamePhantom, "e.c") {
		t.Fatalf("child of a refused transaction not reported")
	}
	// A task nobody inserted, a task listed twice, a deleted task back.
	b, final = good()
	final.Tasks = append(final.Tasks, b.tv("ghost", 1, "g/in", 1, 1), b.tv("b", 4, "g/mid", 221, 221), b.tv("a", 2, "g/in", 21, 1021))
	r = run(t, b, final)
	for _, id := range []string{"ghost", "b", "a"} {
		if !r.Has(NamePhantom, id) {
			t.Errorf("phantom %s not reported", id)
		}
	}
	// An unknown transaction half applied: child present, parent still at
	// the version it deleted.
	b, final = good()
	b.insert("p", 500, 510, workload.OK)
	b.add(&workload.Op{Kind: workload.KindTxn, Deletes: []workload.Ref{{ID: "p", Version: 1}},
		Inserts: []workload.Insert{{ID: "p.c", Queue: "g/out"}}}, 520, 9000, workload.Unknown)
	final.Tasks = append(final.Tasks, b.tv("p", 1, "g/in", 501, 501), b.tv("p.c", 1, "g/out", 521, 521))
	r = run(t, b, final)
	if !r.Has(NamePhantom, "p") {
		t.Errorf("half-applied transaction not reported")
	}
}

func TestDoubleCommit(t *testing.T) {
	b, final := good()
	// A second, forged, acknowledged delete of a v2 by another worker.
	b.add(&workload.Op{Kind: workload.KindCommit, Worker: "forger", Deletes: []workload.Ref{{ID: "a", Version: 2}}}, 61, 69, workload.OK)
	r := run(t, b, final)
	if !r.Has(NameCommits, "a") {
		t.Fatalf("double commit of a v2 not reported")
	}
	if !strings.Contains(r.Violations[0].String()+r.Violations[len(r.Violations)-1].String(), "a") {
		t.Errorf("violations do not name the task")
	}
	if !r.Has(NameLinearizable, "a") {
		t.Errorf("double delete not reported as non-linearizable")
	}
	// The same version handed out by two claims.
	b, final = good()
	b.claim("b", 3, 205, 215, 1000, "w3")
	if r := run(t, b, final); !r.Has(NameCommits, "b") || !r.Has(NameLinearizable, "b") {
		t.Fatalf("version created twice not reported: %v", r.Violations)
	}
}

func TestStaleCommit(t *testing.T) {
	// The zombie's commit accepted after the usurper's claim.
	b := newBuilder()
	b.insert("z", 0, 10, workload.OK)
	b.claim("z", 2, 20, 30, 100, "zombie")
	b.claim("z", 3, 300, 310, 1000, "usurper")
	b.add(&workload.Op{Kind: workload.KindCommit, Claimant: "zombie", Deletes: []workload.Ref{{ID: "z", Version: 2}}, Zombie: true, Usurped: true}, 320, 330, workload.OK)
	r := run(t, b, b.final(1000))
	if !r.Has(NameCommits, "z") || !r.Has(NameLinearizable, "z") {
		t.Fatalf("zombie commit not reported: %v", r.Violations)
	}
	// A stale commit without the zombie mark: a read saw v3 first.
	b = newBuilder()
	b.insert("s", 0, 10, workload.OK)
	b.claim("s", 2, 20, 30, 100, "w1")
	b.claim("s", 3, 300, 310, 1000, "w2")
	b.del("s", 2, 320, 330, workload.OK)
	r = run(t, b, b.final(1000))
	if !r.Has(NameCommits, "s") {
		t.Fatalf("stale commit not reported: %v", r.Violations)
	}
	// Overlapping in time it is fine for the commit checker (the claim
	// may come after the commit), and linearizable... only if the commit
	// came first, which the claim's version contradicts.
	b = newBuilder()
	b.insert("o", 0, 10, workload.OK)
	b.claim("o", 2, 20, 30, 100, "w1")
	b.claim("o", 3, 300, 400, 1000, "w2")
	b.del("o", 2, 320, 330, workload.OK)
	r = run(t, b, b.final(1000))
	if r.Has(NameCommits, "o") {
		t.Errorf("concurrent commit and claim reported as stale by the commit checker")
	}
	if !r.Has(NameLinearizable, "o") {
		t.Errorf("delete of v2 and claim of v3 both accepted: not linearizable, not reported")
	}
}

func TestLeaseOverlap(t *testing.T) {
	b := newBuilder()
	b.insert("l", 0, 10, workload.OK)
	b.claim("l", 2, 20, 30, 5000, "w1") // lease until 5021
	b.claim("l", 3, 100, 110, 5000, "w2")
	r := run(t, b, b.final(1000, b.tv("l", 3, "g/in", 101, 5101)))
	if !r.Has(NameLeases, "l") {
		t.Fatalf("overlapping leases not reported: %v", r.Violations)
	}
	if !r.Has(NameLinearizable, "l") {
		t.Errorf("claim of an unavailable task not reported by the model")
	}
	if r.Has(NameCommits, "") || r.Has(NameLost, "") {
		t.Errorf("other checkers blame a correct-version history: %v", r.Violations)
	}
	// Released first: a change ends the claim, the next claim is fine.
	b = newBuilder()
	b.insert("l", 0, 10, workload.OK)
	b.claim("l", 2, 20, 30, 5000, "w1")
	b.add(&workload.Op{Kind: workload.KindCommit, Claimant: "w1", Changes: []workload.Change{{ID: "l", Version: 2}},
		Tasks: []workload.TaskVersion{b.tv("l", 3, "g/in", 41, 41)}}, 40, 50, workload.OK)
	b.claim("l", 4, 100, 110, 5000, "w2")
	if r := run(t, b, b.final(1000, b.tv("l", 4, "g/in", 101, 5101))); !r.OK() {
		t.Fatalf("claim after a release reported: %v", r.Violations)
	}
}

func TestChangeDuringAnotherLease(t *testing.T) {
	b := newBuilder()
	b.insert("k", 0, 10, workload.OK)
	b.claim("k", 2, 20, 30, 5000, "w1") // held until 5021
	b.add(&workload.Op{Kind: workload.KindCommit, Claimant: "intruder", Changes: []workload.Change{{ID: "k", Version: 2, NewQueue: "g/done"}},
		Tasks: []workload.TaskVersion{b.tv("k", 3, "g/done", 101, 101)}}, 100, 110, workload.OK)
	r := run(t, b, b.final(1000, b.tv("k", 3, "g/done", 101, 101)))
	if !r.Has(NameLeases, "k") {
		t.Fatalf("change by another claimant during the lease not reported: %v", r.Violations)
	}
	// After the lease ended it is allowed.
	b = newBuilder()
	b.insert("k", 0, 10, workload.OK)
	b.claim("k", 2, 20, 30, 50, "w1") // held until 71
	b.add(&workload.Op{Kind: workload.KindCommit, Claimant: "other", Changes: []workload.Change{{ID: "k", Version: 2, NewQueue: "g/done"}},
		Tasks: []workload.TaskVersion{b.tv("k", 3, "g/done", 101, 101)}}, 100, 110, workload.OK)
	if r := run(t, b, b.final(1000, b.tv("k", 3, "g/done", 101, 101))); !r.OK() {
		t.Fatalf("change after the lease reported: %v", r.Violations)
	}
}

func TestStaleRead(t *testing.T) {
	b := newBuilder()
	b.insert("r", 0, 10, workload.OK)
	b.claim("r", 2, 20, 30, 100, "w1")
	b.read("r", 1, 40, 50) // the claim ended before: v1 is gone
	r := run(t, b, b.final(1000, b.tv("r", 2, "g/in", 21, 121)))
	if !r.Has(NameLinearizable, "r") {
		t.Fatalf("stale read not reported: %v", r.Violations)
	}
	// Concurrent with the claim, either answer is fine.
	b = newBuilder()
	b.insert("r", 0, 10, workload.OK)
	b.claim("r", 2, 20, 30, 100, "w1")
	b.read("r", 1, 25, 50)
	if r := run(t, b, b.final(1000, b.tv("r", 2, "g/in", 21, 121))); !r.OK() {
		t.Fatalf("concurrent read reported: %v", r.Violations)
	}
}

func TestRefusalMustMatchState(t *testing.T) {
	// A delete refused as stale while nothing changed the task: the
	// refusal lied.
	b := newBuilder()
	b.insert("f", 0, 10, workload.OK)
	b.claim("f", 2, 20, 30, 1000, "w1")
	b.add(&workload.Op{Kind: workload.KindCommit, Deletes: []workload.Ref{{ID: "f", Version: 2}}, RefusedAll: true,
		Refused: []workload.Refused{{ID: "f", Version: 2, Category: "DELETE_STALE", Current: 3}}}, 40, 50, workload.Failed)
	r := run(t, b, b.final(1000, b.tv("f", 2, "g/in", 21, 1021)))
	if !r.Has(NameLinearizable, "f") {
		t.Fatalf("refusal inconsistent with the state not reported: %v", r.Violations)
	}
}

func TestUnknownClaimMayHaveClaimed(t *testing.T) {
	// A claim of unknown outcome took u (v2); the next known claim is v3.
	b := newBuilder()
	b.insert("u", 0, 10, workload.OK)
	b.add(&workload.Op{Kind: workload.KindClaim, Queues: []string{"g/in"}}, 20, 9000, workload.Unknown)
	b.claim("u", 3, 200, 210, 1000, "w2")
	if r := run(t, b, b.final(10000, b.tv("u", 3, "g/in", 201, 1201))); !r.OK() {
		t.Fatalf("a version made by an unknown claim reported: %v", r.Violations)
	}
	// Without it, the gap is a violation.
	b = newBuilder()
	b.insert("u", 0, 10, workload.OK)
	b.claim("u", 3, 200, 210, 1000, "w2")
	if r := run(t, b, b.final(10000, b.tv("u", 3, "g/in", 201, 1201))); !r.Has(NameLinearizable, "u") {
		t.Fatalf("an unexplained version not reported: %v", r.Violations)
	}
}

func TestLinearizeBudgetIsAFailure(t *testing.T) {
	b, final := good()
	r := All(Input{History: b.h, Final: final, LinearizeBudget: time.Nanosecond})
	if !r.Has(NameLinearizable, "") {
		t.Fatalf("an unfinished linearizability check passed")
	}
}

func TestReplicaAgreement(t *testing.T) {
	d1, d2 := [32]byte{1}, [32]byte{2}
	ok := []Replica{{1, "n1", 10, d1}, {1, "n2", 10, d1}, {1, "n3", 10, d1}, {2, "n1", 7, d2}, {2, "n2", 7, d2}}
	if vs, n := ReplicaAgreement(ok); len(vs) != 0 || n != 5 {
		t.Fatalf("agreeing replicas: %v (%d)", vs, n)
	}
	bad := []Replica{{1, "n1", 10, d1}, {1, "n2", 10, d2}, {2, "n1", 7, d2}, {2, "n2", 8, d2}}
	vs, _ := ReplicaAgreement(bad)
	if len(vs) != 2 {
		t.Fatalf("want a divergence and a non-convergence, got %v", vs)
	}
	for _, v := range vs {
		t.Log(v)
	}
}

func TestCoverageFloor(t *testing.T) {
	b, final := good()
	b.h.Count(CountLeaderChanges, 1)
	r := All(Input{History: b.h, Final: final, Floor: Floor{FloorOps: 5, CountLeaderChanges: 1, FloorStaleCommitAttempts: 1}})
	if !r.OK() {
		t.Fatalf("floor met, yet: %v", r.Violations)
	}
	r = All(Input{History: b.h, Final: final, Floor: Floor{CountLeaderChanges: 2, CountSnapshotInstalls: 1, FloorUnknown: 100}})
	if got := r.ByChecker()[NameCoverage]; got != 3 {
		t.Fatalf("want 3 coverage violations, got %v", r.Violations)
	}
	t.Log(r.Summary())
}
