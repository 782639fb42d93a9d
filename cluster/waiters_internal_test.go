package cluster

import (
	"sync"
	"testing"
	"time"
)

// fakeQueue stands in for the machine: avail tasks are due in every queue,
// next is the earliest at (0: none).
type fakeQueue struct {
	mu      sync.Mutex
	avail   int
	next    int64
	leading bool
}

func newTestWaiters(f *fakeQueue) *waiters {
	return &waiters{
		byQueue: make(map[string][]*waiter),
		now:     func() int64 { return time.Now().UnixNano() },
		available: func(_ string, _ int64, limit int) int {
			f.mu.Lock()
			defer f.mu.Unlock()
			return min(f.avail, limit)
		},
		nextAt: func([]string) (int64, bool) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.next, f.next != 0
		},
		leading: func() bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.leading
		},
	}
}

func (f *fakeQueue) set(avail int, next int64) {
	f.mu.Lock()
	f.avail, f.next = avail, next
	f.mu.Unlock()
}

func woken(w *waiter) bool {
	select {
	case <-w.ch:
		return true
	default:
		return false
	}
}

// wokenOnes returns which of ws received a wake-up (and consumes them).
func wokenOnes(ws ...*waiter) []int {
	var out []int
	for i, w := range ws {
		if woken(w) {
			out = append(out, i)
		}
	}
	return out
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestWaitersWakeAsManyAsTasksInArrivalOrder: one due task wakes the oldest
// parked waiter only; a woken waiter whose claim found nothing parks again
// in its place (it is the one woken next time); one that leaves woken hands
// its wake-up to the next in line.
func TestWaitersWakeAsManyAsTasksInArrivalOrder(t *testing.T) {
	f := &fakeQueue{leading: true}
	ws := newTestWaiters(f)
	q := []string{"g/q"}
	var all []*waiter
	for range 5 {
		w := ws.add(q, 1)
		ws.park(w) // the first claim found nothing
		all = append(all, w)
	}
	if got := wokenOnes(all...); len(got) != 0 {
		t.Fatalf("woken with nothing due: %v", got)
	}

	f.set(1, 0)
	ws.notify(q)
	if got := wokenOnes(all...); !equalInts(got, []int{0}) {
		t.Fatalf("one task woke %v, want [0]", got)
	}
	// Another commit in the queue with the task still due and w0's claim on
	// its way wakes nobody else.
	ws.notify(q)
	if got := wokenOnes(all...); len(got) != 0 {
		t.Fatalf("a covered task woke %v", got)
	}
	// Another claim took the task: w0 found nothing and parks in place.
	f.set(0, 0)
	ws.park(all[0])
	f.set(2, 0)
	ws.notify(q)
	if got := wokenOnes(all...); !equalInts(got, []int{0, 1}) {
		t.Fatalf("two tasks woke %v, want [0 1]", got)
	}
	// w0 claimed one (and leaves), w1's wait ran out before it proposed:
	// its wake-up passes on to w2 for the task still due.
	f.set(1, 0)
	ws.leave(all[0])
	if got := wokenOnes(all...); len(got) != 0 {
		t.Fatalf("w0 leaving woke %v while w1 covers the task", got)
	}
	ws.leave(all[1])
	if got := wokenOnes(all...); !equalInts(got, []int{2}) {
		t.Fatalf("w1 leaving woke %v, want [2]", got)
	}
	// A waiter that leaves parked (its wait ran out) wakes nobody.
	ws.leave(all[4])
	if got := wokenOnes(all...); len(got) != 0 {
		t.Fatalf("a parked waiter leaving woke %v", got)
	}
	if n := ws.count(); n != 2 {
		t.Fatalf("%d waiters, want 2", n)
	}
}

// TestWaitersLimitCoversSeveralTasks: a waiter that claims up to k tasks
// covers k of them.
func TestWaitersLimitCoversSeveralTasks(t *testing.T) {
	f := &fakeQueue{leading: true}
	ws := newTestWaiters(f)
	q := []string{"g/q"}
	a, b, c := ws.add(q, 3), ws.add(q, 1), ws.add(q, 1)
	for _, w := range []*waiter{a, b, c} {
		ws.park(w)
	}
	f.set(4, 0)
	ws.notify(q)
	if got := wokenOnes(a, b, c); !equalInts(got, []int{0, 1}) {
		t.Fatalf("4 tasks woke %v, want [0 1]", got)
	}
}

// TestWaitersTimerWakesWhenDue: with no commit at all, the earliest delay or
// lease of the waited queues running out wakes one waiter, not all.
func TestWaitersTimerWakesWhenDue(t *testing.T) {
	f := &fakeQueue{leading: true}
	ws := newTestWaiters(f)
	defer ws.close()
	q := []string{"g/q"}
	var all []*waiter
	f.set(0, time.Now().Add(50*time.Millisecond).UnixNano())
	for range 3 {
		w := ws.add(q, 1)
		ws.park(w)
		all = append(all, w)
	}
	time.Sleep(10 * time.Millisecond)
	if got := wokenOnes(all...); len(got) != 0 {
		t.Fatalf("woken before anything was due: %v", got)
	}
	f.set(1, time.Now().Add(-time.Millisecond).UnixNano()) // due now
	select {
	case <-all[0].ch:
	case <-time.After(5 * time.Second):
		t.Fatal("the timer did not wake the first waiter")
	}
	time.Sleep(20 * time.Millisecond)
	if got := wokenOnes(all[1:]...); len(got) != 0 {
		t.Fatalf("the timer woke %v too", got)
	}
}

// TestWaitersNotLeadingWakesAll: a replica that does not lead wakes every
// waiter, so that their claims go to the leader.
func TestWaitersNotLeadingWakesAll(t *testing.T) {
	f := &fakeQueue{leading: true}
	ws := newTestWaiters(f)
	q := []string{"g/q"}
	a, b := ws.add(q, 1), ws.add(q, 1)
	ws.park(a)
	ws.park(b)
	ws.wakeAll()
	if got := wokenOnes(a, b); !equalInts(got, []int{0, 1}) {
		t.Fatalf("wakeAll woke %v", got)
	}
	ws.park(a)
	ws.park(b)
	f.mu.Lock()
	f.leading = false
	f.mu.Unlock()
	ws.notify(q)
	if got := wokenOnes(a, b); !equalInts(got, []int{0, 1}) {
		t.Fatalf("a follower's notify woke %v", got)
	}
}
