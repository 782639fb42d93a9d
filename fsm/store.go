package fsm

import "github.com/e1158ecb/taskstore/fsm/fsmpb"

// store holds what grows with the tasks and the clients: the tasks with
// their indexes, the exactly-once sessions and the key reservations. The
// rest of the state (clock, format, pauses, limits, schedules, slot states)
// is small and stays in state. memStore keeps everything in memory; the
// on-disk state (fsm/ondisk/DESIGN.md) implements the same
// operations over Pebble, so that one applier serves both.
//
// Tasks cross it as *task values: a store may hand out the version it holds
// (memStore) or one decoded for the call, and callers never modify a task
// they got (a change builds a new version). A task's q is the queue record
// that queue and queueFor return for its queue. Where the store's indexes
// depend on the clock (a task due in the future, a reservation's end), the
// caller passes the state's clock.
type store interface {
	// find returns group's task with id, or nil.
	find(group, id string) *task
	// prefetch says find will be asked for the tasks a Modify names: a
	// store on disk reads them together.
	prefetch(m *fsmpb.Modify)
	// withID calls fn with every group's task with id, while fn returns
	// true (reads by id alone).
	withID(id string, fn func(*task) bool)
	// holds reports whether any group holds a task with id.
	holds(id string) bool
	// count is how many tasks the store holds.
	count() int

	// queue returns the record of a queue that holds tasks, or nil. A
	// queue's record is the same *queue from its creation until it is
	// pruned or purged (callers compare records, and keep counts in them).
	queue(name string) *queue
	// queueFor returns the queue's record, creating it; a created queue
	// that stays empty is removed by prune.
	queueFor(name string) *queue
	// prune removes the queue's record if it holds no tasks.
	prune(name string)
	// ascendQueues calls fn with the queues that hold tasks (or were
	// created and not pruned), by name from the first at or after from.
	ascendQueues(from string, fn func(*queue) bool)
	// queueLen is how many tasks q holds.
	queueLen(q *queue) int
	// ascendQueue calls fn with q's tasks in claim order, from the first
	// at or after from (nil: the first), while fn returns true.
	ascendQueue(q *queue, from *task, fn func(*task) bool)
	// keyOwner returns the id of the task holding key in queue, or "".
	keyOwner(queue, key string) string
	// available appends to out up to limit tasks of q with at <= clock, in
	// claim order.
	available(q *queue, clock int64, limit int, out []*task) []*task
	// runs calls visit with the first task of each priority run of q,
	// highest first, for at most maxRuns runs; it reports whether it saw
	// them all.
	runs(q *queue, visit func(first *task) bool) bool

	// add stores t, which the store does not hold (t.q set).
	add(t *task, clock int64)
	// remove takes t, as the store holds it, out; the queue's record stays
	// until pruned.
	remove(t *task, clock int64)
	// replace swaps old for t, its next version (same id and group).
	replace(old, t *task, clock int64)
	// purge removes every task of q and its record, returning how many it
	// held, their taskSize sum, and those with a key and a dedup window
	// (to reserve).
	purge(q *queue, clock int64) (n int, size int64, keyed []*task)
	// advance moves the store's due tasks from clock to now: tasks with
	// clock < at <= now leave the future counts, and the queue of each is
	// appended to became (a slice, not a callback: a callback through an
	// interface is a heap allocation per command).
	advance(clock, now int64, became []string) []string
	// nextDue returns the due task with the smallest at, if any.
	nextDue() (*task, bool)

	// session returns the client's session, or nil.
	session(clientID string) *session
	// putSession stores s, replacing the client's earlier one.
	putSession(s *session)
	// oldestSeen is when the least recently seen session was last seen
	// (ok false: there is none). Expiry reads it every command, so it
	// reads no session's answer.
	oldestSeen() (lastSeen int64, ok bool)
	// seenSince is a time no session was last seen before (the oldest's
	// last-seen time or earlier), if the store knows one without a read:
	// expiry asks it first, and reads the oldest only when it may be due.
	seenSince() (since int64, known bool)
	// dropOldestSession forgets the least recently seen session.
	dropOldestSession()
	// sessionCount and sessionBytes count the sessions and their sizes.
	sessionCount() int
	sessionBytes() uint64
	// ascendSessions calls fn with the sessions, least recently seen
	// first, while fn returns true.
	ascendSessions(fn func(*session) bool)

	// reservation returns the reservation of key in queue, expired or not,
	// or nil.
	reservation(queue, key string) *reservation
	// putReservation stores r, replacing the key's earlier one.
	putReservation(r *reservation)
	// firstReservation returns the reservation that ends soonest.
	firstReservation() (*reservation, bool)
	// dropReservation removes r.
	dropReservation(r *reservation)
	// ascendReservations calls fn with the reservations, soonest end first,
	// while fn returns true.
	ascendReservations(fn func(*reservation) bool)
	// reservationCount is how many reservations the store holds.
	reservationCount() int
}
