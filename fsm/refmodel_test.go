package fsm

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// refModel is the specification of the machine, written as plainly as
// possible: a map of task messages, linear scans, no indexes. The property
// test checks the Machine against it.
type refModel struct {
	clock       int64
	format      uint32
	tasks       map[string]*fsmpb.Task // by refKey(group, id)
	paused      map[string]bool
	limits      map[string]uint32
	policies    map[string]*fsmpb.QueuePolicy
	reserved    map[[2]string]refReservation // queue, key
	reservedHit int                          // inserts that met a reservation
	deadLetters int                          // tasks moved over a delivery limit
	expired     int                          // tasks deleted by retention
	schedules   map[string]*fsmpb.Schedule   // by group, "\x00", name
	sessions    map[string]*refSession
	maxSessions int
	ttl         int64
}

type refSession struct {
	seq      uint64
	lastSeen int64
	result   *fsmpb.Result
}

func newRefModel(maxSessions int, ttl int64) *refModel {
	return &refModel{tasks: map[string]*fsmpb.Task{}, sessions: map[string]*refSession{}, paused: map[string]bool{}, limits: map[string]uint32{}, policies: map[string]*fsmpb.QueuePolicy{}, reserved: map[[2]string]refReservation{}, schedules: map[string]*fsmpb.Schedule{}, maxSessions: maxSessions, ttl: ttl}
}

func (r *refModel) apply(cmd *fsmpb.Command) *fsmpb.Result {
	if cmd.Now > r.clock {
		r.clock = cmd.Now
	}
	for k, res := range r.reserved {
		if res.until <= r.clock {
			delete(r.reserved, k)
		}
	}
	for id, s := range r.sessions {
		if s.lastSeen+r.ttl < r.clock {
			delete(r.sessions, id)
		}
	}
	if cmd.ClientId != "" {
		if s := r.sessions[cmd.ClientId]; s != nil {
			s.lastSeen = r.clock
			if cmd.Seq == s.seq {
				r := proto.Clone(s.result).(*fsmpb.Result)
				r.Replayed = true
				return r
			}
			if cmd.Seq < s.seq {
				return &fsmpb.Result{Failure: &fsmpb.Failure{Kind: fsmpb.Failure_STALE_SEQUENCE, Message: "stale request sequence"}}
			}
		}
	}
	var res *fsmpb.Result
	switch cmd.Op {
	case fsmpb.Op_OP_MODIFY, fsmpb.Op_OP_MODIFY_CLAIM:
		res = r.modify(cmd.Modify)
	case fsmpb.Op_OP_CLAIM:
		res = r.claim(cmd.Claim)
	case fsmpb.Op_OP_PURGE:
		res = r.purge(cmd.Purge.Queue)
	case fsmpb.Op_OP_TICK:
		res = &fsmpb.Result{}
	case fsmpb.Op_OP_SET_FORMAT:
		r.format = max(r.format, cmd.Format)
		res = &fsmpb.Result{}
	case fsmpb.Op_OP_LIMIT:
		res = &fsmpb.Result{Limit: &fsmpb.LimitResult{Previous: r.limits[cmd.Limit.Queue]}}
		if cmd.Limit.MaxClaimed == 0 {
			delete(r.limits, cmd.Limit.Queue)
		} else {
			r.limits[cmd.Limit.Queue] = cmd.Limit.MaxClaimed
		}
	case fsmpb.Op_OP_POLICY:
		res = r.policy(cmd.Policy)
	case fsmpb.Op_OP_EXPIRE:
		res = r.expire(cmd.Expire)
	case fsmpb.Op_OP_PAUSE:
		res = &fsmpb.Result{Pause: &fsmpb.PauseResult{WasPaused: r.paused[cmd.Pause.Queue]}}
		if cmd.Pause.Paused {
			r.paused[cmd.Pause.Queue] = true
		} else {
			delete(r.paused, cmd.Pause.Queue)
		}
	case fsmpb.Op_OP_SCHEDULE:
		res = r.schedule(cmd.Schedule)
	case fsmpb.Op_OP_FIRE:
		res = r.fire(cmd.Fire)
	case fsmpb.Op_OP_BATCH:
		res = &fsmpb.Result{Batch: []*fsmpb.Result{}}
		for _, sub := range cmd.Batch {
			res.Batch = append(res.Batch, r.apply(sub))
		}
	}
	if cmd.ClientId != "" && !(res.Claim != nil && len(res.Claim.Tasks) == 0) {
		stored := res
		if res.Failure != nil && r.format < FormatFailureKinds {
			// Stored as a binary without kinds stores it; answered with one.
			stored = proto.Clone(res).(*fsmpb.Result)
			stored.Failure.Kind = fsmpb.Failure_KIND_UNSPECIFIED
		}
		r.sessions[cmd.ClientId] = &refSession{seq: cmd.Seq, lastSeen: r.clock, result: stored}
		for len(r.sessions) > r.maxSessions {
			oldest := ""
			for id, s := range r.sessions {
				o := r.sessions[oldest]
				if oldest == "" || s.lastSeen < o.lastSeen || s.lastSeen == o.lastSeen && id < oldest {
					oldest = id
				}
			}
			delete(r.sessions, oldest)
		}
	}
	return res
}

// schedule puts or removes a schedule: one name per group, replaced or
// removed only through its own queue; a put keeps the fired count and the
// last tick.
func (r *refModel) schedule(s *fsmpb.Schedule) *fsmpb.Result {
	k := refGroup(s.Queue) + "\x00" + s.Name
	old := r.schedules[k]
	if old != nil && old.Queue != s.Queue {
		return &fsmpb.Result{Failure: &fsmpb.Failure{Kind: fsmpb.Failure_SCHEDULE_ELSEWHERE, Message: fmt.Sprintf("%s: schedule %q belongs to queue %q; name that queue (or remove it first)", ScheduleElsewhere, s.Name, old.Queue)}}
	}
	if s.Remove {
		delete(r.schedules, k)
	} else {
		ns := proto.Clone(s).(*fsmpb.Schedule)
		ns.Fired, ns.Last = old.GetFired(), old.GetLast()
		r.schedules[k] = ns
	}
	return &fsmpb.Result{Schedule: &fsmpb.ScheduleResult{Existed: old != nil}}
}

// fire applies the tick the schedule waits for, once: the next tick moves
// on, and with insert the task NAME@TICK is inserted unless its id is taken.
func (r *refModel) fire(f *fsmpb.Fire) *fsmpb.Result {
	k := refGroup(f.Queue) + "\x00" + f.Name
	s := r.schedules[k]
	if s == nil || s.Next != f.Tick || f.Next <= f.Tick {
		return &fsmpb.Result{}
	}
	ns := proto.Clone(s).(*fsmpb.Schedule)
	ns.Last, ns.Next = f.Tick, f.Next
	r.schedules[k] = ns
	if !f.Insert {
		return &fsmpb.Result{}
	}
	ns.Fired++
	res := r.modify(&fsmpb.Modify{Group: refGroup(s.Queue), Inserts: []*fsmpb.Insert{{
		Id: ScheduleTaskID(s.Name, f.Tick), Queue: s.Queue, Value: s.Value, Priority: s.Priority}}})
	if res.Failure != nil {
		return &fsmpb.Result{}
	}
	return res
}

// refReservation keeps a deleted task's key taken until until.
type refReservation struct {
	last  *fsmpb.Task
	until int64
}

// reserve keeps t's key taken for its dedup window, unless a task holds it.
func (r *refModel) reserve(t *fsmpb.Task) {
	if t.Key == "" || t.DedupWindow <= 0 {
		return
	}
	for _, o := range r.tasks {
		if o.Queue == t.Queue && o.Key == t.Key {
			return
		}
	}
	r.reserved[[2]string{t.Queue, t.Key}] = refReservation{last: t, until: r.clock + t.DedupWindow}
}

func refGroup(queue string) string { g, _, _ := strings.Cut(queue, "/"); return g }

// refKey names a task in the model: ids are unique per group from
// FormatGroupIDs on, and per shard before (which the insert rule enforces).
func refKey(group, id string) string { return group + "\x00" + id }

// holdsID reports whether any group holds a task with id.
func (r *refModel) holdsID(id string) bool {
	for _, t := range r.tasks {
		if t.Id == id {
			return true
		}
	}
	return false
}

func (r *refModel) modify(m *fsmpb.Modify) *fsmpb.Result {
	if m.Claim != nil {
		for i, q := range m.Claim.Queues {
			if refGroup(q) != m.Group {
				return &fsmpb.Result{Failure: &fsmpb.Failure{Kind: fsmpb.Failure_INVALID, Message: fmt.Sprintf("claim.queues[%d]: %q is not in group %q", i, q, m.Group)}}
			}
		}
	}
	work := make(map[string]*fsmpb.Task, len(r.tasks))
	for k, t := range r.tasks {
		work[k] = t
	}
	key := func(id string) string { return refKey(m.Group, id) }
	touched := map[string]bool{}
	var errs []*fsmpb.RefError
	lookup := func(id string) *fsmpb.Task { return work[key(id)] }
	// insertedKey is the last insert of this request to name each key. A
	// refused insert (its key taken) is still staged, so two staged tasks
	// may share a key; like the machine, the later insert is the owner.
	insertedKey := map[[2]string]string{}
	keyOwner := func(queue, key string) string {
		if id, ok := insertedKey[[2]string{queue, key}]; ok {
			return id
		}
		for _, t := range work {
			if t.Queue == queue && t.Key == key {
				return t.Id
			}
		}
		return ""
	}
	check := func(id string, v uint64, missing, stale fsmpb.RefError_Category) *fsmpb.Task {
		t := lookup(id)
		if t == nil {
			errs = append(errs, &fsmpb.RefError{Category: missing, Id: id, Version: v})
			return nil
		}
		if t.Version != v {
			errs = append(errs, &fsmpb.RefError{Category: stale, Id: id, Version: v, CurrentVersion: t.Version, Queue: t.Queue})
			return nil
		}
		return t
	}
	claimedByOther := func(t *fsmpb.Task, v uint64) bool {
		if t.Claimant != "" && t.Claimant != m.Claimant && t.At > r.clock {
			errs = append(errs, &fsmpb.RefError{Category: fsmpb.RefError_CLAIMED, Id: t.Id, Version: v, Queue: t.Queue,
				Claimant: t.Claimant, LeaseUntil: t.At})
			return true
		}
		return false
	}
	for _, d := range m.Depends {
		check(d.Id, d.Version, fsmpb.RefError_DEPEND_MISSING, fsmpb.RefError_DEPEND_STALE)
	}
	// keyed: the (queue, key) pairs whose holder this request changes; a
	// reservation does not apply to them.
	keyed := map[[2]string]bool{}
	var deleted []*fsmpb.Task
	for _, d := range m.Deletes {
		if t := check(d.Id, d.Version, fsmpb.RefError_DELETE_MISSING, fsmpb.RefError_DELETE_STALE); t != nil && !claimedByOther(t, d.Version) {
			delete(work, key(d.Id))
			touched[d.Id] = true
			deleted = append(deleted, t)
			if t.Key != "" {
				keyed[[2]string{t.Queue, t.Key}] = true
			}
		}
	}
	var changed []*fsmpb.Task
	for _, c := range m.Changes {
		t := check(c.Id, c.Version, fsmpb.RefError_CHANGE_MISSING, fsmpb.RefError_CHANGE_STALE)
		if t == nil || claimedByOther(t, c.Version) {
			continue
		}
		nt := proto.Clone(t).(*fsmpb.Task)
		nt.Version++
		nt.Modified = r.clock
		if c.Queue != "" {
			nt.Queue = c.Queue
		}
		if c.At != 0 {
			nt.At = c.At
		}
		if !c.KeepClaim {
			if c.At == 0 && t.Claimant != "" && t.At > r.clock {
				nt.At = r.clock
			}
			nt.Claimant = ""
		}
		if c.Value != nil {
			nt.Value = c.Value
		}
		if c.Priority != nil {
			nt.Priority = *c.Priority
		}
		if c.Attempt != nil {
			nt.Attempt = *c.Attempt
		}
		if c.Err != nil {
			nt.Err = *c.Err
		}
		if nt.Key != "" && nt.Queue != t.Queue {
			if owner := keyOwner(nt.Queue, nt.Key); owner != "" {
				errs = append(errs, &fsmpb.RefError{Category: fsmpb.RefError_INSERT_DUPLICATE_KEY, Id: nt.Id, Version: c.Version,
					Queue: nt.Queue, Key: nt.Key, ExistingId: owner})
				continue
			}
			nk := [2]string{nt.Queue, nt.Key}
			if res, ok := r.reserved[nk]; ok && !keyed[nk] && !inKeyed(insertedKey, nt.Queue, nt.Key) {
				r.reservedHit++
				errs = append(errs, &fsmpb.RefError{Category: fsmpb.RefError_INSERT_DUPLICATE_KEY, Id: nt.Id, Version: c.Version,
					Queue: nt.Queue, Key: nt.Key, ExistingId: res.last.Id})
				continue
			}
			keyed[[2]string{t.Queue, t.Key}] = true
			keyed[nk] = true
		}
		work[key(nt.Id)] = nt
		touched[nt.Id] = true
		changed = append(changed, nt)
	}
	var inserted []*fsmpb.Task
	var coalesced []uint32
	for i, in := range m.Inserts {
		if in.Key != "" {
			if owner := keyOwner(in.Queue, in.Key); owner != "" {
				if in.IfAbsent {
					inserted = append(inserted, work[key(owner)])
					coalesced = append(coalesced, uint32(i))
					continue
				}
				errs = append(errs, &fsmpb.RefError{Category: fsmpb.RefError_INSERT_DUPLICATE_KEY, Id: in.Id, Queue: in.Queue,
					Key: in.Key, ExistingId: owner})
			} else if res, ok := r.reserved[[2]string{in.Queue, in.Key}]; ok && !keyed[[2]string{in.Queue, in.Key}] && !inKeyed(insertedKey, in.Queue, in.Key) {
				r.reservedHit++
				if in.IfAbsent {
					inserted = append(inserted, res.last)
					coalesced = append(coalesced, uint32(i))
					continue
				}
				errs = append(errs, &fsmpb.RefError{Category: fsmpb.RefError_INSERT_DUPLICATE_KEY, Id: in.Id, Queue: in.Queue,
					Key: in.Key, ExistingId: res.last.Id})
			}
		}
		taken := r.tasks[key(in.Id)] != nil || r.format < FormatGroupIDs && r.holdsID(in.Id)
		if taken || touched[in.Id] {
			errs = append(errs, &fsmpb.RefError{Category: fsmpb.RefError_INSERT_DUPLICATE_ID, Id: in.Id, Queue: in.Queue,
				Key: in.Key, ExistingId: in.Id})
			inserted = append(inserted, nil)
			continue
		}
		at := in.At
		if at == 0 {
			at = r.clock
		}
		nt := &fsmpb.Task{Id: in.Id, Version: 1, Queue: in.Queue, At: at, Priority: in.Priority, Key: in.Key, Value: in.Value,
			Created: r.clock, Modified: r.clock, Attempt: in.Attempt, Err: in.Err}
		if r.format >= FormatQueueControls {
			if in.Held && at > r.clock {
				nt.Claimant = m.Claimant
			}
			nt.DedupWindow = max(in.DedupWindow, 0)
		}
		if r.format >= FormatInsertClaimant && at <= r.clock {
			nt.Claimant = m.Claimant // who inserted it
		}
		work[key(nt.Id)] = nt
		touched[nt.Id] = true
		if nt.Key != "" {
			insertedKey[[2]string{nt.Queue, nt.Key}] = nt.Id
		}
		inserted = append(inserted, nt)
	}
	if len(errs) > 0 {
		return &fsmpb.Result{Failure: &fsmpb.Failure{Kind: fsmpb.Failure_REFERENCES, Errors: errs}}
	}
	r.tasks = work
	for _, t := range deleted {
		r.reserve(t)
	}
	res := &fsmpb.ModifyResult{Inserted: inserted, Changed: changed, Coalesced: coalesced}
	if m.Claim != nil {
		// The claim sees the committed transaction, like a Claim right after.
		res.Claim = r.claim(m.Claim).Claim
	}
	return &fsmpb.Result{Modify: res}
}

func refClaimLess(a, b *fsmpb.Task) int {
	switch {
	case a.Priority != b.Priority:
		if a.Priority > b.Priority {
			return -1
		}
		return 1
	case a.At != b.At:
		if a.At < b.At {
			return -1
		}
		return 1
	}
	return strings.Compare(a.Id, b.Id)
}

// policy sets or clears a queue's policy (from FormatPolicies): a delivery
// limit needs a dead-letter queue of its group, not itself.
func (r *refModel) policy(p *fsmpb.QueuePolicy) *fsmpb.Result {
	if r.format < FormatPolicies {
		return &fsmpb.Result{Failure: &fsmpb.Failure{Kind: fsmpb.Failure_INVALID,
			Message: fmt.Sprintf("queue policies need state format %d; the shard is at %d", FormatPolicies, r.format)}}
	}
	if f := checkPolicy(p); f != nil { // the messages are the machine's
		return f
	}
	if p.Retain != 0 && r.format < FormatRetention {
		return &fsmpb.Result{Failure: &fsmpb.Failure{Kind: fsmpb.Failure_INVALID,
			Message: fmt.Sprintf("policy.retain needs state format %d; the shard is at %d", FormatRetention, r.format)}}
	}
	if p.RateInterval != 0 && r.format < FormatRate {
		return &fsmpb.Result{Failure: &fsmpb.Failure{Kind: fsmpb.Failure_INVALID,
			Message: fmt.Sprintf("policy.rate needs state format %d; the shard is at %d", FormatRate, r.format)}}
	}
	prev := r.policies[p.Queue]
	if p.MaxClaims == 0 && p.Retain == 0 && p.RateInterval == 0 {
		delete(r.policies, p.Queue)
	} else {
		np := &fsmpb.QueuePolicy{Queue: p.Queue, MaxClaims: p.MaxClaims, DeadLetter: p.DeadLetter, Retain: p.Retain,
			RateInterval: p.RateInterval, Burst: p.Burst}
		// A new rate keeps the old bucket's debt (the command's
		// bucket_full_at is ignored), at most a full new burst of it.
		if p.RateInterval > 0 && prev != nil && prev.RateInterval > 0 && prev.BucketFullAt > r.clock {
			np.BucketFullAt = min(prev.BucketFullAt, r.clock+int64(p.Burst)*p.RateInterval)
		}
		r.policies[p.Queue] = np
	}
	return &fsmpb.Result{Policy: &fsmpb.PolicyResult{Previous: prev}}
}

// expire is one retention step: the queue's tasks in claim order from the
// cursor, at most visit of them; those created retain ago or more and not
// under an unexpired lease are deleted.
func (r *refModel) expire(e *fsmpb.Expire) *fsmpb.Result {
	res := &fsmpb.ExpireResult{Done: true}
	p := r.policies[e.Queue]
	if r.format < FormatRetention || p == nil || p.Retain == 0 {
		return &fsmpb.Result{Expire: res}
	}
	pivot := &fsmpb.Task{Priority: e.Priority, At: e.At, Id: e.Id}
	var walk []*fsmpb.Task
	for _, t := range r.tasks {
		if t.Queue == e.Queue && (e.Id == "" || refClaimLess(t, pivot) >= 0) {
			walk = append(walk, t)
		}
	}
	slices.SortFunc(walk, refClaimLess)
	visit := int(min(max(e.Visit, 1), MaxExpireVisit))
	if len(walk) > visit {
		next := walk[visit]
		res.Priority, res.At, res.Id, res.Done = next.Priority, next.At, next.Id, false
		walk = walk[:visit]
	}
	for _, t := range walk {
		if t.Created+p.Retain <= r.clock && !(t.Claimant != "" && t.At > r.clock) {
			delete(r.tasks, refKey(refGroup(t.Queue), t.Id))
			res.Deleted++
			r.expired++
		}
	}
	for _, t := range walk {
		if t.Created+p.Retain <= r.clock && !(t.Claimant != "" && t.At > r.clock) {
			r.reserve(t)
		}
	}
	return &fsmpb.Result{Expire: res}
}

// overClaimed: the task was claimed at least its queue's max_claims times
// and its last lease ran out (it still names its claimant).
func (r *refModel) overClaimed(t *fsmpb.Task) *fsmpb.QueuePolicy {
	p := r.policies[t.Queue]
	if r.format < FormatPolicies || p == nil || p.MaxClaims == 0 || t.Claims < p.MaxClaims || t.Claimant == "" {
		return nil
	}
	return p
}

// deadLetter moves t to p's dead-letter queue.
func (r *refModel) deadLetter(t *fsmpb.Task, p *fsmpb.QueuePolicy) {
	nt := proto.Clone(t).(*fsmpb.Task)
	nt.Queue, nt.At, nt.Version, nt.Modified, nt.Claims = p.DeadLetter, r.clock, t.Version+1, r.clock, 0
	if nt.Err == "" {
		nt.Err = fmt.Sprintf("claimed %d times without a commit (delivery limit of %s)", t.Claims, t.Queue)
	}
	if nt.Headers == nil {
		nt.Headers = map[string]string{}
	}
	nt.Headers[HeaderDeadLetterFrom] = t.Queue
	nt.Headers[HeaderDeadLetterClaims] = fmt.Sprint(t.Claims)
	for _, o := range r.tasks {
		if t.Key != "" && o.Queue == p.DeadLetter && o.Key == t.Key {
			nt.Headers[HeaderDeadLetterKey] = t.Key
			nt.Key = ""
		}
	}
	r.tasks[refKey(refGroup(nt.Queue), nt.Id)] = nt
	r.deadLetters++
}

func (r *refModel) claim(c *fsmpb.Claim) *fsmpb.Result {
	// Queue by queue, as named (once each, those that hold tasks and are
	// not paused when the claim starts): up to the claim's limit (and the
	// queue's room) of its available tasks in claim order, after moving
	// those over the delivery limit that come first to the dead-letter
	// queue.
	var queues []string
	for _, q := range c.Queues {
		holds := false
		for _, t := range r.tasks {
			holds = holds || t.Queue == q
		}
		if !slices.Contains(queues, q) && !r.paused[q] && holds {
			queues = append(queues, q)
		}
	}
	var cands []*fsmpb.Task
	for _, q := range queues {
		n := int(c.Limit)
		if l := r.limits[q]; l > 0 {
			n = min(n, int(l)-r.claimedIn(q))
		}
		n = min(n, r.tokens(q))
		var avail []*fsmpb.Task
		for _, t := range r.tasks {
			if t.Queue == q && t.At <= r.clock {
				avail = append(avail, t)
			}
		}
		slices.SortFunc(avail, refClaimLess)
		kept := 0
		for _, t := range avail {
			if kept >= n {
				break
			}
			if p := r.overClaimed(t); p != nil {
				r.deadLetter(t, p)
				continue
			}
			cands = append(cands, t)
			kept++
		}
	}
	slices.SortFunc(cands, refClaimLess)
	// Best first, skipping a queue whose concurrency limit is reached.
	var take []*fsmpb.Task
	took := map[string]int{}
	for _, t := range cands {
		if len(take) == int(c.Limit) {
			break
		}
		if l := r.limits[t.Queue]; l > 0 && r.claimedIn(t.Queue)+took[t.Queue] >= int(l) {
			continue
		}
		took[t.Queue]++
		take = append(take, t)
	}
	for q, n := range took {
		if p := r.ratePolicy(q); p != nil {
			// Each task taken moves the time the bucket is full again
			// one interval on, from the clock at the latest.
			np := proto.Clone(p).(*fsmpb.QueuePolicy)
			np.BucketFullAt = max(p.BucketFullAt, r.clock) + int64(n)*p.RateInterval
			r.policies[q] = np
		}
	}
	res := &fsmpb.ClaimResult{}
	for _, t := range take {
		if t.Claimant != "" && (r.format < FormatInsertClaimant || t.Claims > 0) { // its holder's lease ran out
			res.ExpiredLeases++
		}
		nt := proto.Clone(t).(*fsmpb.Task)
		nt.Claimant = c.Claimant
		nt.At = r.clock + c.Lease
		nt.Claims++
		nt.Version++
		nt.Modified = r.clock
		r.tasks[refKey(refGroup(nt.Queue), nt.Id)] = nt
		res.Tasks = append(res.Tasks, nt)
	}
	return &fsmpb.Result{Claim: res}
}

func (r *refModel) purge(queue string) *fsmpb.Result {
	n := 0
	var purged []*fsmpb.Task
	for k, t := range r.tasks {
		if t.Queue == queue {
			delete(r.tasks, k)
			purged = append(purged, t)
			n++
		}
	}
	for _, t := range purged {
		r.reserve(t)
	}
	return &fsmpb.Result{Purge: &fsmpb.PurgeResult{Deleted: uint64(n)}}
}

func (r *refModel) queueStats() []QueueStats {
	byName := map[string]*QueueStats{}
	for _, t := range r.tasks {
		q := byName[t.Queue]
		if q == nil {
			q = &QueueStats{Name: t.Queue}
			byName[t.Queue] = q
		}
		q.Total++
		switch {
		case t.At <= r.clock:
			q.Available++
			if q.OldestAvailableAt == 0 || t.At < q.OldestAvailableAt {
				q.OldestAvailableAt = t.At
			}
		case t.Claimant != "":
			q.Claimed++
		default:
			q.Delayed++
		}
	}
	for name := range r.paused {
		if byName[name] == nil {
			byName[name] = &QueueStats{Name: name}
		}
		byName[name].Paused = true
	}
	for name, l := range r.limits {
		if byName[name] == nil {
			byName[name] = &QueueStats{Name: name}
		}
		byName[name].MaxClaimed = l
	}
	for name, p := range r.policies {
		if byName[name] == nil {
			byName[name] = &QueueStats{Name: name}
		}
		byName[name].Policy = p
	}
	var out []QueueStats
	for _, q := range byName {
		out = append(out, *q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Queues lists the model's tasks of queue q that are available.
func (r *refModel) Queues(q string) []*fsmpb.Task {
	var out []*fsmpb.Task
	for _, t := range r.tasks {
		if t.Queue == q && t.At <= r.clock {
			out = append(out, t)
		}
	}
	return out
}

// claimedIn counts the model's tasks of queue q under an unexpired lease.
func (r *refModel) claimedIn(q string) int {
	n := 0
	for _, t := range r.tasks {
		if t.Queue == q && t.Claimant != "" && t.At > r.clock {
			n++
		}
	}
	return n
}

// inKeyed reports whether this request's inserts staged key in queue.
func inKeyed(insertedKey map[[2]string]string, queue, key string) bool {
	_, ok := insertedKey[[2]string{queue, key}]
	return ok
}

// ratePolicy is q's policy if it has a rate in force (from FormatRate).
func (r *refModel) ratePolicy(q string) *fsmpb.QueuePolicy {
	if p := r.policies[q]; r.format >= FormatRate && p != nil && p.RateInterval > 0 {
		return p
	}
	return nil
}

// tokens is how many of q's tasks a claim may take at the clock under its
// rate: the burst, less one for every interval begun between the clock
// and the time the bucket is full again.
func (r *refModel) tokens(q string) int {
	p := r.ratePolicy(q)
	if p == nil {
		return math.MaxInt
	}
	owed := int64(0)
	for t := p.BucketFullAt; t > r.clock; t -= p.RateInterval {
		owed++
	}
	return int(max(0, int64(p.Burst)-owed))
}

// tokenAt is the first log time at which q's bucket holds a token
// (math.MinInt64 without a rate).
func (r *refModel) tokenAt(q string) int64 {
	p := r.ratePolicy(q)
	if p == nil {
		return math.MinInt64
	}
	return p.BucketFullAt - int64(p.Burst-1)*p.RateInterval
}
