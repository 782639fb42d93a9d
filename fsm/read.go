package fsm

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// DefaultListLimit is the page size of List when limit <= 0.
const DefaultListLimit = 100

// Get returns the tasks with the given ids that exist, in request order;
// an id that several groups hold (FormatGroupIDs) gives each of them, in
// queue name order.
func (m *Machine) Get(ids []string) []*fsmpb.Task {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []*fsmpb.Task
	for _, id := range ids {
		from := len(out)
		m.st.store.withID(id, func(t *task) bool {
			out = append(out, t.toProto(false))
			return true
		})
		if len(out)-from > 1 {
			slices.SortFunc(out[from:], func(a, b *fsmpb.Task) int { return strings.Compare(a.Queue, b.Queue) })
		}
	}
	return out
}

// List returns up to limit tasks of a queue in claim order, starting after
// the page token (empty: from the start), and the token of the next page
// (empty: no more). claimed filters when non-nil; omitValues drops values.
//
// limit <= 0 means DefaultListLimit. A token names a position in claim order
// (priority, at, id), not a task, so it stays valid while the queue changes.
// With a filter, a page looks at no more than 10000 tasks, so it may be
// short, even empty, while the token is not: the end is an empty token. A
// malformed token is an error wrapping ErrInvalid.
func (m *Machine) List(queue string, pageToken string, limit int, claimed *bool, omitValues bool) ([]*fsmpb.Task, string, error) {
	return m.ListFiltered(queue, pageToken, limit, ListFilter{Claimed: claimed}, omitValues, 0)
}

// TaskState is a task's state at the machine's clock, for ListFilter.
type TaskState int

const (
	AnyState  TaskState = iota
	Available           // no live lease and at <= clock
	Claimed             // a claimant whose lease runs past the clock
	Delayed             // no claimant and at > clock
)

// ListFilter selects the tasks a List page returns. Zero fields select
// everything.
type ListFilter struct {
	Claimed     *bool // claimed (a live lease) or not
	State       TaskState
	Claimant    string // exactly this claimant, lease live or not
	KeyPrefix   string // a key starting with this ("" also matches no key)
	MinAttempt  uint32
	ErrContains string            // err containing this text
	Headers     map[string]string // every one of these headers, with this value
}

// Any reports whether f filters at all.
func (f ListFilter) Any() bool {
	return f.Claimed != nil || f.State != AnyState || f.Claimant != "" || f.KeyPrefix != "" || f.MinAttempt > 0 || f.ErrContains != "" || len(f.Headers) > 0
}

func (f ListFilter) match(t *task, clock int64) bool {
	claimed := isClaimed(t, clock)
	switch {
	case f.Claimed != nil && *f.Claimed != claimed,
		f.State == Claimed && !claimed,
		f.State == Delayed && (t.claimant != "" || t.at <= clock),
		f.State == Available && (claimed || t.at > clock),
		f.Claimant != "" && t.claimant != f.Claimant,
		f.KeyPrefix != "" && !strings.HasPrefix(t.key, f.KeyPrefix),
		t.attempt < f.MinAttempt,
		f.ErrContains != "" && !strings.Contains(t.err, f.ErrContains):
		return false
	}
	if len(f.Headers) > 0 {
		h := t.headers()
		for k, v := range f.Headers {
			if hv, ok := h[k]; !ok || hv != v {
				return false
			}
		}
	}
	return true
}

// ListFiltered is List with any filter, and the page also bounded by
// maxBytes of answer (AnswerBytes per task; 0: no bound): the page ends
// before the task that would take it over, so that a page of large values
// fits one message; it always holds at least one task. A filtered page
// looks at no more than listScanLimit tasks (a page may then be short or
// empty while its token is not); the token stays valid while the queue
// changes, since it names a position in claim order.
func (m *Machine) ListFiltered(queue string, pageToken string, limit int, f ListFilter, omitValues bool, maxBytes uint64) ([]*fsmpb.Task, string, error) {
	if limit <= 0 {
		limit = DefaultListLimit
	}
	var from *task
	if pageToken != "" {
		var err error
		if from, err = decodePageToken(pageToken); err != nil {
			return nil, "", err
		}
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	q := m.st.store.queue(queue)
	if q == nil {
		return nil, "", nil
	}
	clock := m.st.clock
	filtered := f.Any()
	var out []*fsmpb.Task
	var last *task
	more, scanned := false, 0
	var bytes uint64
	visit := func(t *task) bool {
		if len(out) == limit || filtered && scanned == listScanLimit {
			more = true
			return false
		}
		if f.match(t, clock) {
			p := t.toProto(omitValues)
			if maxBytes > 0 {
				bytes += AnswerBytes(p)
				if bytes > maxBytes && len(out) > 0 {
					more = true
					return false
				}
			}
			out = append(out, p)
		}
		scanned++
		last = t
		return true
	}
	m.st.store.ascendQueue(q, from, visit)
	if !more {
		return out, "", nil
	}
	return out, encodePageToken(last), nil
}

// listScanLimit bounds how many tasks one filtered List page looks at, so
// that a read never walks a whole large queue under the lock.
const listScanLimit = 10000

func encodePageToken(t *task) string {
	b := make([]byte, 1+4+8, 1+4+8+len(t.id))
	b[0] = 1
	binary.BigEndian.PutUint32(b[1:], uint32(t.priority))
	binary.BigEndian.PutUint64(b[5:], uint64(t.at))
	b = append(b, t.id...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodePageToken returns the position just after the token's task.
func decodePageToken(s string) (*task, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < 13 || b[0] != 1 {
		return nil, invalidf("page_token", "malformed")
	}
	return &task{
		priority: int32(binary.BigEndian.Uint32(b[1:])),
		at:       int64(binary.BigEndian.Uint64(b[5:])),
		id:       string(b[13:]) + "\x00", // the least id after the token's
	}, nil
}

// Queues returns stats of queues whose name starts with prefix, sorted by
// name, at most limit (0: all): the queues that hold tasks, and paused ones
// that hold none.
func (m *Machine) Queues(prefix string, limit int) []QueueStats {
	var out []QueueStats
	m.queues(prefix, func(string) bool { return true }, func(st QueueStats) bool {
		out = append(out, st)
		return limit <= 0 || len(out) < limit
	})
	return out
}

// QueueCounts calls fn with the stats of every queue the shard serves, in
// name order, as Queues lists them, but with OldestAvailableAt only for
// the queues where oldest(name) is true (called once per queue, in
// order). The counts are in memory; the oldest available task is a read
// of the state per priority run of its queue, on disk a seek and a record
// each: for a metrics scrape of 100,000 queues that was seconds of CPU.
func (m *Machine) QueueCounts(oldest func(name string) bool, fn func(QueueStats)) {
	m.queues("", oldest, func(st QueueStats) bool {
		fn(st)
		return true
	})
}

// queues walks the queues whose names start with prefix while fn returns
// true, under the machine's read lock (fn must not call the machine).
func (m *Machine) queues(prefix string, oldest func(name string) bool, fn func(QueueStats) bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	// Queues with settings (paused, limited) are few: merge the empty ones
	// into the walk by name.
	// A slot being imported or moved away is another shard's to list.
	hidden := func(name string) bool { return !m.st.readsGroup(groupOf(name)) }
	var idle []string
	for name := range m.st.paused {
		if m.st.store.queue(name) == nil && strings.HasPrefix(name, prefix) && !hidden(name) {
			idle = append(idle, name)
		}
	}
	for name := range m.st.limits {
		if m.st.store.queue(name) == nil && !m.st.isPaused(name) && strings.HasPrefix(name, prefix) && !hidden(name) {
			idle = append(idle, name)
		}
	}
	for name := range m.st.policies {
		if m.st.store.queue(name) == nil && !m.st.isPaused(name) && m.st.limits[name] == 0 && strings.HasPrefix(name, prefix) && !hidden(name) {
			idle = append(idle, name)
		}
	}
	slices.Sort(idle)
	settings := func(st QueueStats) QueueStats {
		st.Paused, st.MaxClaimed = m.st.isPaused(st.Name), m.st.limits[st.Name]
		st.Policy = m.st.policies[st.Name]
		return st
	}
	more := true
	emit := func(st QueueStats) { more = fn(settings(st)) }
	m.st.store.ascendQueues(prefix, func(q *queue) bool {
		if !strings.HasPrefix(q.name, prefix) {
			return false
		}
		for ; len(idle) > 0 && idle[0] < q.name && more; idle = idle[1:] {
			emit(QueueStats{Name: idle[0]})
		}
		if more && !hidden(q.name) {
			if oldest(q.name) {
				emit(m.st.stats(q))
			} else {
				emit(m.st.counts(q))
			}
		}
		return more
	})
	for ; len(idle) > 0 && more; idle = idle[1:] {
		emit(QueueStats{Name: idle[0]})
	}
}

// NextAt returns the earliest at of any task in the queues (claimed tasks
// count by lease end), so a waiting claim knows when to try again. In a
// queue with more than maxRuns priorities it looks at the highest maxRuns
// and answers no later than nextAtUnseen after the clock, so that a
// waiting claim looks again soon rather than sleeping past a lease end it
// did not see.
func (m *Machine) NextAt(queues []string) (at int64, ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	at = math.MaxInt64
	for _, name := range queues {
		q := m.st.store.queue(name)
		if q == nil || m.st.isPaused(name) || m.st.capacity(q) == 0 {
			// A paused queue's waiting claims wait for the resume; a
			// full one's, for a claim to end (a commit or a lease
			// running out, which both tell them).
			continue
		}
		// A queue with a rate gives nothing before its bucket holds a
		// token (rule 27).
		from := int64(math.MinInt64)
		if p := m.st.ratePolicy(name); p != nil {
			from = tokenAt(p)
		}
		all := m.st.store.runs(q, func(first *task) bool {
			at, ok = min(at, max(first.at, from)), true
			return true
		})
		if !all {
			at = min(at, addSat(m.st.clock, nextAtUnseen))
		}
	}
	if !ok {
		return 0, false
	}
	return at, true
}

// Available counts, up to limit, the tasks of queue that a claim stamped
// with time now would find available (at <= max(now, clock)), so that the
// leader wakes as many waiting claims as there are tasks to take, not all of
// them. It costs what a claim of limit tasks costs, without the writes.
func (m *Machine) Available(queue string, now int64, limit int) int {
	if limit <= 0 {
		return 0
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	q := m.st.store.queue(queue)
	if q == nil || m.st.isPaused(queue) {
		return 0
	}
	// Capacity by the machine's clock: leases that ran out since count once
	// a tick moves it, and the tick tells the waiters.
	now = max(now, m.st.clock)
	if limit = min(limit, m.st.capacity(q), m.st.tokens(queue, now)); limit <= 0 {
		return 0
	}
	return len(m.st.store.available(q, now, limit, nil))
}

// nextAtUnseen is how soon NextAt tells a waiting claim to look again when
// a queue has more priorities than it walks.
const nextAtUnseen = int64(100 * time.Millisecond)

// Digest is a hash of the whole replicated state (tasks, clock, sessions):
// replicas that applied the same log have the same digest.
//
// It hashes a canonical encoding: the clock, then every task in id order,
// then every session in client id order with its deterministically
// marshalled result. The applied index is not part of it. Digest sorts the
// whole state: it is for tests and consistency checks, not a hot path.
func (m *Machine) Digest() [32]byte {
	m.mu.RLock()
	snap := m.st.snapshot()
	m.mu.RUnlock()
	return digestOf(snap)
}

// digestOf hashes a snapshot canonically (see Digest). It sorts the
// snapshot's slices in place and takes no lock: the snapshot shares only
// immutable tasks and sessions with the state, so it runs off the apply
// goroutine (checkpoints) as safely as on it.
func digestOf(snap *snapshot) [32]byte {
	// By id, then queue: ids repeat only across groups (FormatGroupIDs),
	// and the queue tells those apart.
	slices.SortFunc(snap.tasks, func(a, b *task) int {
		if c := strings.Compare(a.id, b.id); c != 0 {
			return c
		}
		return strings.Compare(a.q.name, b.q.name)
	})
	slices.SortFunc(snap.sessions, func(a, b *session) int { return strings.Compare(a.clientID, b.clientID) })

	h := sha256.New()
	var buf []byte
	u := func(v uint64) { buf = binary.AppendUvarint(buf, v) }
	str := func(s string) { u(uint64(len(s))); buf = append(buf, s...) }
	flush := func() { h.Write(buf); buf = buf[:0] }
	str("taskstore fsm digest v1")
	u(uint64(snap.clock))
	if snap.format > 0 {
		// Only then, so that digests of format 0 stay what they were.
		str("format")
		u(uint64(snap.format))
	}
	u(uint64(len(snap.tasks)))
	for _, t := range snap.tasks {
		str(t.id)
		u(t.version)
		str(t.q.name)
		u(uint64(t.at))
		str(t.claimant)
		u(uint64(uint32(t.priority)))
		str(t.key)
		u(uint64(len(t.value)))
		buf = append(buf, t.value...)
		u(uint64(t.created))
		u(uint64(t.modified))
		u(uint64(t.claims))
		u(uint64(t.attempt))
		str(t.err)
		if t.dedupWindow() != 0 {
			// Only then: digests of tasks without one stay as they were.
			str("dedup")
			u(uint64(t.dedupWindow()))
		}
		if h := t.headers(); len(h) > 0 {
			// Only then, like dedup.
			str("headers")
			u(uint64(len(h)))
			for _, k := range slices.Sorted(maps.Keys(h)) {
				str(k)
				str(h[k])
			}
		}
		flush()
	}
	u(uint64(len(snap.sessions)))
	for _, s := range snap.sessions {
		str(s.clientID)
		u(s.seq)
		u(uint64(s.lastSeen))
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.answer())
		if err != nil {
			panic(fmt.Sprintf("fsm: digest: marshal session result: %v", err))
		}
		u(uint64(len(b)))
		buf = append(buf, b...)
		if s.group != "" {
			// Only then (FormatSlotMoves): digests of older sessions stay.
			str("group")
			str(s.group)
		}
		flush()
	}
	if len(snap.slots) > 0 {
		str("slots")
		u(uint64(snap.table))
		u(uint64(len(snap.slots)))
		for _, ss := range snap.slots {
			u(uint64(ss.Slot))
			u(uint64(ss.Phase))
			u(ss.Move)
			u(uint64(ss.To))
			u(uint64(ss.Chunks))
		}
	}
	if len(snap.paused) > 0 {
		// Only then, so that digests without a paused queue stay what
		// older binaries compute.
		str("paused")
		u(uint64(len(snap.paused)))
		for _, name := range snap.paused {
			str(name)
		}
	}
	if len(snap.sched) > 0 {
		str("schedules")
		u(uint64(len(snap.sched)))
		for _, sc := range snap.sched {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(sc)
			if err != nil {
				panic(fmt.Sprintf("fsm: digest: marshal schedule: %v", err))
			}
			u(uint64(len(b)))
			buf = append(buf, b...)
		}
	}
	if len(snap.reserved) > 0 {
		str("reserved")
		u(uint64(len(snap.reserved)))
		for _, r := range snap.reserved {
			u(uint64(r.until))
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r.last.toProto(false))
			if err != nil {
				panic(fmt.Sprintf("fsm: digest: marshal reserved task: %v", err))
			}
			u(uint64(len(b)))
			buf = append(buf, b...)
		}
	}
	if len(snap.limits) > 0 {
		str("limits")
		u(uint64(len(snap.limits)))
		for _, l := range snap.limits {
			str(l.Queue)
			u(uint64(l.MaxClaimed))
		}
	}
	if len(snap.policies) > 0 {
		// Only then, so that digests without a policy stay what older
		// binaries compute.
		str("policies")
		u(uint64(len(snap.policies)))
		for _, p := range snap.policies {
			str(p.Queue)
			u(uint64(p.MaxClaims))
			str(p.DeadLetter)
			if p.Retain != 0 { // (FormatRetention)
				str("retain")
				u(uint64(p.Retain))
			}
			if p.RateInterval != 0 { // (FormatRate)
				str("rate")
				u(uint64(p.RateInterval))
				u(uint64(p.Burst))
				u(uint64(p.BucketFullAt))
			}
		}
	}
	flush()
	var out [32]byte
	h.Sum(out[:0])
	return out
}
