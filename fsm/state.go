package fsm

import (
	"fmt"
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
	value    []byte   // shared with results and snapshots; never modified
	ext      *taskExt // rarely set fields; nil when none is
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

// taskExt holds the fields few tasks set, so that the task struct stays in
// its size class. Immutable and shared between versions: a change that sets
// one builds a new taskExt.
type taskExt struct {
	dedup   int64             // the key's reservation after deletion (Insert.dedup_window)
	headers map[string]string // Insert.headers (FormatHeaders); never modified
}

// newTaskExt is the ext of a task with these fields: nil when all are zero.
func newTaskExt(dedup int64, headers map[string]string) *taskExt {
	if dedup == 0 && len(headers) == 0 {
		return nil
	}
	if len(headers) == 0 {
		headers = nil
	}
	return &taskExt{dedup: dedup, headers: headers}
}

// dedupWindow is the key's reservation after the task's deletion.
func (t *task) dedupWindow() int64 {
	if t.ext == nil {
		return 0
	}
	return t.ext.dedup
}

// headers are the task's string pairs (shared: never modify them).
func (t *task) headers() map[string]string {
	if t.ext == nil {
		return nil
	}
	return t.ext.headers
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
	// raw, when encoded: the result as the on-disk store keeps it
	// (deterministic protobuf), not decoded until asked for (answer): a
	// command reads its client's session every time, and the answer only
	// on a repeat.
	raw     []byte
	encoded bool
}

// answer is the session's result: result, or raw decoded (a new message
// each call).
func (s *session) answer() *fsmpb.Result {
	if !s.encoded {
		return s.result
	}
	res := &fsmpb.Result{}
	if err := proto.Unmarshal(s.raw, res); err != nil {
		panic(fmt.Sprintf("fsm: a stored session's answer does not decode: %v", err))
	}
	return res
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

// state is the whole replicated state. It is not safe for concurrent use;
// Machine guards it. What grows with the tasks and clients is in its store.
type state struct {
	clock   int64
	applied uint64
	format  uint32 // the state format (OP_SET_FORMAT)
	store   store  // tasks, sessions and key reservations
	// paused holds the queues that hand out no claims (OP_PAUSE), whether
	// or not they hold tasks: a queue record is pruned when it empties,
	// a pause is not.
	paused map[string]struct{}
	// limits holds the queues' concurrency limits (OP_LIMIT): at most so
	// many of a queue's tasks claimed at once. Like a pause, a limit
	// outlives the queue's tasks.
	limits map[string]uint32
	// policies holds the queues' policies (OP_POLICY, policy.go); each
	// immutable, replaced on change. Like a limit, a policy outlives the
	// queue's tasks.
	policies map[string]*fsmpb.QueuePolicy
	// schedules by scheduleKey (group and name); each immutable, replaced
	// on change.
	schedules map[string]*fsmpb.Schedule
	// slotStates holds the slots this shard does not serve because they
	// moved or are moving (OP_SLOT); every other slot is served. slotTable
	// is the slot table's size they were computed with (0 before the first
	// move).
	slotStates map[uint32]*fsmpb.SlotState
	slotTable  uint32
	// taskBytes is the taskSize sum of the tasks (budget.go): derived
	// from them, kept as they change, so that every replica holds the
	// same. Not in snapshots (a restore counts the tasks it reads) but in
	// the on-disk store's small record, which is all a reopened store
	// reads. Signed: a store written by a binary that did not count it
	// holds a wrong count until the format that uses it recounts.
	taskBytes int64

	due []string // advance's scratch space
}

// reservation keeps a deleted task's key taken in its queue, until the
// dedup window the task was inserted with ends. Immutable.
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
	if t.key == "" || t.dedupWindow() <= 0 {
		return
	}
	if s.store.keyOwner(t.q.name, t.key) != "" {
		return
	}
	s.store.putReservation(&reservation{last: t, until: addSat(s.clock, t.dedupWindow())})
}

// reservedKey returns the unexpired reservation of key in queue, if any.
func (s *state) reservedKey(queue, key string) *reservation {
	if r := s.store.reservation(queue, key); r != nil && r.until > s.clock {
		return r
	}
	return nil
}

// expireReservations drops the reservations whose window has ended.
func (s *state) expireReservations() {
	for {
		r, ok := s.store.firstReservation()
		if !ok || r.until > s.clock {
			return
		}
		s.store.dropReservation(r)
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
func (st *state) putSession(s *session) { st.store.putSession(s) }

// dropOldestSession forgets the least recently seen session.
func (st *state) dropOldestSession() { st.store.dropOldestSession() }

func newState() *state { return newStateWith(newMemStore(0)) }

func newStateWith(st store) *state {
	return &state{
		store:      st,
		paused:     make(map[string]struct{}),
		limits:     make(map[string]uint32),
		policies:   make(map[string]*fsmpb.QueuePolicy),
		schedules:  make(map[string]*fsmpb.Schedule),
		slotStates: make(map[uint32]*fsmpb.SlotState),
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
func (s *state) queueFor(name string) *queue { return s.store.queueFor(name) }

// prune removes the named queue if it holds no tasks.
func (s *state) prune(name string) { s.store.prune(name) }

// find returns the current version of the task with id in group, or nil.
func (s *state) find(group, id string) *task { return s.store.find(group, id) }

// holds reports whether a task with id exists in any group.
func (s *state) holds(id string) bool { return s.store.holds(id) }

// idTaken reports whether an insert of id into group must fail as a
// duplicate: by the state format, an id held in any group, or in this one.
func (s *state) idTaken(group, id string) bool {
	if s.format < FormatGroupIDs {
		return s.holds(id)
	}
	return s.find(group, id) != nil
}

// add inserts a task that is not in the state. t.q must be the live queue
// record for its name.
func (s *state) add(t *task) {
	s.store.add(t, s.clock)
	s.taskBytes += taskSize(t)
}

// remove takes a task out of the state. It leaves the queue record in
// place, even if empty: callers prune.
func (s *state) remove(t *task) {
	s.store.remove(t, s.clock)
	s.taskBytes -= taskSize(t)
}

// replace swaps a task for its next version (same id and group).
func (s *state) replace(old, t *task) {
	s.store.replace(old, t, s.clock)
	s.taskBytes += taskSize(t) - taskSize(old)
}

// advance moves the clock forward to now (never back). became is called
// with the queue of each task whose at has come.
func (s *state) advance(now int64, became func(queue string)) {
	if now <= s.clock {
		return
	}
	s.due = s.store.advance(s.clock, now, s.due[:0])
	for _, q := range s.due {
		became(q)
	}
	clear(s.due)
	s.clock = now
}

// isClaimed reports whether t is held under an unexpired lease.
func isClaimed(t *task, clock int64) bool { return t.claimant != "" && t.at > clock }

// stats returns q's counts at the clock, and the oldest available task's
// at.
func (s *state) stats(q *queue) QueueStats {
	st := s.counts(q)
	s.store.runs(q, func(first *task) bool {
		if first.at <= s.clock && (st.OldestAvailableAt == 0 || first.at < st.OldestAvailableAt) {
			st.OldestAvailableAt = first.at
		}
		return true
	})
	return st
}

// counts returns q's counts at the clock, without OldestAvailableAt: the
// counts are in memory, the oldest available task is a read of the state
// per priority run (on disk, a seek and a record each).
func (s *state) counts(q *queue) QueueStats {
	total := uint64(s.store.queueLen(q))
	st := QueueStats{
		Name:      q.name,
		Total:     total,
		Claimed:   q.futureClaimed,
		Delayed:   q.futureDelayed,
		Available: total - q.futureClaimed - q.futureDelayed,
	}
	return st
}

// maxRuns bounds how many priority runs a read walks (one descent each):
// queues rarely use more than a handful of priorities, and a read must not
// walk a queue whose every task has its own priority.
const maxRuns = 256

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
		DedupWindow: t.dedupWindow(),
		Headers:     t.headers(),
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
