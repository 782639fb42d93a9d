package cluster

import (
	"sync"
	"time"
)

// waiters are the claims parked on a shard's leader, per queue in arrival
// order. The leader wakes only as many of them as there are tasks to take
// (waking all of them made every insert cost one log entry
// per parked claim), first come first served:
//
//   - A waiter is woken (w.woken) while it has a claim to propose: from
//     registration until its first claim comes back, and again from the
//     moment the leader wakes it. A parked waiter is not woken.
//   - After any commit that may have made tasks available in a queue
//     (OnAvailable), after a woken waiter parks again or leaves, and when
//     the earliest delay or lease in the waited queues runs out (one timer
//     per shard), the leader reconciles the queue: it counts the tasks a
//     claim stamped now would find (fsm.Machine.Available, up to what the
//     waiters could take) and wakes parked waiters, oldest first, until the
//     woken ones' limits cover them.
//   - A woken waiter whose claim found nothing (another claim took the
//     task) parks again in the place it had. One that leaves woken (it
//     claimed, or its wait or context ended before it proposed) hands its
//     wake-up on: the queue is reconciled again.
//
// So a task that is available while claims wait on its queue always has a
// woken waiter that will propose for it, and a wake-up is never lost; the
// cost of a stale count is a claim that comes back empty, never a missed
// task. A replica that does not lead wakes every waiter: their claims answer
// "not leader" and the callers go to the new leader.
type waiters struct {
	mu      sync.Mutex // guards everything below
	seq     uint64
	byQueue map[string][]*waiter // by arrival (seq)
	n       int                  // registered waiters
	closed  bool
	timer   *time.Timer // fires at timerAt (log time), generation gen
	timerAt int64
	gen     uint64

	// now is the leader's log time (Shard.Now); available counts, up to
	// limit, the tasks of a queue a claim stamped now would take; nextAt is
	// the earliest at among the queues' tasks (fsm.Machine.NextAt); leading
	// reports whether this replica leads. All may take the machine's read
	// lock: they are called with mu held, never with the machine locked.
	now       func() int64
	available func(queue string, now int64, limit int) int
	nextAt    func(queues []string) (int64, bool)
	leading   func() bool
}

type waiter struct {
	seq    uint64
	queues []string
	limit  int           // tasks one claim of this waiter takes at most
	ch     chan struct{} // a wake-up, buffered 1
	woken  bool          // guarded by waiters.mu
}

// recheckDue is how long the timer waits when the earliest task of the
// waited queues is already due: a woken waiter's claim is on its way, and
// its outcome reconciles again; this only bounds how long a count that
// NextAt could not see (fsm.nextAtUnseen) waits.
const recheckDue = 100 * time.Millisecond

// add registers a claim about to be proposed, woken (it proposes at once),
// behind every waiter already registered.
func (ws *waiters) add(queues []string, limit int) *waiter {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.seq++
	w := &waiter{seq: ws.seq, queues: queues, limit: max(limit, 1), ch: make(chan struct{}, 1), woken: true}
	for _, q := range queues {
		if l := ws.byQueue[q]; len(l) == 0 || l[len(l)-1] != w { // a queue named twice is one place
			ws.byQueue[q] = append(l, w)
		}
	}
	ws.n++
	return w
}

// park puts a woken waiter whose claim found nothing back to waiting, in the
// place it had. If tasks are due it may be woken again at once (w.ch).
func (ws *waiters) park(w *waiter) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	select {
	case <-w.ch: // a wake-up for the claim that just came back
	default:
	}
	w.woken = false
	ws.reconcileLocked(w.queues)
}

// leave unregisters w; a woken waiter's wake-up passes to the next in line.
func (ws *waiters) leave(w *waiter) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, q := range w.queues {
		l := ws.byQueue[q]
		for i, x := range l {
			if x == w {
				l = append(l[:i], l[i+1:]...)
				break
			}
		}
		if len(l) == 0 {
			delete(ws.byQueue, q)
		} else {
			ws.byQueue[q] = l
		}
	}
	ws.n--
	if ws.n == 0 {
		ws.stopTimerLocked()
		return
	}
	if w.woken {
		ws.reconcileLocked(w.queues)
	}
}

// notify runs on the apply goroutine after a commit that may have made tasks
// available in queues (fsm.Options.OnAvailable). It must not block: it
// takes the machine's read lock, never waits for a claim.
func (ws *waiters) notify(queues []string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if len(ws.byQueue) == 0 {
		return
	}
	ws.reconcileLocked(queues)
}

// wakeAll wakes every waiter (leadership lost: their claims answer "not
// leader").
func (ws *waiters) wakeAll() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, l := range ws.byQueue {
		for _, w := range l {
			ws.wakeLocked(w)
		}
	}
}

// close stops the timer for good.
func (ws *waiters) close() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.closed = true
	ws.stopTimerLocked()
}

// count is the number of registered waiters.
func (ws *waiters) count() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.n
}

func (ws *waiters) wakeLocked(w *waiter) {
	w.woken = true
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// reconcileLocked wakes, in each of queues, parked waiters oldest first
// until the woken ones can take every task due now, then sets the timer for
// the earliest task of queues not yet due.
func (ws *waiters) reconcileLocked(queues []string) {
	var waited []string
	for _, q := range queues {
		if len(ws.byQueue[q]) > 0 {
			waited = append(waited, q)
		}
	}
	if len(waited) == 0 {
		return
	}
	now, leading := ws.now(), ws.leading()
	for _, q := range waited {
		l := ws.byQueue[q]
		if !leading {
			for _, w := range l {
				ws.wakeLocked(w)
			}
			continue
		}
		total, have := 0, 0
		for _, w := range l {
			total += w.limit
			if w.woken {
				have += w.limit
			}
		}
		if have >= total {
			continue // every waiter already has a claim on its way
		}
		need := ws.available(q, now, total)
		for _, w := range l {
			if have >= need {
				break
			}
			if !w.woken {
				ws.wakeLocked(w)
				have += w.limit
			}
		}
	}
	ws.armLocked(waited, now)
}

// armLocked makes the timer fire no later than the earliest at among
// queues' tasks (a delay or a lease running out), so that the waiters are
// reconciled then even if no commit comes.
func (ws *waiters) armLocked(queues []string, now int64) {
	if ws.closed || ws.n == 0 {
		return
	}
	at, ok := ws.nextAt(queues)
	if !ok {
		return
	}
	if at <= now {
		at = now + int64(recheckDue)
	}
	if ws.timer != nil && ws.timerAt <= at {
		return
	}
	ws.stopTimerLocked()
	ws.gen++
	gen := ws.gen
	ws.timerAt = at
	ws.timer = time.AfterFunc(time.Duration(at-now), func() { ws.fire(gen) })
}

func (ws *waiters) stopTimerLocked() {
	if ws.timer != nil {
		ws.timer.Stop()
		ws.timer = nil
	}
}

// fire reconciles every waited queue when the timer runs out.
func (ws *waiters) fire(gen uint64) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if gen != ws.gen || ws.timer == nil {
		return // stopped or replaced
	}
	ws.timer = nil
	queues := make([]string, 0, len(ws.byQueue))
	for q := range ws.byQueue {
		queues = append(queues, q)
	}
	ws.reconcileLocked(queues)
}
