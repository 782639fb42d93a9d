package fsm

import (
	"math"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// Headers a dead-lettered task gets (rule 25): where it came from, how often
// it was claimed, and the key it gave up when the dead-letter queue held it.
const (
	HeaderDeadLetterFrom   = "dead-letter-from"
	HeaderDeadLetterClaims = "dead-letter-claims"
	HeaderDeadLetterKey    = "dead-letter-key"
)

// policyEmpty reports whether p sets no rule (no policy).
func policyEmpty(p *fsmpb.QueuePolicy) bool {
	return p.MaxClaims == 0 && p.Retain == 0 && p.RateInterval == 0
}

// checkPolicy refuses a policy the state cannot hold: a delivery limit
// without a dead-letter queue of the queue's group, or that is the queue
// itself. Validate says the same at the edge; the applier checks again, as
// a log may hold what an older edge let through.
func checkPolicy(p *fsmpb.QueuePolicy) *fsmpb.Result {
	switch {
	case p.MaxClaims > 0 && p.DeadLetter == "":
		return failuref(fsmpb.Failure_INVALID, "policy.dead_letter: required with max_claims")
	case p.MaxClaims == 0 && p.DeadLetter != "":
		return failuref(fsmpb.Failure_INVALID, "policy.dead_letter: needs max_claims")
	case p.DeadLetter != "" && groupOf(p.DeadLetter) != groupOf(p.Queue):
		return failuref(fsmpb.Failure_INVALID, "policy.dead_letter: %q is not in group %q of queue %q (a dead-letter queue is in its queue's consistency group)",
			p.DeadLetter, groupOf(p.Queue), p.Queue)
	case p.DeadLetter != "" && p.DeadLetter == p.Queue:
		return failuref(fsmpb.Failure_INVALID, "policy.dead_letter: %q is the queue itself", p.DeadLetter)
	case p.Retain < 0:
		return failuref(fsmpb.Failure_INVALID, "policy.retain: %d is negative", p.Retain)
	case p.RateInterval < 0:
		return failuref(fsmpb.Failure_INVALID, "policy.rate_interval: %d is negative", p.RateInterval)
	case p.RateInterval > MaxRateInterval:
		return failuref(fsmpb.Failure_INVALID, "policy.rate_interval: %d ns is over the most of %d (one task an hour)", p.RateInterval, MaxRateInterval)
	case p.RateInterval > 0 && p.Burst == 0:
		return failuref(fsmpb.Failure_INVALID, "policy.burst: required with a rate (1 or more)")
	case p.RateInterval == 0 && p.Burst != 0:
		return failuref(fsmpb.Failure_INVALID, "policy.burst: needs a rate")
	case p.Burst > MaxBurst:
		return failuref(fsmpb.Failure_INVALID, "policy.burst: %d is over the most of %d", p.Burst, MaxBurst)
	}
	return nil
}

// policy sets a queue's policy, or with every rule zero removes it. The
// answer carries the policy it replaced. A delivery limit set or raised
// changes nothing until a claim looks at a task.
func (a *applier) policy(p *fsmpb.QueuePolicy) *fsmpb.Result {
	if a.st.format < FormatPolicies {
		return failuref(fsmpb.Failure_INVALID, "queue policies need state format %d; the shard is at %d", FormatPolicies, a.st.format)
	}
	if f := checkPolicy(p); f != nil {
		return f
	}
	if p.Retain != 0 && a.st.format < FormatRetention {
		return failuref(fsmpb.Failure_INVALID, "policy.retain needs state format %d; the shard is at %d", FormatRetention, a.st.format)
	}
	if p.RateInterval != 0 && a.st.format < FormatRate {
		return failuref(fsmpb.Failure_INVALID, "policy.rate needs state format %d; the shard is at %d", FormatRate, a.st.format)
	}
	prev := a.st.policies[p.Queue]
	if policyEmpty(p) {
		delete(a.st.policies, p.Queue)
	} else {
		np := &fsmpb.QueuePolicy{Queue: p.Queue, MaxClaims: p.MaxClaims, DeadLetter: p.DeadLetter, Retain: p.Retain,
			RateInterval: p.RateInterval, Burst: p.Burst}
		if np.RateInterval > 0 && prev != nil && prev.RateInterval > 0 && prev.BucketFullAt > a.st.clock {
			// The bucket stays as empty as it was (a new rate is no new
			// burst), at most a full new burst behind.
			np.BucketFullAt = min(prev.BucketFullAt, a.st.clock+int64(np.Burst)*np.RateInterval)
		}
		a.st.policies[p.Queue] = np
	}
	if prev != nil && prev.RateInterval > 0 {
		a.n.add(p.Queue) // a rate raised or removed may let waiting claims take tasks
	}
	return &fsmpb.Result{Policy: &fsmpb.PolicyResult{Previous: prev}}
}

// Bounds of a rate (checkPolicy): at least one task an hour, and bursts of
// at most a million tasks, so that a full bucket's span (burst times the
// interval) fits an int64 of nanoseconds.
const (
	MaxRateInterval = int64(time.Hour)
	MaxBurst        = 1_000_000
)

// tokens is how many tasks claims may still take from the named queue at
// log time now under its rate (rule 27): the burst less one for every
// rate_interval (begun) between now and the time the bucket is full again.
// Without a rate (or below FormatRate) it is math.MaxInt.
func (s *state) tokens(name string, now int64) int {
	p := s.ratePolicy(name)
	if p == nil {
		return math.MaxInt
	}
	return bucketTokens(p, now)
}

// ratePolicy returns the named queue's policy if it has a rate in force.
func (s *state) ratePolicy(name string) *fsmpb.QueuePolicy {
	if s.format < FormatRate || len(s.policies) == 0 {
		return nil
	}
	if p := s.policies[name]; p != nil && p.RateInterval > 0 {
		return p
	}
	return nil
}

func bucketTokens(p *fsmpb.QueuePolicy, now int64) int {
	if p.BucketFullAt <= now {
		return int(p.Burst)
	}
	owed := (p.BucketFullAt - now + p.RateInterval - 1) / p.RateInterval
	return int(max(0, int64(p.Burst)-owed))
}

// tokenAt is the earliest log time at which the bucket of p (a rate
// policy) holds a token: at or before the clock when it holds one now.
func tokenAt(p *fsmpb.QueuePolicy) int64 {
	return p.BucketFullAt - int64(p.Burst-1)*p.RateInterval
}

// spend takes n tokens from the named queue's bucket at the clock, if it
// has a rate: the time it is full again moves n intervals on from
// max(that time, clock). The policy is replaced, not changed (snapshots
// share it).
func (s *state) spend(name string, n int) {
	p := s.ratePolicy(name)
	if p == nil || n == 0 {
		return
	}
	np := proto.Clone(p).(*fsmpb.QueuePolicy)
	np.BucketFullAt = max(p.BucketFullAt, s.clock) + int64(n)*p.RateInterval
	s.policies[name] = np
}

// overClaimed reports whether a claim of t must dead-letter it instead
// (rule 25): its queue has a delivery limit of N, t was claimed N times or
// more, and its last lease ran out without a commit (it still names its
// claimant; a commit that ends a claim clears it).
func (s *state) overClaimed(t *task) (*fsmpb.QueuePolicy, bool) {
	if s.format < FormatPolicies || len(s.policies) == 0 {
		return nil, false
	}
	p := s.policies[t.q.name]
	if p == nil || p.MaxClaims == 0 || t.claims < p.MaxClaims || t.claimant == "" {
		return nil, false
	}
	return p, true
}

// deadLetter moves t, a task overClaimed found, to p's dead-letter queue:
// a new version, available at once, that keeps its claimant (the last
// one), attempt, error (or, without one, says why it moved), value and
// priority, with claims back at 0 (a move back gets N more claims) and
// headers naming the source queue and the claim count. A key the
// dead-letter queue holds already goes into a header instead.
func (a *applier) deadLetter(t *task, p *fsmpb.QueuePolicy) {
	st := a.st
	nt := *t
	nt.q = st.queueFor(p.DeadLetter)
	nt.at = st.clock
	nt.version++
	nt.modified = st.clock
	nt.claims = 0
	if nt.err == "" {
		nt.err = "claimed " + strconv.FormatUint(uint64(t.claims), 10) + " times without a commit (delivery limit of " + t.q.name + ")"
	}
	h := make(map[string]string, len(t.headers())+3)
	for k, v := range t.headers() {
		h[k] = v
	}
	h[HeaderDeadLetterFrom] = t.q.name
	h[HeaderDeadLetterClaims] = strconv.FormatUint(uint64(t.claims), 10)
	if t.key != "" && st.store.keyOwner(p.DeadLetter, t.key) != "" {
		h[HeaderDeadLetterKey] = t.key
		nt.key = ""
	}
	nt.ext = newTaskExt(t.dedupWindow(), h)
	source := t.q.name
	st.remove(t)
	st.add(&nt)
	st.prune(source)
	a.n.add(p.DeadLetter)
}

// MaxExpireVisit bounds the tasks one OP_EXPIRE step visits, so that a
// retention step never stalls its shard however many tasks expire.
const MaxExpireVisit = 4096

// expire applies one retention step (rule 26): it visits at most e.Visit
// (and MaxExpireVisit) tasks of the queue in claim order from the cursor
// and deletes those created at least the policy's retain ago, unless held
// under an unexpired lease. Without a retention policy it does nothing and
// says done.
func (a *applier) expire(e *fsmpb.Expire) *fsmpb.Result {
	st := a.st
	res := &fsmpb.ExpireResult{Done: true}
	p := st.policies[e.Queue]
	q := st.store.queue(e.Queue)
	if st.format < FormatRetention || p == nil || p.Retain <= 0 || q == nil {
		return &fsmpb.Result{Expire: res}
	}
	visit := int(min(max(e.Visit, 1), MaxExpireVisit))
	var from *task
	if e.Id != "" {
		from = &task{priority: e.Priority, at: e.At, id: e.Id, q: q}
	}
	var victims []*task
	n := 0
	res.Done = true
	st.store.ascendQueue(q, from, func(t *task) bool {
		if n == visit {
			res.Priority, res.At, res.Id, res.Done = t.priority, t.at, t.id, false
			return false
		}
		n++
		if addSat(t.created, p.Retain) <= st.clock && !isClaimed(t, st.clock) {
			victims = append(victims, t)
		}
		return true
	})
	for _, t := range victims {
		st.remove(t)
		st.reserve(t)
	}
	st.prune(e.Queue)
	res.Deleted = uint64(len(victims))
	return &fsmpb.Result{Expire: res}
}

// Retained returns the queues of the shard with a retention policy, and
// their retain (for the leader's retention loop).
func (m *Machine) Retained() map[string]int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out map[string]int64
	for name, p := range m.st.policies {
		if p.Retain > 0 && m.st.unserved(groupOf(name)) == nil {
			if out == nil {
				out = map[string]int64{}
			}
			out[name] = p.Retain
		}
	}
	return out
}
