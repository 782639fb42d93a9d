package fsm

import (
	"strings"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// A Modify is evaluated in this order, each operation against the state as
// the earlier operations of the same request left it: depends, deletes,
// changes, inserts. So a delete frees its key for a later insert, and a task
// named twice (which Validate refuses) fails the second time as missing or
// stale. A failed operation has no effect on the ones after it; every
// failure is collected, and if there is any, nothing is applied.

// queueKey names a key within a queue.
type queueKey struct{ queue, key string }

// modifier stages one Modify.
type modifier struct {
	st       *state
	group    string
	claimant string
	now      int64
	staged   map[string]*task // id → staged version; nil: deleted
	order    []string         // ids in the order first staged
	// fresh: inserted ids the leader chose, in no task before this Modify
	// (Insert.id_chosen_by_leader): the commit does not look for an old
	// version of them.
	fresh   map[string]bool
	keys    map[queueKey]string
	touched []string // queues created or touched, pruned afterwards
	errs    []*fsmpb.RefError
}

// lookup returns the task as the request sees it so far.
func (md *modifier) lookup(id string) *task {
	if t, ok := md.staged[id]; ok {
		return t
	}
	// Another group's task is out of reach: missing.
	return md.st.find(md.group, id)
}

// reservedKey returns the reservation of key in queue, unless the request
// already changed who holds the key (a reservation only exists while no
// live task holds its key).
func (md *modifier) reservedKey(queue, key string) *reservation {
	if _, ok := md.keys[queueKey{queue, key}]; ok {
		return nil
	}
	return md.st.reservedKey(queue, key)
}

// keyOwner returns the id holding key in queue as the request sees it.
func (md *modifier) keyOwner(queue, key string) string {
	if id, ok := md.keys[queueKey{queue, key}]; ok {
		return id
	}
	return md.st.store.keyOwner(queue, key)
}

func (md *modifier) stage(id string, t *task) {
	if _, ok := md.staged[id]; !ok {
		md.order = append(md.order, id)
	}
	md.staged[id] = t
}

func (md *modifier) fail(e *fsmpb.RefError) { md.errs = append(md.errs, e) }

// check reports missing and stale references (with the categories given)
// and returns the task if the reference is current.
func (md *modifier) check(id string, version uint64, missing, stale fsmpb.RefError_Category) *task {
	t := md.lookup(id)
	if t == nil {
		md.fail(&fsmpb.RefError{Category: missing, Id: id, Version: version})
		return nil
	}
	if t.version != version {
		md.fail(&fsmpb.RefError{Category: stale, Id: id, Version: version, CurrentVersion: t.version, Queue: t.q.name})
		return nil
	}
	return t
}

// checkClaim reports a task held by another claimant under an unexpired
// lease.
func (md *modifier) checkClaim(t *task, version uint64) bool {
	if t.claimant != "" && t.claimant != md.claimant && t.at > md.now {
		md.fail(&fsmpb.RefError{Category: fsmpb.RefError_CLAIMED, Id: t.id, Version: version,
			Queue: t.q.name, Claimant: t.claimant, LeaseUntil: t.at})
		return false
	}
	return true
}

func (a *applier) modify(m *fsmpb.Modify) *fsmpb.Result {
	st := a.st
	if m.Group == "" {
		return failuref(fsmpb.Failure_INVALID, "modify.group: required")
	}
	// Shape rules the state depends on (Validate checks them and more at
	// the edge; these hold whatever reached the log).
	for i, in := range m.Inserts {
		if in.Id == "" {
			return failuref(fsmpb.Failure_INVALID, "inserts[%d].id: required", i)
		}
		if in.Queue == "" || groupOf(in.Queue) != m.Group {
			return failuref(fsmpb.Failure_INVALID, "inserts[%d].queue: %q is not in group %q", i, in.Queue, m.Group)
		}
	}
	for i, c := range m.Changes {
		if c.Queue != "" && groupOf(c.Queue) != m.Group {
			return failuref(fsmpb.Failure_INVALID, "changes[%d].queue: %q is not in group %q", i, c.Queue, m.Group)
		}
	}
	if m.Claim != nil {
		if f := checkClaimQueues(m.Claim, m.Group, "claim"); f != nil {
			return f
		}
	}

	if len(m.Scope) > 0 {
		if f := outOfScope(st, m); f != nil {
			return f
		}
	}

	md := &modifier{st: st, group: m.Group, claimant: m.Claimant, now: st.clock,
		staged: make(map[string]*task), keys: make(map[queueKey]string)}
	defer func() {
		for _, name := range md.touched {
			st.prune(name)
		}
	}()

	st.store.prefetch(m)
	for _, r := range m.Depends {
		md.check(r.Id, r.Version, fsmpb.RefError_DEPEND_MISSING, fsmpb.RefError_DEPEND_STALE)
	}
	for _, r := range m.Deletes {
		t := md.check(r.Id, r.Version, fsmpb.RefError_DELETE_MISSING, fsmpb.RefError_DELETE_STALE)
		if t == nil || !md.checkClaim(t, r.Version) {
			continue
		}
		if t.key != "" {
			md.keys[queueKey{t.q.name, t.key}] = ""
		}
		md.stage(t.id, nil)
	}
	changed := make([]*task, 0, len(m.Changes))
	for _, c := range m.Changes {
		t := md.check(c.Id, c.Version, fsmpb.RefError_CHANGE_MISSING, fsmpb.RefError_CHANGE_STALE)
		if t == nil || !md.checkClaim(t, c.Version) {
			continue
		}
		nt := *t
		nt.version++
		nt.modified = md.now
		if c.Queue != "" && c.Queue != t.q.name {
			nt.q = st.queueFor(c.Queue)
			md.touched = append(md.touched, c.Queue)
		}
		if c.At != 0 {
			nt.at = c.At
		}
		if !c.KeepClaim {
			if c.At == 0 && isClaimed(t, md.now) {
				nt.at = md.now // ending a claim releases the task now
			}
			nt.claimant = ""
		}
		if c.Value != nil {
			nt.value = c.Value
		}
		if c.Priority != nil {
			nt.priority = *c.Priority
		}
		if c.Attempt != nil {
			nt.attempt = *c.Attempt
		}
		if c.Err != nil {
			nt.err = *c.Err
		}
		if st.format >= FormatHeaders && (len(c.Headers) > 0 || c.ClearHeaders) {
			nt.ext = newTaskExt(t.dedupWindow(), c.Headers)
		}
		if nt.key != "" && nt.q != t.q {
			if owner := md.keyOwner(nt.q.name, nt.key); owner != "" && owner != nt.id {
				md.fail(&fsmpb.RefError{Category: fsmpb.RefError_INSERT_DUPLICATE_KEY, Id: nt.id, Version: c.Version,
					Queue: nt.q.name, Key: nt.key, ExistingId: owner})
				continue
			}
			if r := md.reservedKey(nt.q.name, nt.key); r != nil {
				// Reserved after its task's deletion: taken, as for an insert.
				md.fail(&fsmpb.RefError{Category: fsmpb.RefError_INSERT_DUPLICATE_KEY, Id: nt.id, Version: c.Version,
					Queue: nt.q.name, Key: nt.key, ExistingId: r.last.id})
				continue
			}
			md.keys[queueKey{t.q.name, t.key}] = ""
			md.keys[queueKey{nt.q.name, nt.key}] = nt.id
		}
		md.stage(nt.id, &nt)
		changed = append(changed, &nt)
	}
	inserted := make([]*task, len(m.Inserts))
	var coalesced []uint32
	for i, in := range m.Inserts {
		if in.Key != "" {
			if owner := md.keyOwner(in.Queue, in.Key); owner != "" {
				if in.IfAbsent {
					inserted[i] = md.lookup(owner)
					coalesced = append(coalesced, uint32(i))
					continue
				}
				md.fail(&fsmpb.RefError{Category: fsmpb.RefError_INSERT_DUPLICATE_KEY, Id: in.Id,
					Queue: in.Queue, Key: in.Key, ExistingId: owner})
			} else if r := md.reservedKey(in.Queue, in.Key); r != nil {
				// The key of a task deleted within its dedup window: taken,
				// by the task as it was deleted.
				if in.IfAbsent {
					inserted[i] = r.last
					coalesced = append(coalesced, uint32(i))
					continue
				}
				md.fail(&fsmpb.RefError{Category: fsmpb.RefError_INSERT_DUPLICATE_KEY, Id: in.Id,
					Queue: in.Queue, Key: in.Key, ExistingId: r.last.id})
			}
		}
		// Ids are unique in the group, or across the shard before
		// FormatGroupIDs. One the leader chose (128 random bits) is in no
		// task: looking costs a read per insert of a state on disk.
		if _, ok := md.staged[in.Id]; ok || (!in.IdChosenByLeader && st.idTaken(m.Group, in.Id)) {
			md.fail(&fsmpb.RefError{Category: fsmpb.RefError_INSERT_DUPLICATE_ID, Id: in.Id,
				Queue: in.Queue, Key: in.Key, ExistingId: in.Id})
			continue
		}
		at := in.At
		if at == 0 {
			at = md.now
		}
		nt := &task{id: in.Id, q: st.queueFor(in.Queue), key: in.Key, value: in.Value, err: in.Err,
			version: 1, at: at, created: md.now, modified: md.now, priority: in.Priority, attempt: in.Attempt}
		if st.format >= FormatQueueControls {
			if in.Held && at > md.now {
				nt.claimant = m.Claimant // held by its producer until at
			}
			dedup := max(in.DedupWindow, 0)
			var headers map[string]string
			if st.format >= FormatHeaders {
				headers = in.Headers
			}
			nt.ext = newTaskExt(dedup, headers)
		}
		if st.format >= FormatInsertClaimant && at <= md.now {
			// Who inserted it, until a claim or a change: an available
			// task with a claimant is not claimed (isClaimed wants a
			// future at), so this changes no claim.
			nt.claimant = m.Claimant
		}
		md.touched = append(md.touched, in.Queue)
		if in.Key != "" {
			md.keys[queueKey{in.Queue, in.Key}] = in.Id
		}
		md.stage(in.Id, nt)
		if in.IdChosenByLeader {
			if md.fresh == nil {
				md.fresh = make(map[string]bool, len(m.Inserts))
			}
			md.fresh[in.Id] = true
		}
		inserted[i] = nt
	}
	if len(md.errs) > 0 {
		return &fsmpb.Result{Failure: &fsmpb.Failure{Errors: md.errs, Kind: fsmpb.Failure_REFERENCES}}
	}
	if m.MaxAnswerBytes > 0 {
		// The answer echoes every inserted and changed task, values
		// included (a change that keeps a large value still echoes it): a
		// transaction whose answer could not be sent is refused before it
		// commits.
		var n uint64
		for _, t := range inserted {
			n += taskAnswerBytes(st.format, t, t.claimant)
		}
		for _, t := range changed {
			n += taskAnswerBytes(st.format, t, t.claimant)
		}
		if n > m.MaxAnswerBytes {
			return failuref(fsmpb.Failure_ANSWER_TOO_LARGE, "%s: the inserted and changed tasks take about %d bytes, over the limit of %d; split the transaction", AnswerTooLarge, n, m.MaxAnswerBytes)
		}
	}

	// The versions the commit replaces (nil: an insert).
	olds := make([]*task, len(md.order))
	for i, id := range md.order {
		if !md.fresh[id] {
			olds[i] = st.find(m.Group, id)
		}
	}
	if a.budget.GetBytes() > 0 {
		var tasks, bytes int64
		for i, id := range md.order {
			if t := md.staged[id]; t != nil {
				tasks, bytes = tasks+1, bytes+taskSize(t)
			}
			if old := olds[i]; old != nil {
				tasks, bytes = tasks-1, bytes-taskSize(old)
			}
		}
		if f := st.overBudget(a.budget, tasks, bytes); f != nil {
			return f
		}
	}

	// Commit: take every original version out, then put every final one
	// in, so that keys moving between tasks never collide midway.
	var deleted []*task
	for i, id := range md.order {
		if old := olds[i]; old != nil {
			if md.staged[id] == nil {
				deleted = append(deleted, old)
			}
			if isClaimed(old, st.clock) && st.limits[old.q.name] > 0 {
				// A claim of a limited queue ends: room for a waiting
				// claim.
				a.n.add(old.q.name)
			}
			st.remove(old)
			md.touched = append(md.touched, old.q.name)
		}
	}
	for _, id := range md.order {
		if t := md.staged[id]; t != nil {
			st.add(t)
			a.n.add(t.q.name)
		}
	}
	for _, t := range deleted {
		st.reserve(t)
	}
	res := &fsmpb.ModifyResult{Coalesced: coalesced}
	if len(inserted) > 0 {
		res.Inserted = make([]*fsmpb.Task, len(inserted))
		for i, t := range inserted {
			res.Inserted[i] = t.toProto(false)
		}
	}
	if len(changed) > 0 {
		res.Changed = make([]*fsmpb.Task, len(changed))
		for i, t := range changed {
			res.Changed[i] = t.toProto(false)
		}
	}
	if m.Claim != nil {
		// After the commit, against the state it left: a task the
		// transaction released or moved into a claimed queue is claimable
		// at once, as by a Claim in the next entry.
		var used uint64
		if m.Claim.MaxBytes > 0 {
			for _, t := range res.Inserted {
				used += answerBytesAt(st.format, t)
			}
			for _, t := range res.Changed {
				used += answerBytesAt(st.format, t)
			}
		}
		res.Claim = a.take(m.Claim, used)
	}
	return &fsmpb.Result{Modify: res}
}

// OutOfScope starts the message of an OUT_OF_SCOPE failure: a Modify refused because it
// names a task outside the caller's queue prefixes (Modify.scope).
const OutOfScope = "out of scope"

// outOfScope refuses a Modify that names, by id, a task of its group whose
// queue is outside m.Scope. A caller limited to "demo/" may route a request
// by "demo/x" and still name a task in "demo" or "demo-secret/..." of the
// same group: the task's own queue decides, as the state holds it when the
// entry applies. Missing tasks are left to the ordinary checks (they fail
// as missing).
func outOfScope(st *state, m *fsmpb.Modify) *fsmpb.Result {
	check := func(id string) *fsmpb.Result {
		t := st.find(m.Group, id)
		if t == nil || InScope(t.q.name, m.Scope) {
			return nil
		}
		return failuref(fsmpb.Failure_OUT_OF_SCOPE, "%s: task %q is not in a queue under %s", OutOfScope, id, strings.Join(m.Scope, ", "))
	}
	for _, r := range m.Depends {
		if f := check(r.Id); f != nil {
			return f
		}
	}
	for _, r := range m.Deletes {
		if f := check(r.Id); f != nil {
			return f
		}
	}
	for _, c := range m.Changes {
		if f := check(c.Id); f != nil {
			return f
		}
	}
	return nil
}

// InScope reports whether queue starts with one of prefixes.
func InScope(queue string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(queue, p) {
			return true
		}
	}
	return false
}
