package checker

import (
	"fmt"

	"github.com/e1158ecb/taskstore/testing/workload"
)

// Leases checks lease exclusivity in the shard's time: an acknowledged claim
// that returned version v of a task must have happened (its `modified`, the
// leader's time of the claim) no earlier than version v-1's `at` when an
// acknowledged operation returned v-1. For v-1 made by a claim, `at` is that
// claim's lease end: two consecutive claims never overlap. For v-1 made by
// an insert or a change, it is when the task became available (a delayed
// task, or one released with a delay).
//
// It also reports an acknowledged change of a claimed version by another
// claimant before that claim's lease ended (in the change's `modified`).
//
// It returns the violations and how many claims (and changes of claimed
// versions by others) it could judge.
func Leases(h *workload.History) ([]Violation, int) {
	ix := newIndex(h)
	type key struct {
		id string
		v  uint64
	}
	type made struct {
		t  workload.TaskVersion
		op *workload.Op
	}
	versions := map[key]made{}
	for _, op := range ix.ops {
		if op.Outcome != workload.OK || op.Kind == workload.KindRead {
			continue
		}
		for _, t := range op.Tasks {
			if _, ok := versions[key{t.ID, t.Version}]; !ok {
				versions[key{t.ID, t.Version}] = made{t, op}
			}
		}
	}
	var out []Violation
	checked := 0
	for _, op := range ix.ops {
		if op.Kind != workload.KindClaim || op.Outcome != workload.OK {
			continue
		}
		for _, t := range op.Tasks {
			prev, ok := versions[key{t.ID, t.Version - 1}]
			if !ok || t.Version < 2 {
				continue
			}
			checked++
			if t.Modified.Before(prev.t.At) {
				what := "was available"
				if prev.op.Kind == workload.KindClaim {
					what = fmt.Sprintf("the lease of %s (v%d) ended", prev.t.Claimant, prev.t.Version)
				}
				out = append(out, Violation{NameLeases, t.ID, fmt.Sprintf("claimed as v%d by %s at %s, %v before %s at %s: %s, previous %s",
					t.Version, t.Claimant, t.Modified.Format("15:04:05.000"), prev.t.At.Sub(t.Modified), what,
					prev.t.At.Format("15:04:05.000"), describe(op), describe(prev.op))})
			}
		}
	}
	// A change of a claimed version by another claimant before the lease
	// ended (the change returns its time as `modified`): the holder's lease
	// was not exclusive.
	for _, op := range ix.ops {
		if op.Outcome != workload.OK {
			continue
		}
		result := map[string]workload.TaskVersion{}
		for _, t := range op.Tasks {
			result[t.ID] = t
		}
		for _, c := range op.Changes {
			prev, ok := versions[key{c.ID, c.Version}]
			t, changed := result[c.ID]
			if !ok || !changed || prev.op.Kind != workload.KindClaim || prev.t.Claimant == op.Claimant {
				continue
			}
			checked++
			if t.Modified.Before(prev.t.At) {
				out = append(out, Violation{NameLeases, c.ID, fmt.Sprintf("v%d held by %s until %s was changed by %q at %s: %s",
					c.Version, prev.t.Claimant, prev.t.At.Format("15:04:05.000"), op.Claimant, t.Modified.Format("15:04:05.000"), describe(op))})
			}
		}
	}
	return out, checked
}
