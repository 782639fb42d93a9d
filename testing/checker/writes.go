package checker

import (
	"fmt"
	"sort"

	"github.com/e1158ecb/taskstore/testing/workload"
)

// Lost finds acknowledged inserts that are gone: the task is not present at
// the end and no commit that may have applied (acknowledged or unknown, and
// naming a version not known to be superseded) deleted it. It returns the violations and how many acknowledged inserts it
// checked.
func Lost(h *workload.History, final *workload.Final) ([]Violation, int) {
	ix := newIndex(h)
	present := final.ByID()
	var out []Violation
	checked := 0
	ids := sortedKeys(ix.inserts)
	for _, id := range ids {
		var acked *workload.Op
		for _, op := range ix.inserts[id] {
			if op.Outcome == workload.OK {
				acked = op
				break
			}
		}
		if acked == nil {
			continue
		}
		checked++
		if len(present[id]) > 0 {
			continue
		}
		// A delete of version v may have applied unless the task was seen
		// at a later version (by any acknowledged operation, before or
		// after: versions only grow, and a deleted task is seen no more).
		var latest uint64
		for _, op := range ix.touching[id] {
			if op.Outcome != workload.OK {
				continue
			}
			for _, t := range op.Tasks {
				if t.ID == id {
					latest = max(latest, t.Version)
				}
			}
		}
		deleted := false
		for _, op := range ix.deletes[id] {
			for _, d := range op.Deletes {
				if d.ID == id && op.Outcome != workload.Failed && d.Version >= latest {
					deleted = true
				}
			}
		}
		if !deleted {
			out = append(out, Violation{NameLost, id, "acknowledged insert is missing at the end and was never deleted: " + describe(acked)})
		}
	}
	return out, checked
}

// Phantom finds tasks that should not be there: present at the end although
// every insert of them failed definitively (or none was made), listed more
// than once, present although an acknowledged delete removed them, or the
// child of a transaction present while the parent it deleted is still at
// the deleted version (half applied). It returns the violations and how
// many tasks it checked.
func Phantom(h *workload.History, final *workload.Final) ([]Violation, int) {
	ix := newIndex(h)
	present := final.ByID()
	var out []Violation
	ids := sortedKeys(present)
	for _, id := range ids {
		listed := present[id]
		if len(listed) > 1 {
			out = append(out, Violation{NamePhantom, id, fmt.Sprintf("listed %d times at the end (queues %s and %s)", len(listed), listed[0].Queue, listed[1].Queue)})
		}
		ins := ix.inserts[id]
		if len(ins) == 0 {
			out = append(out, Violation{NamePhantom, id, "present at the end but never inserted"})
			continue
		}
		failed := 0
		for _, op := range ins {
			if op.Outcome == workload.Failed {
				failed++
			}
		}
		if failed == len(ins) {
			out = append(out, Violation{NamePhantom, id, "present at the end although its insert failed definitively: " + describe(ins[0])})
		}
		for _, op := range ix.deletes[id] {
			if op.Outcome == workload.OK {
				out = append(out, Violation{NamePhantom, id, fmt.Sprintf("present at the end (v%d) although deleted by %s", listed[0].Version, describe(op))})
			}
		}
	}
	// Transactions: all or nothing. A refused or unknown transaction whose
	// inserted child is present must have deleted its parent's version.
	for _, op := range ix.ops {
		if op.Kind != workload.KindTxn || op.Outcome == workload.OK {
			continue
		}
		childThere := false
		for _, in := range op.Inserts {
			childThere = childThere || len(present[in.ID]) > 0
		}
		if !childThere {
			continue
		}
		for _, d := range op.Deletes {
			for _, t := range present[d.ID] {
				if t.Version == d.Version {
					out = append(out, Violation{NamePhantom, d.ID, fmt.Sprintf("transaction half applied: its insert is present but v%d it deleted is still there: %s", d.Version, describe(op))})
				}
			}
		}
	}
	return out, len(ids)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
