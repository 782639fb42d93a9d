package fsm

import (
	"sync"

	"github.com/google/btree"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// memStore is the store in memory: every task once in the id map and in
// its queue's claim-ordered tree, tasks due in the future once more in
// pending, sessions and reservations in a map and an ordered tree each.
// It hands out the versions it holds, which are immutable: that is what
// makes a snapshot a copy of pointers.
type memStore struct {
	tasks  map[string]*slot // id → its current version (a chain: see slot)
	ntasks int              // tasks held (ids may repeat across groups)
	queues map[string]*queue
	names  *btree.BTreeG[*queue] // queues by name, for prefix listing
	// pending holds every task with at > clock, in at order, so that
	// advancing the clock finds exactly the tasks that became available.
	pending       *btree.BTreeG[*task]
	sessions      map[string]*session
	sessionOrder  *btree.BTreeG[*session] // least recently seen first
	sessionSize   uint64                  // sum of the sessions' sizes
	reserved      map[queueKey]*reservation
	reservedOrder *btree.BTreeG[*reservation] // soonest end first
	// cloneMu serialises view: a btree's Clone changes the tree it
	// clones (its copy-on-write context), and snapshots are taken under
	// the machine's read lock, several at once.
	cloneMu sync.Mutex
}

// memView is a copy of the store's ordered trees that the store's changes
// do not reach: each queue's claim order (queues by name), the sessions
// and the reservations. Taking it costs a step per queue, not per task:
// google/btree's Clone shares the tree's nodes, and whichever side changes
// a shared node first copies it (so the store's next writes pay a node
// copy each, once, along the paths they touch). The view is read while
// the store goes on changing, and needs no release: the garbage collector
// takes the nodes only it holds.
type memView struct {
	queues   []*btree.BTreeG[*task]
	sessions *btree.BTreeG[*session]
	reserved *btree.BTreeG[*reservation]
	ntasks   int
}

// view takes a memView. The caller holds the machine's lock (read or
// write): no change runs meanwhile.
func (s *memStore) view() *memView {
	s.cloneMu.Lock()
	defer s.cloneMu.Unlock()
	v := &memView{queues: make([]*btree.BTreeG[*task], 0, len(s.queues))}
	s.names.Ascend(func(q *queue) bool {
		if q.byClaim.Len() > 0 {
			v.queues = append(v.queues, q.byClaim.Clone())
			v.ntasks += q.byClaim.Len()
		}
		return true
	})
	v.sessions = s.sessionOrder.Clone()
	v.reserved = s.reservedOrder.Clone()
	return v
}

// stream is the view as a snapshot's records, in the order state.snapshot
// lists them.
func (v *memView) stream() *snapshotStream {
	return &snapshotStream{
		tasks: uint64(v.ntasks), sessions: uint64(v.sessions.Len()), reserved: uint64(v.reserved.Len()),
		eachTask: func(fn func(*task) error) error {
			var err error
			for _, q := range v.queues {
				q.Ascend(func(t *task) bool {
					err = fn(t)
					return err == nil
				})
				if err != nil {
					return err
				}
			}
			return nil
		},
		eachSession: func(fn func(*session) error) error {
			var err error
			v.sessions.Ascend(func(ss *session) bool {
				err = fn(ss)
				return err == nil
			})
			return err
		},
		eachReserved: func(fn func(*reservation) error) error {
			var err error
			v.reserved.Ascend(func(r *reservation) bool {
				err = fn(r)
				return err == nil
			})
			return err
		},
	}
}

var _ store = (*memStore)(nil)

// newMemStore returns an empty store; tasks sizes its id map.
func newMemStore(tasks int) *memStore {
	return &memStore{
		tasks:         make(map[string]*slot, tasks),
		queues:        make(map[string]*queue),
		names:         btree.NewG(btreeDegree, queueLess),
		pending:       btree.NewG(btreeDegree, atLess),
		sessions:      make(map[string]*session),
		sessionOrder:  btree.NewG(btreeDegree, sessionLess),
		reserved:      make(map[queueKey]*reservation),
		reservedOrder: btree.NewG(btreeDegree, reservationLess),
	}
}

func (s *memStore) prefetch(*fsmpb.Modify) {}

func (s *memStore) find(group, id string) *task {
	for sl := s.tasks[id]; sl != nil; sl = sl.next {
		if sl.t.q.group == group {
			return sl.t
		}
	}
	return nil
}

func (s *memStore) withID(id string, fn func(*task) bool) {
	for sl := s.tasks[id]; sl != nil; sl = sl.next {
		if !fn(sl.t) {
			return
		}
	}
}

func (s *memStore) holds(id string) bool { return s.tasks[id] != nil }

func (s *memStore) count() int { return s.ntasks }

func (s *memStore) queue(name string) *queue { return s.queues[name] }

func (s *memStore) queueFor(name string) *queue {
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

func (s *memStore) prune(name string) {
	if q := s.queues[name]; q != nil && q.byClaim.Len() == 0 {
		delete(s.queues, name)
		s.names.Delete(q)
	}
}

func (s *memStore) ascendQueues(from string, fn func(*queue) bool) {
	if from == "" {
		s.names.Ascend(fn)
		return
	}
	s.names.AscendGreaterOrEqual(&queue{name: from}, fn)
}

func (s *memStore) queueLen(q *queue) int { return q.byClaim.Len() }

func (s *memStore) ascendQueue(q *queue, from *task, fn func(*task) bool) {
	if from == nil {
		q.byClaim.Ascend(fn)
		return
	}
	q.byClaim.AscendGreaterOrEqual(from, fn)
}

func (s *memStore) keyOwner(queue, key string) string {
	if q := s.queues[queue]; q != nil {
		return q.keys[key]
	}
	return ""
}

// available: within a priority the tasks are in at order, so the first one
// not yet due ends that priority: the search jumps to the next lower
// priority, costing one descent per priority that holds future tasks.
func (s *memStore) available(q *queue, clock int64, limit int, out []*task) []*task {
	n := 0
	var from *task
	for n < limit {
		var stop *task
		visit := func(t *task) bool {
			if t.at > clock {
				stop = t
				return false
			}
			out = append(out, t)
			n++
			return n < limit
		}
		if from == nil {
			q.byClaim.Ascend(visit)
		} else {
			q.byClaim.AscendGreaterOrEqual(from, visit)
		}
		if from = belowPriority(stop); from == nil {
			break
		}
	}
	return out
}

// runs: within a run tasks are in at order, so the first is the run's
// smallest at; each run costs one descent.
func (s *memStore) runs(q *queue, visit func(first *task) bool) (all bool) {
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

// add: a new version of a removed task (t.slot set, copied from the old
// version) takes its old slot.
func (s *memStore) add(t *task, clock int64) {
	if t.slot == nil {
		t.slot = &slot{}
	}
	t.slot.t = t
	t.slot.next = s.tasks[t.id]
	s.tasks[t.id] = t.slot
	s.ntasks++
	s.index(t, clock)
}

// unlink takes t's slot out of the id map.
func (s *memStore) unlink(t *task) {
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
func (s *memStore) index(t *task, clock int64) {
	q := t.q
	q.byClaim.ReplaceOrInsert(t)
	if t.key != "" {
		if q.keys == nil {
			q.keys = make(map[string]string)
		}
		q.keys[t.key] = t.id
	}
	if t.at > clock {
		s.pending.ReplaceOrInsert(t)
		if t.claimant != "" {
			q.futureClaimed++
		} else {
			q.futureDelayed++
		}
	}
}

func (s *memStore) remove(t *task, clock int64) {
	s.unindex(t, clock)
	s.unlink(t)
}

// unindex takes a task out of every index but the id map.
func (s *memStore) unindex(t *task, clock int64) {
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
	if t.at > clock {
		s.pending.Delete(t)
		if t.claimant != "" {
			q.futureClaimed--
		} else {
			q.futureDelayed--
		}
	}
}

// replace: t has the same id and, copied from old, the same slot: the id
// map is not written.
func (s *memStore) replace(old, t *task, clock int64) {
	s.unindex(old, clock)
	t.slot.t = t
	s.index(t, clock)
}

func (s *memStore) purge(q *queue, clock int64) (int, int64, []*task) {
	n := q.byClaim.Len()
	var keyed []*task
	var size int64
	q.byClaim.Ascend(func(t *task) bool {
		size += taskSize(t)
		s.unlink(t)
		if t.key != "" && t.dedupWindow() > 0 {
			keyed = append(keyed, t)
		}
		if t.at > clock {
			s.pending.Delete(t)
		}
		return true
	})
	delete(s.queues, q.name)
	s.names.Delete(q)
	return n, size, keyed
}

func (s *memStore) advance(clock, now int64, became []string) []string {
	for {
		t, ok := s.pending.Min()
		if !ok || t.at > now {
			return became
		}
		s.pending.DeleteMin()
		if t.claimant != "" {
			t.q.futureClaimed--
		} else {
			t.q.futureDelayed--
		}
		became = append(became, t.q.name)
	}
}

func (s *memStore) nextDue() (*task, bool) { return s.pending.Min() }

func (s *memStore) session(clientID string) *session { return s.sessions[clientID] }

// putSession: sessions are immutable (snapshots share them).
func (s *memStore) putSession(ss *session) {
	if old := s.sessions[ss.clientID]; old != nil {
		s.sessionOrder.Delete(old)
		s.sessionSize -= old.size
	}
	s.sessions[ss.clientID] = ss
	s.sessionOrder.ReplaceOrInsert(ss)
	s.sessionSize += ss.size
}

func (s *memStore) oldestSeen() (int64, bool) {
	ss, ok := s.sessionOrder.Min()
	if !ok {
		return 0, false
	}
	return ss.lastSeen, true
}

func (s *memStore) seenSince() (int64, bool) { return s.oldestSeen() }

func (s *memStore) dropOldestSession() {
	ss, ok := s.sessionOrder.DeleteMin()
	if !ok {
		return
	}
	delete(s.sessions, ss.clientID)
	s.sessionSize -= ss.size
}

func (s *memStore) sessionCount() int    { return len(s.sessions) }
func (s *memStore) sessionBytes() uint64 { return s.sessionSize }

func (s *memStore) ascendSessions(fn func(*session) bool) { s.sessionOrder.Ascend(fn) }

func (s *memStore) reservation(queue, key string) *reservation {
	return s.reserved[queueKey{queue, key}]
}

func (s *memStore) putReservation(r *reservation) {
	k := queueKey{r.last.q.name, r.last.key}
	if old := s.reserved[k]; old != nil {
		s.reservedOrder.Delete(old)
	}
	s.reserved[k] = r
	s.reservedOrder.ReplaceOrInsert(r)
}

func (s *memStore) firstReservation() (*reservation, bool) { return s.reservedOrder.Min() }

func (s *memStore) dropReservation(r *reservation) {
	k := queueKey{r.last.q.name, r.last.key}
	if s.reserved[k] == r {
		delete(s.reserved, k)
	}
	s.reservedOrder.Delete(r)
}

func (s *memStore) ascendReservations(fn func(*reservation) bool) { s.reservedOrder.Ascend(fn) }

func (s *memStore) reservationCount() int { return len(s.reserved) }
