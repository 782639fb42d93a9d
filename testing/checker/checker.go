// Package checker judges a recorded workload (testing/workload) and the
// state read from the cluster afterwards. Each checker is a function that
// returns the violations it found; All runs every one.
//
//   - Lost: an acknowledged insert is neither present at the end nor
//     deleted by a commit that may have applied.
//   - Phantom: a task is present whose insert failed definitively (or that
//     nobody inserted), a task listed twice, a task whose acknowledged delete
//     did not stick, a transaction half applied.
//   - Commits: a task version created twice, committed twice, or a commit
//     accepted for a version already superseded (a stale or zombie commit).
//   - Leases: a claim of a task before its previous version was available
//     (before the lease of the previous claim ended), in the shard's time.
//   - Replicas: voters of a shard with equal applied indexes but different
//     state digests.
//   - Logs: replicas of a shard whose Raft logs hold different entries at
//     an index they all hold (same index and term must mean same entry).
//   - Linearizable: each task's history is linearizable against a model of
//     the task's lifecycle (porcupine); a check that times out is a failure.
//   - Coverage: the run did what it claims (counts above a floor).
package checker

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/e1158ecb/taskstore/testing/workload"
)

// Violation is one broken guarantee.
type Violation struct {
	Checker string
	// Task is the task concerned, when there is one.
	Task   string
	Detail string
}

func (v Violation) String() string {
	if v.Task != "" {
		return fmt.Sprintf("%s: %s: %s", v.Checker, v.Task, v.Detail)
	}
	return fmt.Sprintf("%s: %s", v.Checker, v.Detail)
}

// Names of the checkers, in the order All runs them.
const (
	NameLost         = "lost"
	NamePhantom      = "phantom"
	NameCommits      = "commits"
	NameLeases       = "leases"
	NameReplicas     = "replicas"
	NameLogs         = "logs"
	NameLinearizable = "linearizable"
	NameCoverage     = "coverage"
)

// Names lists every checker.
var Names = []string{NameLost, NamePhantom, NameCommits, NameLeases, NameReplicas, NameLogs, NameLinearizable, NameCoverage}

// Input is everything the checkers look at.
type Input struct {
	History *workload.History
	Final   *workload.Final
	// Replicas, when set, are the shards' voters sampled at a barrier.
	Replicas []Replica
	// Logs, when set, are the replicas' Raft logs (ReadLog, ReadLogFile).
	Logs []ReplicaLog
	// Floor is the coverage minimum; nil checks nothing.
	Floor Floor
	// LinearizeTimeout bounds porcupine for one task (default 2s); the
	// whole linearizability check is bounded by LinearizeBudget (default
	// 60s).
	LinearizeTimeout time.Duration
	LinearizeBudget  time.Duration
}

// Report is the result of All.
type Report struct {
	Violations []Violation
	// Checked counts what each checker examined (tasks, versions, claims,
	// replicas, ...), so a summary shows it did work.
	Checked map[string]int
	Stats   Stats
}

// OK reports whether no checker found a violation.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// ByChecker counts the violations of each checker.
func (r *Report) ByChecker() map[string]int {
	out := map[string]int{}
	for _, v := range r.Violations {
		out[v.Checker]++
	}
	return out
}

// Has reports whether a checker found a violation about task (any task
// when task is empty).
func (r *Report) Has(checker, task string) bool {
	for _, v := range r.Violations {
		if v.Checker == checker && (task == "" || v.Task == task) {
			return true
		}
	}
	return false
}

// Summary is one line: operations, faults, leader changes, unknown
// outcomes, and every checker's examined count and violations.
func (r *Report) Summary() string {
	s := r.Stats
	var b strings.Builder
	fmt.Fprintf(&b, "ops=%d (insert=%d claim=%d commit=%d txn=%d read=%d) unknown=%d failed=%d faults=%d leader-changes=%d snapshot-installs=%d membership-changes=%d slot-moves=%d stale-commit-attempts=%d zombie-refused=%d",
		s.Ops, s.ByKind[workload.KindInsert], s.ByKind[workload.KindClaim], s.ByKind[workload.KindCommit], s.ByKind[workload.KindTxn], s.ByKind[workload.KindRead],
		s.Unknown, s.Failed, s.Counts[CountFaults], s.Counts[CountLeaderChanges], s.Counts[CountSnapshotInstalls], s.Counts[CountMembershipChanges], s.Counts[CountSlotMoves], s.StaleCommitAttempts, s.ZombieRefused)
	fmt.Fprintf(&b, " p50=%v p99=%v", s.P50.Round(100*time.Microsecond), s.P99.Round(100*time.Microsecond))
	by := r.ByChecker()
	b.WriteString(" |")
	for _, n := range Names {
		fmt.Fprintf(&b, " %s=%d/%d", n, by[n], r.Checked[n])
	}
	b.WriteString(" (violations/checked)")
	return b.String()
}

// All runs every checker.
func All(in Input) *Report {
	r := &Report{Checked: map[string]int{}, Stats: Compute(in.History)}
	add := func(name string, vs []Violation, checked int) {
		r.Violations = append(r.Violations, vs...)
		r.Checked[name] = checked
	}
	vs, n := Lost(in.History, in.Final)
	add(NameLost, vs, n)
	vs, n = Phantom(in.History, in.Final)
	add(NamePhantom, vs, n)
	vs, n = Commits(in.History)
	add(NameCommits, vs, n)
	vs, n = Leases(in.History)
	add(NameLeases, vs, n)
	if in.Replicas != nil {
		vs, n = ReplicaAgreement(in.Replicas)
		add(NameReplicas, vs, n)
	}
	if in.Logs != nil {
		vs, n = LogAgreement(in.Logs)
		add(NameLogs, vs, n)
	}
	vs, n = Linearizable(in.History, in.Final, in.LinearizeTimeout, in.LinearizeBudget)
	add(NameLinearizable, vs, n)
	if in.Floor != nil {
		vs = Coverage(r.Stats, in.Floor)
		add(NameCoverage, vs, len(in.Floor))
	}
	return r
}

// index gathers, per task id, the ops that name it.
type index struct {
	ops      []*workload.Op
	inserts  map[string][]*workload.Op // ops inserting the id
	deletes  map[string][]*workload.Op // ops deleting some version of the id
	touching map[string][]*workload.Op // every op naming or returning the id
}

func newIndex(h *workload.History) *index {
	ix := &index{ops: h.Ops(), inserts: map[string][]*workload.Op{}, deletes: map[string][]*workload.Op{}, touching: map[string][]*workload.Op{}}
	sort.SliceStable(ix.ops, func(i, j int) bool { return ix.ops[i].Start.Before(ix.ops[j].Start) })
	for _, op := range ix.ops {
		seen := map[string]bool{}
		touch := func(id string) {
			if !seen[id] {
				seen[id] = true
				ix.touching[id] = append(ix.touching[id], op)
			}
		}
		for _, in := range op.Inserts {
			ix.inserts[in.ID] = append(ix.inserts[in.ID], op)
			touch(in.ID)
		}
		for _, d := range op.Deletes {
			ix.deletes[d.ID] = append(ix.deletes[d.ID], op)
			touch(d.ID)
		}
		for _, c := range op.Changes {
			touch(c.ID)
		}
		for _, d := range op.Depends {
			touch(d.ID)
		}
		for _, id := range op.Reads {
			touch(id)
		}
		for _, t := range op.Tasks {
			touch(t.ID)
		}
	}
	return ix
}

func describe(op *workload.Op) string {
	return fmt.Sprintf("op #%d %s by %s %s [%s..%s]", op.Index, op.Kind, op.Worker, op.Outcome,
		op.Start.Format("15:04:05.000"), op.End.Format("15:04:05.000"))
}
