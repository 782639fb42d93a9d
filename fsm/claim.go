package fsm

import (
	"slices"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

func (a *applier) claim(c *fsmpb.Claim) *fsmpb.Result {
	if len(c.Queues) == 0 {
		return failuref(fsmpb.Failure_INVALID, "claim.queues: required")
	}
	if f := checkClaimQueues(c, groupOf(c.Queues[0]), "claim"); f != nil {
		return f
	}
	return &fsmpb.Result{Claim: a.take(c, 0)}
}

// checkClaimQueues refuses a claim whose queues are not all (non-empty and)
// in group; path names the claim in the message.
func checkClaimQueues(c *fsmpb.Claim, group, path string) *fsmpb.Result {
	for i, name := range c.Queues {
		if name == "" || groupOf(name) != group {
			return failuref(fsmpb.Failure_INVALID, "%s.queues[%d]: %q is not in group %q", path, i, name, group)
		}
	}
	return nil
}

// take claims up to c.Limit available tasks of c's queues (checked by
// checkClaimQueues), best first across them. A Claim and the claim part of
// a Modify both claim here, so they cannot drift apart.
//
// used is what the rest of the answer already carries (the inserted and
// changed tasks of a Modify), in AnswerBytes; with c.MaxBytes the claimed
// tasks get what is left of it.
func (a *applier) take(c *fsmpb.Claim, used uint64) *fsmpb.ClaimResult {
	st := a.st
	queues := make([]*queue, 0, len(c.Queues))
	for _, name := range c.Queues {
		if q := st.store.queue(name); q != nil && !st.isPaused(name) && !slices.Contains(queues, q) {
			queues = append(queues, q)
		}
	}
	limit := int(c.Limit)
	var picked []*task
	for _, q := range queues {
		if n := min(limit, st.capacity(q), st.tokens(q.name, st.clock)); n > 0 {
			picked = a.availableUnder(q, n, picked)
		}
	}
	if len(queues) > 1 {
		slices.SortFunc(picked, func(a, b *task) int {
			if claimLess(a, b) {
				return -1
			}
			return 1 // ids are unique: never equal
		})
		picked = picked[:min(len(picked), limit)]
	}
	if c.MaxBytes > 0 {
		// Claim no more than the answer can carry: the tasks after the
		// budget stay available (a claim may take fewer than its limit).
		budget := c.MaxBytes - min(c.MaxBytes, used)
		var n uint64
		for i, t := range picked {
			if n += taskAnswerBytes(a.st.format, t, c.Claimant); n > budget {
				picked = picked[:i]
				break
			}
		}
	}
	res := &fsmpb.ClaimResult{}
	if len(picked) > 0 {
		res.Tasks = make([]*fsmpb.Task, len(picked))
	}
	lease := addSat(st.clock, c.Lease)
	for i, t := range picked {
		if t.claimant != "" && (st.format < FormatInsertClaimant || t.claims > 0) {
			res.ExpiredLeases++ // (a claimant of a task never claimed is who inserted or held it)
		}
		nt := *t
		nt.claimant = c.Claimant
		nt.at = lease
		nt.claims++
		nt.version++
		nt.modified = st.clock
		st.replace(t, &nt)
		res.Tasks[i] = nt.toProto(false)
	}
	for _, q := range queues {
		if st.ratePolicy(q.name) == nil {
			continue
		}
		n := 0
		for _, t := range res.Tasks {
			if t.Queue == q.name {
				n++
			}
		}
		st.spend(q.name, n) // (rule 27)
	}
	return res
}

// availableUnder appends up to n available tasks of q to out, as
// store.available does, after moving those over their queue's delivery
// limit to its dead-letter queue (rule 25): each moves once, so the loop
// ends.
func (a *applier) availableUnder(q *queue, n int, out []*task) []*task {
	st := a.st
	for {
		from := len(out)
		out = st.store.available(q, st.clock, n, out)
		got := len(out) - from
		kept, moved := out[:from], 0
		for _, t := range out[from:] {
			if p, over := st.overClaimed(t); over {
				a.deadLetter(t, p)
				moved++
				continue
			}
			kept = append(kept, t)
		}
		if moved == 0 || got < n {
			return kept
		}
		// Some moved away and the queue may hold more: ask again (the
		// kept ones come first again).
		out = kept[:from]
	}
}

// pause pauses or resumes a queue. Resuming tells waiting claims to look
// again (OnAvailable); the queue's tasks never stopped being available.
func (a *applier) pause(p *fsmpb.Pause) *fsmpb.Result {
	was := a.st.isPaused(p.Queue)
	switch {
	case p.Paused:
		a.st.paused[p.Queue] = struct{}{}
	case was:
		delete(a.st.paused, p.Queue)
		a.n.add(p.Queue)
	}
	return &fsmpb.Result{Pause: &fsmpb.PauseResult{WasPaused: was}}
}

// limit sets or clears a queue's concurrency limit. A raised or removed
// limit may let waiting claims take tasks: they look again.
func (a *applier) limit(l *fsmpb.QueueLimit) *fsmpb.Result {
	prev := a.st.limits[l.Queue]
	if l.MaxClaimed == 0 {
		delete(a.st.limits, l.Queue)
	} else {
		a.st.limits[l.Queue] = l.MaxClaimed
	}
	if prev != 0 && (l.MaxClaimed == 0 || l.MaxClaimed > prev) {
		a.n.add(l.Queue)
	}
	return &fsmpb.Result{Limit: &fsmpb.LimitResult{Previous: prev}}
}

func (a *applier) purge(p *fsmpb.Purge) *fsmpb.Result {
	st := a.st
	q := st.store.queue(p.Queue)
	if q == nil {
		return &fsmpb.Result{Purge: &fsmpb.PurgeResult{}}
	}
	n, size, keyed := st.store.purge(q, st.clock)
	st.taskBytes -= size
	for _, t := range keyed {
		st.reserve(t)
	}
	return &fsmpb.Result{Purge: &fsmpb.PurgeResult{Deleted: uint64(n)}}
}

// AnswerTooLarge starts the message of an ANSWER_TOO_LARGE failure: a transaction refused
// because its answer would exceed Modify.max_answer_bytes.
const AnswerTooLarge = "answer too large"

// answerOverheadBytes bounds what one task of an answer costs beyond its
// strings and value: the numbers, three timestamps, field tags and lengths,
// and the repeated field's framing (taskstore.v1.Task: about 120 bytes at
// most).
const answerOverheadBytes = 160

// AnswerBytes is the most one task can add to an answer that carries it
// (a taskstore.v1.Task in a repeated field). It bounds claims by bytes
// (Claim.max_bytes), so it is part of what replicas compute: changing it
// changes how later log entries apply.
// It counts the task's headers; the state machine counts them only from
// FormatInsertClaimant on (answerBytesAt), as binaries before it did not.
func AnswerBytes(t *fsmpb.Task) uint64 {
	return answerBytesAt(MaxFormat, t)
}

// answerBytesAt is AnswerBytes by the rules of state format f.
func answerBytesAt(f uint32, t *fsmpb.Task) uint64 {
	n := uint64(len(t.Id)+len(t.Queue)+len(t.Claimant)+len(t.Key)+len(t.Value)+len(t.Err)) + answerOverheadBytes
	if f >= FormatInsertClaimant {
		n += headerAnswerBytes(t.Headers)
	}
	return n
}

// headerEntryOverheadBytes bounds one header's framing in an answer: the
// map entry's tag and length, its key's and value's tags and lengths.
const headerEntryOverheadBytes = 10

// headerAnswerBytes is what headers add to a task in an answer.
func headerAnswerBytes(h map[string]string) uint64 {
	var n uint64
	for k, v := range h {
		n += uint64(len(k)+len(v)) + headerEntryOverheadBytes
	}
	return n
}

// taskAnswerBytes is answerBytesAt(f) of t held by claimant.
func taskAnswerBytes(f uint32, t *task, claimant string) uint64 {
	n := uint64(len(t.id)+len(t.q.name)+len(claimant)+len(t.key)+len(t.value)+len(t.err)) + answerOverheadBytes
	if f >= FormatInsertClaimant {
		n += headerAnswerBytes(t.headers())
	}
	return n
}

// ClaimFindsNothing reports whether the claim cmd (an OP_CLAIM), stamped
// with time now, would certainly claim nothing and change nothing worth a
// log entry, so that the leader may answer it empty without proposing it.
// It answers false (propose) whenever in doubt:
//
//   - the claim's session knows its request (a retry: the recorded answer,
//     or a stale-sequence refusal, comes from the log, never a fresh empty
//     one);
//   - the claim would be refused (no queues, queues of several groups, a
//     group whose slot this shard does not serve);
//   - a queue has a task whose at is <= max(now, clock) (due, or a lease
//     that ran out), unless the queue is paused, or at its concurrency
//     limit with no lease of the machine ending by then (a lease ending
//     frees room: the machine's earliest pending at decides), or its
//     rate's bucket holds no token at max(now, clock) (it holds none
//     earlier either).
//
// What an empty claim's entry did besides answering is housekeeping that
// the next entry does as well (the clock, expired sessions and
// reservations), or the renewal of its session's idle time, which only
// matters for a request the session remembers: the first case above.
//
// The caller makes the read linearizable first (the leader, confirmed by
// a quorum) and passes a now no earlier than what it would stamp.
func (m *Machine) ClaimFindsNothing(cmd *fsmpb.Command, now int64) bool {
	c := cmd.GetClaim()
	if cmd.GetOp() != fsmpb.Op_OP_CLAIM || c == nil || len(c.Queues) == 0 || c.Limit == 0 {
		return false
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	st := m.st
	group := groupOf(c.Queues[0])
	if checkClaimQueues(c, group, "claim") != nil || st.unserved(group) != nil {
		return false
	}
	clock := max(now, st.clock)
	due, anyDue := st.store.nextDue()
	leaseEnds := anyDue && due.at <= clock
	for _, name := range c.Queues {
		q := st.store.queue(name)
		if q == nil || st.isPaused(name) {
			continue
		}
		if st.capacity(q) == 0 && !leaseEnds {
			continue
		}
		if st.tokens(name, clock) == 0 {
			continue // its rate's bucket is empty until after now
		}
		if len(st.store.available(q, clock, 1, nil)) > 0 {
			return false
		}
	}
	// Last: a claim that may take a task (the busy case) is decided
	// without reading its session.
	if cmd.ClientId != "" {
		if s := st.store.session(cmd.ClientId); s != nil && cmd.Seq <= s.seq {
			return false
		}
	}
	return true
}
