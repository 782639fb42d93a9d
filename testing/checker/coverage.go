package checker

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/e1158ecb/taskstore/testing/workload"
)

// History counters a scenario records (History.Count / History.Note).
const (
	CountFaults           = "faults"
	CountLeaderChanges    = "leader-changes"
	CountSnapshotInstalls = "snapshot-installs"
	// CountMembershipChanges counts nodes added and removed under load.
	CountMembershipChanges = "membership-changes"
	// CountSlotMoves counts slot moves that finished done (the routing
	// table names the new shard) under load.
	CountSlotMoves = "slot-moves"
)

// Stats are the counts a run's coverage is judged on.
type Stats struct {
	Ops     int
	ByKind  map[workload.Kind]int
	OK      int
	Failed  int
	Unknown int
	// StaleCommitAttempts: zombie commits tried after another claimant's
	// claim of the task succeeded; ZombieRefused: those refused.
	StaleCommitAttempts int
	ZombieRefused       int
	// Claimed: tasks handed out by acknowledged claims; Reclaimed: claims
	// that returned a version above 2 (the task was claimed before).
	Claimed   int
	Reclaimed int
	// RefusedTxns: transactions refused (e.g. a stale dependency).
	RefusedTxns int
	// Counts are the history's counters: faults, leader changes, snapshot
	// installs...
	Counts map[string]int
	// P50 and P99 are latencies of acknowledged writes (inserts, commits,
	// transactions) and claims, faults included.
	P50, P99 time.Duration
}

// Compute derives the stats of a history.
func Compute(h *workload.History) Stats {
	s := Stats{ByKind: map[workload.Kind]int{}, Counts: h.Counts()}
	var lat []time.Duration
	for _, op := range h.Ops() {
		if op.Outcome == workload.OK && op.Kind != workload.KindRead {
			lat = append(lat, op.End.Sub(op.Start))
		}
		s.Ops++
		s.ByKind[op.Kind]++
		switch op.Outcome {
		case workload.OK:
			s.OK++
		case workload.Failed:
			s.Failed++
		case workload.Unknown:
			s.Unknown++
		}
		if op.Zombie && op.Usurped {
			s.StaleCommitAttempts++
			if op.Outcome == workload.Failed {
				s.ZombieRefused++
			}
		}
		if op.Kind == workload.KindClaim && op.Outcome == workload.OK {
			s.Claimed += len(op.Tasks)
			for _, t := range op.Tasks {
				if t.Version > 2 {
					s.Reclaimed++
				}
			}
		}
		if op.Kind == workload.KindTxn && op.Outcome == workload.Failed {
			s.RefusedTxns++
		}
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		s.P50, s.P99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	return s
}

// Floor is the coverage minimum of a scenario, by the names below or any
// history counter (faults, leader-changes, snapshot-installs...).
type Floor map[string]int

// Names a Floor may use besides history counters.
const (
	FloorOps                 = "ops"
	FloorUnknown             = "unknown"
	FloorStaleCommitAttempts = "stale-commit-attempts"
	FloorClaimed             = "claimed"
	FloorReclaimed           = "reclaimed"
	FloorRefusedTxns         = "refused-txns"
	FloorCommits             = "commits"
	FloorTxns                = "txns"
	FloorReads               = "reads"
)

// Value returns the stat a floor name refers to.
func (s Stats) Value(name string) int {
	switch name {
	case FloorOps:
		return s.Ops
	case FloorUnknown:
		return s.Unknown
	case FloorStaleCommitAttempts:
		return s.StaleCommitAttempts
	case FloorClaimed:
		return s.Claimed
	case FloorReclaimed:
		return s.Reclaimed
	case FloorRefusedTxns:
		return s.RefusedTxns
	case FloorCommits:
		return s.ByKind[workload.KindCommit]
	case FloorTxns:
		return s.ByKind[workload.KindTxn]
	case FloorReads:
		return s.ByKind[workload.KindRead]
	}
	return s.Counts[name]
}

// Coverage reports every floor the run stayed under: a run that injected
// no fault, or saw no leader change, proves nothing about them.
func Coverage(s Stats, floor Floor) []Violation {
	names := make([]string, 0, len(floor))
	for n := range floor {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []Violation
	for _, n := range names {
		if got := s.Value(n); got < floor[n] {
			out = append(out, Violation{Checker: NameCoverage, Detail: fmt.Sprintf("%s = %d, below the floor of %d", n, got, floor[n])})
		}
	}
	return out
}
