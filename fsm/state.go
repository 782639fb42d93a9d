package fsm

import (
	"math"
	"strings"

	"github.com/google/btree"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// btreeDegree is the degree of every B-tree in the state: nodes of up to 63
// pointers keep trees shallow (4 levels at a million tasks).
const btreeDegree = 32

// task is one version of a task. Tasks are immutable values once they are in
// the state: a change builds a new task and swaps it in. That is what makes
// Snapshot cheap: a copy of the pointers is a consistent picture.
//
// The struct is kept small (160-byte size class) because there may be
// millions; the queue is a pointer to the shared queue record.
type task struct {
	id       string
	key      string
	claimant string
	err      string
	value    []byte // shared with results and snapshots; never modified
	dedup    int64  // the key's reservation after deletion (Insert.dedup_window)
	q        *queue
	slot     *slot // the id's entry in state.tasks, shared by every version
	version  uint64
	at       int64
	created  int64
	modified int64
	priority int32
	claims   uint32
	attempt  uint32
}

// slot is the id map's entry for one task: it points at the current
// version. A new version takes the old one's slot, so replacing a task
// (every claim does) writes one pointer instead of rewriting the map, which
// at a million tasks costs two cache misses (the map group and the key).
//
// From FormatGroupIDs on, tasks of different groups may share an id: the
// map holds the first slot and next chains the others (every slot of a
// chain is of another group). Such chains are rare and short; before that
// format they have one slot.
type slot struct {
	t    *task
	next *slot
}

// claimLess orders a queue's tasks in claim order: priority descending, then
// at ascending, then id ascending.
func claimLess(a, b *task) bool {
	if a.priority != b.priority {
		return a.priority > b.priority
	}
	if a.at != b.at {
		return a.at < b.at
	}
	return a.id < b.id
}

// atLess orders tasks by at, then id, then queue (the pending index, which
// holds every queue's tasks: ids repeat across groups from FormatGroupIDs
// on, and two tasks the order called equal would replace each other).
func atLess(a, b *task) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.id != b.id {
		return a.id < b.id
	}
	return a.q.name < b.q.name
}

// queue is the index of one queue's tasks. A queue exists while it holds
// tasks.
type queue struct {
	name  string
	group string
	// byClaim holds every task of the queue in claim order. It is the
	// queue's only ordered index: within a priority, claim order is at
	// order, so the oldest task of each priority is the first of its run
	// (see runs), and a second, at-ordered tree would double the cost of
	// every write for the sake of two read-side statistics.
	byClaim *btree.BTreeG[*task]
	keys    map[string]string // key → id of the task holding it; nil until a key is used
	// Tasks with at > clock (they are in state.pending), split by whether
	// a claimant is set: claimed and delayed counts without a scan.
	futureClaimed uint64
	futureDelayed uint64
}

func queueLess(a, b *queue) bool { return a.name < b.name }

// session is the exactly-once memory of one client. Immutable once stored.
type session struct {
	clientID string
	seq      uint64
	group    string // the request's consistency group (FormatSlotMoves on)
	lastSeen int64
	result   *fsmpb.Result
	size     uint64 // sessionSize, counted in state.sessionBytes
}

// sessionOverheadBytes is what a session costs besides its id and answer.
const sessionOverheadBytes = 64

// sessionSize is what a session is counted as against MaxSessionBytes: the
// encoded answer, which every replica computes alike.
func sessionSize(clientID string, res *fsmpb.Result) uint64 {
	return uint64(len(clientID)+proto.Size(res)) + sessionOverheadBytes
}

func sessionLess(a, b *session) bool {
	if a.lastSeen != b.lastSeen {
		return a.lastSeen < b.lastSeen
	}
	return a.clientID < b.clientID
}

// state is the whole replicated state plus its indexes. It is not safe for
// concurrent use; Machine guards it.
type state struct {
	clock   int64
	applied uint64
	format  uint32           // the state format (OP_SET_FORMAT)
	tasks   map[string]*slot // id → its current version (a chain: see slot)
	ntasks  int              // tasks held (ids may repeat across groups)
	queues  map[string]*queue
	names   *btree.BTreeG[*queue] // queues by name, for prefix listing
	// pending holds every task with at > clock, in at order, so that
	// advancing the clock finds exactly the tasks that became available.
	pending      *btree.BTreeG[*task]
	sessions     map[string]*session
	sessionOrder *btree.BTreeG[*session] // least recently seen first
	sessionBytes uint64                  // sum of the sessions' sizes
	// paused holds the queues that hand out no claims (OP_PAUSE), whether
	// or not they hold tasks: a queue record is pruned when it empties,
	// a pause is not.
	paused map[string]struct{}
	// limits holds the queues' concurrency limits (OP_LIMIT): at most so
	// many of a queue's tasks claimed at once. Like a pause, a limit
	// outlives the queue's tasks.
	limits map[string]uint32
	// reserved holds the keys of deleted tasks inserted with a dedup
	// window, until the window ends (reservedOrder, soonest first).
	reserved      map[queueKey]*reservation
	reservedOrder *btree.BTreeG[*reservation]
	// schedules by scheduleKey (group and name); each immutable, replaced
	// on change.
	schedules map[string]*fsmpb.Schedule
	// slotStates holds the slots this shard does not serve because they
	// moved or are moving (OP_SLOT); every other slot is served. slotTable
	// is the slot table's size they were computed with (0 before the first
	// move).
	slotStates map[uint32]*fsmpb.SlotState
	slotTable  uint32
}

// reservation keeps a deleted task's key taken in its queue. Immutable.
type reservation struct {
	last  *task // the version deleted; its queue and key name the reservation
	until int64
}

func reservationLess(a, b *reservation) bool {
	if a.until != b.until {
		return a.until < b.until
	}
	if a.last.q.name != b.last.q.name {
		return a.last.q.name < b.last.q.name
	}
	return a.last.key < b.last.key
}

// reserve keeps t's key taken for its dedup window after t was deleted,
// unless a live task holds the key again.
func (s *state) reserve(t *task) {
	if t.key == "" || t.dedup <= 0 {
		return
	}
	if q := s.queues[t.q.name]; q != nil && q.keys[t.key] != "" {
		return
	}
	k := queueKey{t.q.name, t.key}
	if old := s.reserved[k]; old != nil {
		s.reservedOrder.Delete(old)
	}
	r := &reservation{last: t, until: addSat(s.clock, t.dedup)}
	s.reserved[k] = r
	s.reservedOrder.ReplaceOrInsert(r)
}

// reservedKey returns the unexpired reservation of key in queue, if any.
func (s *state) reservedKey(queue, key string) *reservation {
	if r := s.reserved[queueKey{queue, key}]; r != nil && r.until > s.clock {
		return r
	}
	return nil
}

// expireReservations drops the reservations whose window has ended.
func (s *state) expireReservations() {
	for {
		r, ok := s.reservedOrder.Min()
		if !ok || r.until > s.clock {
			return
		}
		s.reservedOrder.DeleteMin()
		delete(s.reserved, queueKey{r.last.q.name, r.last.key})
	}
}

// capacity is how many more of q's tasks a claim may take now: its limit
// less the tasks under an unexpired lease, or no bound.
func (s *state) capacity(q *queue) int {
	l, ok := s.limits[q.name]
	if !ok {
		return math.MaxInt
	}
	return int(uint64(l) - min(uint64(l), q.futureClaimed))
}

// isPaused reports whether the named queue is paused.
func (s *state) isPaused(name string) bool {
	_, ok := s.paused[name]
	return ok
}

// putSession replaces the session of s.clientID with s (sessions are
// immutable: snapshots share them).
func (st *state) putSession(s *session) {
	if old := st.sessions[s.clientID]; old != nil {
		st.sessionOrder.Delete(old)
		st.sessionBytes -= old.size
	}
	st.sessions[s.clientID] = s
	st.sessionOrder.ReplaceOrInsert(s)
	st.sessionBytes += s.size
}

// dropOldestSession forgets the least recently seen session.
func (st *state) dropOldestSession() {
	s, ok := st.sessionOrder.DeleteMin()
	if !ok {
		return
	}
	delete(st.sessions, s.clientID)
	st.sessionBytes -= s.size
}

func newState() *state {
	return &state{
		tasks:         make(map[string]*slot),
		queues:        make(map[string]*queue),
		names:         btree.NewG(btreeDegree, queueLess),
		pending:       btree.NewG(btreeDegree, atLess),
		sessions:      make(map[string]*session),
		sessionOrder:  btree.NewG(btreeDegree, sessionLess),
		paused:        make(map[string]struct{}),
		limits:        make(map[string]uint32),
		reserved:      make(map[queueKey]*reservation),
		schedules:     make(map[string]*fsmpb.Schedule),
		slotStates:    make(map[uint32]*fsmpb.SlotState),
		reservedOrder: btree.NewG(btreeDegree, reservationLess),
	}
}

// groupOf returns the consistency group of a queue name: the text before
// the first '/', or the whole name.
func groupOf(queue string) string {
	if i := strings.IndexByte(queue, '/'); i >= 0 {
		return queue[:i]
	}
	return queue
}

// GroupOf returns the consistency group of a queue name: the text before the
// first '/', or the whole name if it has none.
func GroupOf(queue string) string { return groupOf(queue) }

// queueFor returns the queue record, creating it if needed. A created queue
// that ends up empty is removed by prune.
func (s *state) queueFor(name string) *queue {
	if q := s.queues[name]; q != nil {
		return q
	}
	q := &queue{
		name:    name,
		group:   groupOf(name),
		byClaim: btree.NewG(btreeDegree, claimLess),
	}
	s.queues[name] = q
	s.names.ReplaceOrInsert(q)
	return q
}

// prune removes the named queue if it holds no tasks.
func (s *state) prune(name string) {
	if q := s.queues[name]; q != nil && q.byClaim.Len() == 0 {
		delete(s.queues, name)
		s.names.Delete(q)
	}
}

// find returns the current version of the task with id in group, or nil.
func (s *state) find(group, id string) *task {
	for sl := s.tasks[id]; sl != nil; sl = sl.next {
		if sl.t.q.group == group {
			return sl.t
		}
	}
	return nil
}

// holds reports whether a task with id exists in any group.
func (s *state) holds(id string) bool { return s.tasks[id] != nil }

// idTaken reports whether an insert of id into group must fail as a
// duplicate: by the state format, an id held in any group, or in this one.
func (s *state) idTaken(group, id string) bool {
	if s.format < FormatGroupIDs {
		return s.holds(id)
	}
	return s.find(group, id) != nil
}

// add inserts a task that is not in the state. t.q must be the live queue
// record for its name. A new version of a removed task (t.slot set, copied
// from the old version) takes its old slot.
func (s *state) add(t *task) {
	if t.slot == nil {
		t.slot = &slot{}
	}
	t.slot.t = t
	t.slot.next = s.tasks[t.id]
	s.tasks[t.id] = t.slot
	s.ntasks++
	s.index(t)
}

// unlink takes t's slot out of the id map.
func (s *state) unlink(t *task) {
	sl := t.slot
	head := s.tasks[t.id]
	switch {
	case head == sl && sl.next == nil:
		delete(s.tasks, t.id)
	case head == sl:
		s.tasks[t.id] = sl.next
	default:
		for p := head; p != nil; p = p.next {
			if p.next == sl {
				p.next = sl.next
				break
			}
		}
	}
	sl.next = nil
	s.ntasks--
}

// index puts t into every index but the id map.
func (s *state) index(t *task) {
	q := t.q
	q.byClaim.ReplaceOrInsert(t)
	if t.key != "" {
		if q.keys == nil {
			q.keys = make(map[string]string)
		}
		q.keys[t.key] = t.id
	}
	if t.at > s.clock {
		s.pending.ReplaceOrInsert(t)
		if t.claimant != "" {
			q.futureClaimed++
		} else {
			q.futureDelayed++
		}
	}
}

// remove takes a task out of every index. It leaves the queue record in
// place, even if empty: callers prune.
func (s *state) remove(t *task) {
	s.unindex(t)
	s.unlink(t)
}

// unindex takes a task out of every index but the id map.
func (s *state) unindex(t *task) {
	q := t.q
	if first, _ := q.byClaim.Min(); first == t {
		// A claim takes the front of the queue: DeleteMin walks the
		// leftmost path without comparing (a comparison reads a task,
		// which at a million tasks is a cache miss).
		q.byClaim.DeleteMin()
	} else {
		q.byClaim.Delete(t)
	}
	if t.key != "" && q.keys[t.key] == t.id {
		delete(q.keys, t.key)
	}
	if t.at > s.clock {
		s.pending.Delete(t)
		if t.claimant != "" {
			q.futureClaimed--
		} else {
			q.futureDelayed--
		}
	}
}

// replace swaps a task for its next version, which has the same id and,
// copied from old, the same slot: the id map is not written.
func (s *state) replace(old, t *task) {
	s.unindex(old)
	t.slot.t = t
	s.index(t)
}

// advance moves the clock forward to now (never back) and moves tasks whose
// at has come out of pending. became is called with the queue of each such
// task.
func (s *state) advance(now int64, became func(queue string)) {
	if now <= s.clock {
		return
	}
	s.clock = now
	for {
		t, ok := s.pending.Min()
		if !ok || t.at > now {
			return
		}
		s.pending.DeleteMin()
		if t.claimant != "" {
			t.q.futureClaimed--
		} else {
			t.q.futureDelayed--
		}
		became(t.q.name)
	}
}

// isClaimed reports whether t is held under an unexpired lease.
func isClaimed(t *task, clock int64) bool { return t.claimant != "" && t.at > clock }

// stats returns q's counts at clock.
func (q *queue) stats(clock int64) QueueStats {
	total := uint64(q.byClaim.Len())
	st := QueueStats{
		Name:      q.name,
		Total:     total,
		Claimed:   q.futureClaimed,
		Delayed:   q.futureDelayed,
		Available: total - q.futureClaimed - q.futureDelayed,
	}
	q.runs(func(first *task) bool {
		if first.at <= clock && (st.OldestAvailableAt == 0 || first.at < st.OldestAvailableAt) {
			st.OldestAvailableAt = first.at
		}
		return true
	})
	return st
}

// maxRuns bounds how many priority runs a read walks (one descent each):
// queues rarely use more than a handful of priorities, and a read must not
// walk a queue whose every task has its own priority.
const maxRuns = 256

// runs calls visit with the first task of each priority run of q, highest
// priority first, while visit returns true, for at most maxRuns runs; it
// reports whether it saw them all. Within a run tasks are in at order, so
// the first is the run's smallest at: the smallest at of the queue is the
// smallest of these.
func (q *queue) runs(visit func(first *task) bool) (all bool) {
	t, ok := q.byClaim.Min()
	for n := 0; ok; n++ {
		if n == maxRuns {
			return false
		}
		from := belowPriority(t)
		if !visit(t) || from == nil {
			return true
		}
		ok = false
		q.byClaim.AscendGreaterOrEqual(from, func(next *task) bool {
			t, ok = next, true
			return false
		})
	}
	return true
}

// belowPriority is the search key where the run after t's priority starts
// in claim order (the next lower priority), or nil after the lowest.
func belowPriority(t *task) *task {
	if t == nil || t.priority == math.MinInt32 {
		return nil
	}
	return &task{priority: t.priority - 1, at: math.MinInt64}
}

// toProto converts a task for a result or a read. The value is shared, not
// copied: callers must not modify it.
func (t *task) toProto(omitValue bool) *fsmpb.Task {
	p := &fsmpb.Task{
		Id:          t.id,
		Version:     t.version,
		Queue:       t.q.name,
		At:          t.at,
		Claimant:    t.claimant,
		Priority:    t.priority,
		Key:         t.key,
		Created:     t.created,
		Modified:    t.modified,
		Claims:      t.claims,
		Attempt:     t.attempt,
		Err:         t.err,
		DedupWindow: t.dedup,
	}
	if !omitValue {
		p.Value = t.value
	}
	return p
}

// addSat returns a+b, saturated to the int64 range.
func addSat(a, b int64) int64 {
	c := a + b
	if b > 0 && c < a {
		return math.MaxInt64
	}
	if b < 0 && c > a {
		return math.MinInt64
	}
	return c
}
