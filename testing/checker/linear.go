package checker

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/e1158ecb/taskstore/testing/workload"
)

// Linearizable checks each task's history against a sequential model of a
// task's lifecycle with porcupine. The model's state is whether the task
// exists (or existed and was deleted), its version, and when its current
// version becomes available (shard time; unknown after an operation of
// unknown outcome):
//
//   - insert: the task must not exist; it becomes version 1;
//   - claim returning version w at time m with lease end a: the task must be
//     at w-1 and available at m; it becomes w, available at a;
//   - commit or transaction naming (id, v) in deletes, changes or depends:
//     the task must be at v; a delete removes it, a change makes the version
//     the change returned;
//   - a refused transaction constrains every version it names: listed as
//     stale (at its current version, not v), missing (absent), claimed (at
//     v), or not listed (at v: the refusal lists every offending reference);
//   - read: the task is absent, or at the version read. The final listing
//     is a read of every task.
//
// An operation of unknown outcome may take effect at any point after it
// started, or never (it is given an infinite return time, and the model
// lets it apply or not). A claim of unknown outcome may have claimed any
// task of its queues: it is added to the history of every task seen in
// those queues.
//
// Each task is checked within perTask (default 2s), all of them within
// budget (default 60s). A check that does not finish in time counts as a
// violation, as porcupine's "unknown" result does. It returns the violations
// and how many tasks it checked.
func Linearizable(h *workload.History, final *workload.Final, perTask, budget time.Duration) ([]Violation, int) {
	if perTask <= 0 {
		perTask = 2 * time.Second
	}
	if budget <= 0 {
		budget = 60 * time.Second
	}
	parts := partitions(h, final)
	ids := sortedKeys(parts)
	deadline := time.Now().Add(budget)
	var out []Violation
	checked := 0
	for i, id := range ids {
		left := time.Until(deadline)
		if left <= 0 {
			out = append(out, Violation{NameLinearizable, "", fmt.Sprintf("budget of %v exhausted: %d of %d tasks not checked", budget, len(ids)-i, len(ids))})
			break
		}
		ops := parts[id]
		res, _ := porcupine.CheckOperationsVerbose(taskModel, ops, min(perTask, left))
		checked++
		switch res {
		case porcupine.Ok:
		case porcupine.Illegal:
			out = append(out, Violation{NameLinearizable, id, "history is not linearizable: " + describeSteps(ops)})
		default:
			out = append(out, Violation{NameLinearizable, id, fmt.Sprintf("check did not finish within %v (porcupine: %s): %d operations", min(perTask, left), res, len(ops))})
		}
	}
	return out, checked
}

type stepKind int8

const (
	stepInsert stepKind = iota
	stepClaim
	stepMaybeClaim
	stepModify
	stepRead
)

// step is one operation as it concerns one task.
type step struct {
	op      *workload.Op
	kind    stepKind
	outcome workload.Outcome
	// modify: versions named (0: not named).
	del, chg, dep uint64
	// results: the version created (insert 1, claim, change) and its times.
	newVersion   uint64
	at, modified int64
	// a refused modify or insert: categories naming this task.
	refused []workload.Refused
	// read: the version read, 0 for absent.
	read uint64
	// final: the step is the final listing.
	final bool
}

// tstate is the model's state of one task.
type tstate struct {
	exists, gone bool
	version      uint64
	avail        int64 // unix nanos in shard time; 0 = unknown
}

var taskModel = (&porcupine.NondeterministicModel{
	Init: func() []interface{} { return []interface{}{tstate{}} },
	Step: func(state, input, _ interface{}) []interface{} {
		return stepTask(state.(tstate), input.(*step))
	},
	DescribeOperation: func(input, _ interface{}) string { return input.(*step).String() },
	DescribeState: func(state interface{}) string {
		s := state.(tstate)
		return fmt.Sprintf("%+v", s)
	},
}).ToModel()

func stepTask(s tstate, in *step) []interface{} {
	live := s.exists && !s.gone
	none := []interface{}{}
	same := []interface{}{s}
	switch in.kind {
	case stepInsert:
		switch in.outcome {
		case workload.OK:
			if s.exists {
				return none
			}
			return []interface{}{tstate{exists: true, version: 1, avail: in.at}}
		case workload.Unknown:
			if s.exists {
				return same
			}
			return []interface{}{s, tstate{exists: true, version: 1}}
		default: // refused with the list of offending references
			for _, r := range in.refused {
				if r.Category == "INSERT_DUPLICATE_ID" {
					if live {
						return same
					}
					return none
				}
			}
			if live {
				return none // the id existed, yet the refusal did not say so
			}
			return same
		}
	case stepClaim:
		if !live || s.version != in.newVersion-1 || s.avail != 0 && in.modified < s.avail {
			return none
		}
		return []interface{}{tstate{exists: true, version: in.newVersion, avail: in.at}}
	case stepMaybeClaim:
		if !live {
			return same
		}
		return []interface{}{s, tstate{exists: true, version: s.version + 1}}
	case stepRead:
		if in.read == 0 {
			if live {
				return none
			}
			return same
		}
		if !live || s.version != in.read {
			return none
		}
		return same
	case stepModify:
		pre := live && (in.del == 0 || s.version == in.del) && (in.chg == 0 || s.version == in.chg) && (in.dep == 0 || s.version == in.dep)
		applied := s
		if in.del != 0 {
			applied.gone = true
		} else if in.chg != 0 {
			applied.version, applied.avail = s.version+1, 0
			if in.outcome == workload.OK {
				applied.version, applied.avail = in.newVersion, in.at
			}
		}
		switch in.outcome {
		case workload.OK:
			if !pre {
				return none
			}
			return []interface{}{applied}
		case workload.Unknown:
			if !pre {
				return same
			}
			return []interface{}{s, applied}
		default:
			if refusedConsistent(s, in) {
				return same
			}
			return none
		}
	}
	return none
}

// refusedConsistent reports whether a refusal that lists in.refused for
// this task is consistent with state s.
func refusedConsistent(s tstate, in *step) bool {
	live := s.exists && !s.gone
	for _, named := range []struct {
		v        uint64
		family   string
		isClaimR bool
	}{{in.dep, "DEPEND", false}, {in.del, "DELETE", true}, {in.chg, "CHANGE", true}} {
		if named.v == 0 {
			continue
		}
		var stale, missing, claimed bool
		var current uint64
		for _, r := range in.refused {
			switch r.Category {
			case named.family + "_STALE":
				stale, current = true, r.Current
			case named.family + "_MISSING":
				missing = true
			case "CLAIMED":
				claimed = claimed || named.isClaimR
			}
		}
		switch {
		case missing:
			if live {
				return false
			}
		case stale:
			if !live || s.version == named.v || current != 0 && s.version != current {
				return false
			}
		default: // claimed, or valid (not listed)
			_ = claimed
			if !live || s.version != named.v {
				return false
			}
		}
	}
	return true
}

func (s *step) String() string {
	var b strings.Builder
	switch s.kind {
	case stepInsert:
		b.WriteString("insert")
	case stepClaim:
		fmt.Fprintf(&b, "claim->v%d", s.newVersion)
	case stepMaybeClaim:
		b.WriteString("claim?")
	case stepRead:
		if s.final {
			b.WriteString("final ")
		}
		if s.read == 0 {
			b.WriteString("read->absent")
		} else {
			fmt.Fprintf(&b, "read->v%d", s.read)
		}
	case stepModify:
		if s.dep != 0 {
			fmt.Fprintf(&b, "depend v%d ", s.dep)
		}
		if s.del != 0 {
			fmt.Fprintf(&b, "delete v%d ", s.del)
		}
		if s.chg != 0 {
			fmt.Fprintf(&b, "change v%d->v%d ", s.chg, s.newVersion)
		}
	}
	head := strings.TrimSpace(b.String())
	b.Reset()
	b.WriteString(head)
	fmt.Fprintf(&b, " %s", s.outcome)
	for _, r := range s.refused {
		fmt.Fprintf(&b, " %s", r.Category)
		if r.Current != 0 {
			fmt.Fprintf(&b, "(current v%d)", r.Current)
		}
	}
	if s.op != nil {
		fmt.Fprintf(&b, " #%d", s.op.Index)
	}
	return strings.TrimSpace(b.String())
}

// describeSteps lists a task's operations by start time, for a report.
func describeSteps(ops []porcupine.Operation) string {
	sorted := append([]porcupine.Operation(nil), ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	var parts []string
	for _, o := range sorted {
		ret := "inf"
		if o.Return != math.MaxInt64 {
			ret = fmt.Sprintf("%.3fs", float64(o.Return)/1e9)
		}
		parts = append(parts, fmt.Sprintf("[%.3fs..%s] %s", float64(o.Call)/1e9, ret, o.Input.(*step)))
	}
	return strings.Join(parts, "; ")
}

// partitions builds each task's porcupine history.
func partitions(h *workload.History, final *workload.Final) map[string][]porcupine.Operation {
	ix := newIndex(h)
	base := h.Base()
	parts := map[string][]porcupine.Operation{}
	add := func(id string, op *workload.Op, s *step) {
		s.op = op
		call, ret := op.Interval(base)
		r := ret.Nanoseconds()
		if s.outcome == workload.Unknown {
			r = math.MaxInt64
		}
		parts[id] = append(parts[id], porcupine.Operation{ClientId: 0, Input: s, Call: call.Nanoseconds(), Return: r})
	}
	refusedFor := func(op *workload.Op, id string) []workload.Refused {
		var out []workload.Refused
		for _, r := range op.Refused {
			if r.ID == id {
				out = append(out, r)
			}
		}
		return out
	}
	// The queues each task was seen in, for claims of unknown outcome.
	queuesOf := map[string]map[string]bool{}
	seenIn := func(id, q string) {
		if q == "" {
			return
		}
		if queuesOf[id] == nil {
			queuesOf[id] = map[string]bool{}
		}
		queuesOf[id][q] = true
	}
	var unknownClaims []*workload.Op
	for _, op := range ix.ops {
		for _, in := range op.Inserts {
			seenIn(in.ID, in.Queue)
		}
		for _, c := range op.Changes {
			seenIn(c.ID, c.NewQueue)
		}
		for _, t := range op.Tasks {
			seenIn(t.ID, t.Queue)
		}
		// A refusal without the list of references (invalid request) says
		// nothing about any task; neither does a failed claim or read.
		if op.Outcome == workload.Failed && !op.RefusedAll {
			continue
		}
		switch op.Kind {
		case workload.KindClaim:
			switch op.Outcome {
			case workload.OK:
				for _, t := range op.Tasks {
					add(t.ID, op, &step{kind: stepClaim, outcome: op.Outcome, newVersion: t.Version, at: t.At.UnixNano(), modified: t.Modified.UnixNano()})
				}
			case workload.Unknown:
				unknownClaims = append(unknownClaims, op)
			}
		case workload.KindRead:
			if op.Outcome != workload.OK {
				continue
			}
			got := map[string]uint64{}
			for _, t := range op.Tasks {
				got[t.ID] = t.Version
			}
			for _, id := range op.Reads {
				add(id, op, &step{kind: stepRead, outcome: op.Outcome, read: got[id]})
			}
		default: // inserts, commits, transactions
			result := map[string]workload.TaskVersion{}
			for _, t := range op.Tasks {
				result[t.ID] = t
			}
			for _, in := range op.Inserts {
				s := &step{kind: stepInsert, outcome: op.Outcome, refused: refusedFor(op, in.ID)}
				if t, ok := result[in.ID]; ok {
					s.newVersion, s.at = t.Version, t.At.UnixNano()
				}
				add(in.ID, op, s)
			}
			named := map[string]*step{}
			get := func(id string) *step {
				if s := named[id]; s != nil {
					return s
				}
				s := &step{kind: stepModify, outcome: op.Outcome, refused: refusedFor(op, id)}
				named[id] = s
				return s
			}
			for _, d := range op.Deletes {
				get(d.ID).del = d.Version
			}
			for _, c := range op.Changes {
				s := get(c.ID)
				s.chg = c.Version
				if t, ok := result[c.ID]; ok {
					s.newVersion, s.at = t.Version, t.At.UnixNano()
				}
			}
			for _, d := range op.Depends {
				get(d.ID).dep = d.Version
			}
			for _, id := range sortedKeys(named) {
				add(id, op, named[id])
			}
		}
	}
	for _, op := range unknownClaims {
		for id, qs := range queuesOf {
			for _, q := range op.Queues {
				if qs[q] {
					add(id, op, &step{kind: stepMaybeClaim, outcome: workload.Unknown})
					break
				}
			}
		}
	}
	if final != nil {
		present := final.ByID()
		fop := &workload.Op{Index: -1, Kind: workload.KindRead, Worker: "final", Start: final.Start, End: final.End, Outcome: workload.OK}
		for id := range parts {
			var v uint64
			if ts := present[id]; len(ts) > 0 {
				v = ts[0].Version
			}
			add(id, fop, &step{kind: stepRead, outcome: workload.OK, read: v, final: true})
		}
		for id, ts := range present {
			if _, ok := parts[id]; !ok {
				add(id, fop, &step{kind: stepRead, outcome: workload.OK, read: ts[0].Version, final: true})
			}
		}
	}
	return parts
}
