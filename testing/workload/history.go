// Package workload drives a Taskstore cluster with concurrent clients and
// records every operation into a History for the checkers
// (testing/checker): inserts with unique client-chosen ids, claims, commits
// (delete, or move to another queue), dependency transactions, reads, and
// zombie workers that hold a claim past its lease and then try to commit.
//
// Each operation is recorded with its wall-clock start and end (with Go's
// monotonic reading, so intervals compare correctly), its inputs, its
// outputs and an outcome: OK, Failed (definitively refused: nothing
// changed) or Unknown (it may or may not have applied: Unavailable, a
// deadline, a broken connection).
package workload

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// Outcome is how an operation ended.
type Outcome int8

const (
	// OK: acknowledged.
	OK Outcome = iota
	// Failed: definitively refused (FailedPrecondition, InvalidArgument,
	// ResourceExhausted): nothing changed.
	Failed
	// Unknown: the outcome is not known (Unavailable, deadline, broken
	// connection): it may have applied.
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Failed:
		return "failed"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("outcome(%d)", int8(o))
}

// MarshalText writes the outcome's name.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// Classify maps a Client error to an outcome: nil is OK; a refusal or an
// invalid or oversized request is Failed (the cluster changed nothing);
// anything else is Unknown.
func Classify(err error) Outcome {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, client.ErrRefused), errors.Is(err, client.ErrInvalid), errors.Is(err, client.ErrTooLarge):
		return Failed
	}
	return Unknown
}

// Kind is what an operation did.
type Kind string

const (
	// KindInsert is a Modify with inserts only.
	KindInsert Kind = "insert"
	// KindClaim is a Claim.
	KindClaim Kind = "claim"
	// KindCommit is a Modify that deletes or changes (moves, releases)
	// claimed task versions.
	KindCommit Kind = "commit"
	// KindTxn is a dependency transaction: depends, deletes and inserts in
	// one Modify.
	KindTxn Kind = "txn"
	// KindRead is a linearizable read of tasks by id.
	KindRead Kind = "read"
)

// Ref names a task version.
type Ref struct {
	ID      string `json:"id"`
	Version uint64 `json:"version"`
}

// Insert is one insert of a Modify.
type Insert struct {
	ID    string `json:"id"`
	Queue string `json:"queue"`
}

// Change is one change of a Modify. NewQueue is empty for a change that
// stays in its queue (a release).
type Change struct {
	ID       string `json:"id"`
	Version  uint64 `json:"version"`
	NewQueue string `json:"new_queue,omitempty"`
}

// TaskVersion is a task as an operation returned it.
type TaskVersion struct {
	ID       string `json:"id"`
	Version  uint64 `json:"version"`
	Queue    string `json:"queue"`
	Claimant string `json:"claimant,omitempty"`
	// At: when the task is available; while claimed, the lease end. In the
	// shard's (leader's) time.
	At time.Time `json:"at"`
	// Modified: the time of the change or claim that made this version, in
	// the shard's time.
	Modified time.Time `json:"modified"`
}

// FromTask converts a task of the API.
func FromTask(t *taskstorepb.Task) TaskVersion {
	return TaskVersion{ID: t.Id, Version: t.Version, Queue: t.Queue, Claimant: t.Claimant,
		At: t.At.AsTime(), Modified: t.Modified.AsTime()}
}

// Refused is one offending reference of a refused transaction.
type Refused struct {
	ID       string `json:"id"`
	Version  uint64 `json:"version,omitempty"`
	Category string `json:"category"`
	// Current is the version the task had (stale references).
	Current uint64 `json:"current,omitempty"`
}

// Op is one recorded operation.
type Op struct {
	Index   int       `json:"index"`
	Worker  string    `json:"worker"`
	Kind    Kind      `json:"kind"`
	Start   time.Time `json:"start"`
	End     time.Time `json:"end"`
	Outcome Outcome   `json:"outcome"`
	Err     string    `json:"err,omitempty"`

	// Inputs.
	Claimant string        `json:"claimant,omitempty"`
	Queues   []string      `json:"queues,omitempty"` // claim
	Lease    time.Duration `json:"lease,omitempty"`  // claim
	Inserts  []Insert      `json:"inserts,omitempty"`
	Changes  []Change      `json:"changes,omitempty"`
	Deletes  []Ref         `json:"deletes,omitempty"`
	Depends  []Ref         `json:"depends,omitempty"`
	Reads    []string      `json:"reads,omitempty"` // ids read

	// Outputs. Tasks holds what the cluster returned: the claimed tasks,
	// or the inserted then the changed tasks, or the tasks read.
	Tasks []TaskVersion `json:"tasks,omitempty"`
	// Refused lists every offending reference when Outcome is Failed
	// because the transaction was refused (a DependencyError); RefusedAll
	// is set then, meaning the references not listed were valid.
	Refused    []Refused `json:"refused,omitempty"`
	RefusedAll bool      `json:"refused_all,omitempty"`

	// Zombie marks a commit of a claim held past its lease; Usurped, that
	// another claimant's claim of the task succeeded before it started: the
	// commit must be refused.
	Zombie  bool `json:"zombie,omitempty"`
	Usurped bool `json:"usurped,omitempty"`
}

// Interval returns the op's start and end as offsets from base (monotonic
// when both carry a monotonic reading).
func (o *Op) Interval(base time.Time) (start, end time.Duration) {
	return o.Start.Sub(base), o.End.Sub(base)
}

// History is a thread-safe log of operations and of the faults and events
// a run injected or observed.
type History struct {
	mu     sync.Mutex
	base   time.Time
	ops    []*Op
	counts map[string]int
	notes  []Note
}

// Note is an event of the run (a fault injected, a leader change seen).
type Note struct {
	At   time.Time `json:"at"`
	Kind string    `json:"kind"`
	Text string    `json:"text,omitempty"`
}

// NewHistory returns an empty history whose time base is now.
func NewHistory() *History {
	return &History{base: time.Now(), counts: map[string]int{}}
}

// Base is the time every interval is measured from.
func (h *History) Base() time.Time { return h.base }

// Begin starts recording op: it stamps the start time. Call Finish when the
// operation returns.
func (h *History) Begin(op *Op) *Op {
	op.Start = time.Now()
	return op
}

// Finish stamps the end, classifies err and appends op to the history.
func (h *History) Finish(op *Op, err error) {
	op.End = time.Now()
	op.Outcome = Classify(err)
	if err != nil {
		op.Err = err.Error()
		var dep *client.DependencyError
		if errors.As(err, &dep) {
			op.RefusedAll = true
			for _, r := range dep.Errors {
				op.Refused = append(op.Refused, Refused{ID: r.Id, Version: r.Version, Category: r.Category.String(), Current: r.CurrentVersion})
			}
		}
	}
	h.Add(op)
}

// Add appends a finished op as it is (for hand-made histories).
func (h *History) Add(op *Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.Index = len(h.ops)
	h.ops = append(h.ops, op)
}

// Ops returns a copy of the list of operations, in the order they finished.
func (h *History) Ops() []*Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*Op(nil), h.ops...)
}

// Count adds n to a named counter (faults, leader changes, snapshot
// installs...).
func (h *History) Count(name string, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[name] += n
}

// Note records an event and counts it under kind.
func (h *History) Note(kind, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notes = append(h.notes, Note{At: time.Now(), Kind: kind, Text: fmt.Sprintf(format, args...)})
	h.counts[kind]++
}

// Counts returns a copy of the counters.
func (h *History) Counts() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int, len(h.counts))
	for k, v := range h.counts {
		out[k] = v
	}
	return out
}

// Notes returns a copy of the events.
func (h *History) Notes() []Note {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Note(nil), h.notes...)
}

// Clone returns a deep enough copy to be edited (forged) without touching h.
func (h *History) Clone() *History {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := &History{base: h.base, counts: map[string]int{}, notes: append([]Note(nil), h.notes...)}
	for k, v := range h.counts {
		c.counts[k] = v
	}
	for _, op := range h.ops {
		cp := *op
		cp.Tasks = append([]TaskVersion(nil), op.Tasks...)
		c.ops = append(c.ops, &cp)
	}
	return c
}

// WriteJSON writes the history (ops sorted by start, then notes and
// counters) as JSON, for a failed run's artifacts.
func (h *History) WriteJSON(w io.Writer) error {
	ops := h.Ops()
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Start.Before(ops[j].Start) })
	return json.NewEncoder(w).Encode(struct {
		Base   time.Time      `json:"base"`
		Ops    []*Op          `json:"ops"`
		Notes  []Note         `json:"notes"`
		Counts map[string]int `json:"counts"`
	}{h.base, ops, h.Notes(), h.Counts()})
}

// Final is the state read from the cluster at the end of a run: every task
// of every queue under the run's prefix, as listed (a task listed twice
// appears twice).
type Final struct {
	Start, End time.Time
	Tasks      []TaskVersion
}

// ByID indexes the final tasks by id (every listing of an id).
func (f *Final) ByID() map[string][]TaskVersion {
	out := map[string][]TaskVersion{}
	if f == nil {
		return out
	}
	for _, t := range f.Tasks {
		out[t.ID] = append(out[t.ID], t)
	}
	return out
}

// Without returns a copy of f without the task id: the "unsafe" tests use
// it to forge a lost write.
func (f *Final) Without(id string) *Final {
	out := &Final{Start: f.Start, End: f.End}
	for _, t := range f.Tasks {
		if t.ID != id {
			out.Tasks = append(out.Tasks, t)
		}
	}
	return out
}

// Cut returns the history that a copy of the state taken between from and
// to (a backup that began at from and ended at to) must agree with:
//   - an op that ended before from, as it is: the copy holds its effect;
//   - an op that began at or after to, dropped: the copy cannot hold it;
//   - every other op (in flight at some point of [from, to)), of unknown
//     outcome: the copy's point may be before or after it took effect. A
//     refusal becomes unknown too, since the state it was judged against
//     may be after the copy's point.
//
// Its notes are those before to; its counters are h's.
func (h *History) Cut(from, to time.Time) *History {
	c := h.Clone()
	kept := c.ops[:0]
	for _, op := range c.ops {
		switch {
		case op.End.Before(from):
		case !op.Start.Before(to):
			continue
		default:
			op.Outcome = Unknown
			op.Err = "in flight while the copy was taken"
			op.Refused, op.RefusedAll = nil, false
		}
		op.Index = len(kept)
		kept = append(kept, op)
	}
	c.ops = kept
	notes := c.notes[:0]
	for _, n := range c.notes {
		if n.At.Before(to) {
			notes = append(notes, n)
		}
	}
	c.notes = notes
	return c
}
