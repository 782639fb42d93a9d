package ondisk

import (
	"bytes"
	"fmt"
	"math"

	"github.com/cockroachdb/pebble/v2"
)

// Claimable calls fn with the queue's available tasks (at <= clock) in
// claim order (priority descending, at, id) while fn returns true. fn may
// not change the transaction; collect, then change.
func (t *Txn) Claimable(queue string, fn func(id string, tk *Task) bool) error {
	return t.ClaimableAt(queue, t.meta.clock, fn)
}

// ClaimableAt is Claimable at another clock: the tasks with at <= clock
// (a read that asks what a claim stamped later would find).
func (t *Txn) ClaimableAt(queue string, clock int64, fn func(id string, tk *Task) bool) error {
	q := t.queue(queue, false)
	if q == nil {
		return nil
	}
	if ok, err := t.claimableHead(q, clock, fn); ok {
		return err
	}
	from := q.head
	if from == nil {
		from = ClaimPrefix(t.s.shard, q.num)
	}
	return t.claimableDisk(q, from, clock, fn)
}

// claimableDisk is ClaimableAt through the claim index, from the key from
// on: the queue's head (every key below it deleted), or a key past the
// head in memory.
func (t *Txn) claimableDisk(q *queueInfo, from []byte, clock int64, fn func(id string, tk *Task) bool) error {
	it, err := t.r.NewIter(&pebble.IterOptions{LowerBound: ClaimPrefix(t.s.shard, q.num), UpperBound: ClaimPrefix(t.s.shard, q.num+1)})
	if err != nil {
		return err
	}
	defer it.Close()
	first := q.cache == nil || len(q.cache.entries) == 0
	for ok := it.SeekGE(from); ok; {
		k := it.Key()
		if first {
			// Everything of the queue below the first live key is gone:
			// the next claim starts here (DESIGN.md, "Queue heads").
			q.head, first = bytes.Clone(k), false
		}
		_, _, prio, at, id, err := ParseClaimKey(k)
		if err != nil {
			return err
		}
		if at > clock {
			// The rest of this priority is in the future: go to the next.
			if prio == -1<<31 {
				return nil
			}
			ok = it.SeekGE(ClaimPriority(t.s.shard, q.num, prio-1))
			continue
		}
		tk, err := t.get(GroupOf(q.name), id, true)
		if err != nil {
			return err
		}
		if tk == nil {
			return errNoTask(t, id)
		}
		if !fn(id, tk) {
			return nil
		}
		ok = it.Next()
	}
	return it.Error()
}

// Advance moves the clock forward to now (never back); tasks that come
// due leave the due index and their queues' future counts, and became is
// called with each one's queue, id and at, in at order.
func (t *Txn) Advance(now int64, became func(queue, id string, at int64)) error {
	if now <= t.meta.clock {
		return nil
	}
	t.meta.clock = now
	if t.dueKnown && now < t.dueAt {
		return nil // nothing is due before dueAt
	}
	t.dueAt, t.dueKnown = math.MaxInt64, true // unless a later key says otherwise
	lo := tableKey(t.s.shard, TableDue, 0)
	from := t.dueHead
	if from == nil {
		from = lo
	}
	it, err := t.r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: tableKey(t.s.shard, TableDue+1, 0)})
	if err != nil {
		return err
	}
	var due [][]byte
	for ok := it.SeekGE(from); ok; ok = it.Next() {
		_, at, _, _, err := ParseDueKey(it.Key())
		if err != nil {
			it.Close()
			return err
		}
		if at > now {
			t.dueHead = bytes.Clone(it.Key())
			t.dueAt = at
			break
		}
		due = append(due, bytes.Clone(it.Key()))
	}
	if len(due) > 0 && (t.dueHead == nil || bytes.Compare(t.dueHead, due[len(due)-1]) <= 0) {
		t.dueHead = due[len(due)-1] // all came due: nothing live below the last
	}
	if err := it.Close(); err != nil {
		return err
	}
	for _, k := range due {
		_, at, num, id, _ := ParseDueKey(k)
		q, err := t.queueByNum(num)
		if err != nil {
			return err
		}
		tk, err := t.get(GroupOf(q.name), id, false)
		if err != nil {
			return err
		}
		if tk == nil {
			return fmt.Errorf("ondisk: shard %d: due key of %q has no task", t.s.shard, id)
		}
		if tk.Claimant != "" {
			q.claimed--
		} else {
			q.delayed--
		}
		if err := t.b.Delete(k, nil); err != nil {
			return err
		}
		became(q.name, id, at)
	}
	return nil
}
