package checker

import (
	"fmt"
	"sort"

	"github.com/e1158ecb/taskstore/testing/workload"
)

// Commits checks that a task version is committed at most once:
//
//   - no two acknowledged operations created the same version of a task
//     (an insert, claim or change returns the version it created);
//   - no two acknowledged commits (deletes or changes) named the same
//     version;
//   - no acknowledged commit named a version that an operation finished
//     before the commit started had already seen superseded (a stale
//     commit; a zombie's commit after another claim is one);
//   - no acknowledged commit named a task deleted by an acknowledged
//     delete that finished before it started.
//
// It returns the violations and how many committed versions it checked.
func Commits(h *workload.History) ([]Violation, int) {
	ix := newIndex(h)
	var out []Violation
	type key struct {
		id string
		v  uint64
	}
	created := map[key][]*workload.Op{}
	committed := map[key][]*workload.Op{}
	for _, op := range ix.ops {
		if op.Outcome != workload.OK {
			continue
		}
		if op.Kind != workload.KindRead {
			for _, t := range op.Tasks {
				created[key{t.ID, t.Version}] = append(created[key{t.ID, t.Version}], op)
			}
		}
		for _, d := range op.Deletes {
			committed[key{d.ID, d.Version}] = append(committed[key{d.ID, d.Version}], op)
		}
		for _, c := range op.Changes {
			committed[key{c.ID, c.Version}] = append(committed[key{c.ID, c.Version}], op)
		}
	}
	sortKeys := func(m map[key][]*workload.Op) []key {
		ks := make([]key, 0, len(m))
		for k := range m {
			ks = append(ks, k)
		}
		sort.Slice(ks, func(i, j int) bool { return ks[i].id < ks[j].id || ks[i].id == ks[j].id && ks[i].v < ks[j].v })
		return ks
	}
	for _, k := range sortKeys(created) {
		if ops := created[k]; len(ops) > 1 {
			out = append(out, Violation{NameCommits, k.id, fmt.Sprintf("version %d created twice: %s and %s", k.v, describe(ops[0]), describe(ops[1]))})
		}
	}
	for _, k := range sortKeys(committed) {
		if ops := committed[k]; len(ops) > 1 {
			out = append(out, Violation{NameCommits, k.id, fmt.Sprintf("version %d committed twice: %s and %s", k.v, describe(ops[0]), describe(ops[1]))})
		}
	}

	// Stale commits: for each acknowledged commit of (id, v), an
	// acknowledged operation that ended before it started and returned the
	// task at a later version, or deleted it.
	for _, k := range sortKeys(committed) {
		for _, c := range committed[k] {
			if c.Zombie && c.Usurped {
				out = append(out, Violation{NameCommits, k.id, fmt.Sprintf("zombie commit of v%d accepted after another claimant's claim: %s", k.v, describe(c))})
				continue
			}
			for _, op := range ix.touching[k.id] {
				if op == c || op.Outcome != workload.OK || !op.End.Before(c.Start) {
					continue
				}
				stale := false
				for _, t := range op.Tasks {
					if t.ID == k.id && t.Version > k.v {
						stale = true
						out = append(out, Violation{NameCommits, k.id, fmt.Sprintf("stale commit of v%d accepted: %s saw v%d before it started: %s", k.v, describe(c), t.Version, describe(op))})
						break
					}
				}
				if stale {
					break
				}
				deleted := false
				for _, d := range op.Deletes {
					if d.ID == k.id {
						deleted = true
						out = append(out, Violation{NameCommits, k.id, fmt.Sprintf("commit of v%d accepted after the task was deleted (v%d) by %s: %s", k.v, d.Version, describe(op), describe(c))})
					}
				}
				if deleted {
					break
				}
			}
		}
	}
	return out, len(committed)
}
