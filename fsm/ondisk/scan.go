package ondisk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Reads the fsm's store needs besides a claim (Claimable): a queue in
// claim order from a position, the first task of each priority, the next
// task to come due, the sessions in order, and counts.

// ClaimPos is a position in a queue's claim order: the first task at or
// after it.
type ClaimPos struct {
	Priority int32
	At       int64
	ID       string
}

// TaskCount is how many tasks the transaction sees.
func (t *Txn) TaskCount() uint64 { return t.meta.tasks }

// QueueCounts returns a queue's counts as the transaction sees them: its
// tasks, and those with at past the clock with and without a claimant. ok
// is false for a queue the shard has no record of.
func (t *Txn) QueueCounts(queue string) (total, claimed, delayed uint64, ok bool) {
	q := t.dirty[queue]
	if q == nil && !t.view {
		q = t.s.queues[queue]
	}
	if q == nil {
		return 0, 0, 0, false
	}
	return q.total, q.claimed, q.delayed, true
}

// AscendQueue calls fn with the queue's tasks in claim order, from the
// first at or after from (nil: the first), while fn returns true. fn may
// not change the transaction.
func (t *Txn) AscendQueue(queue string, from *ClaimPos, fn func(id string, tk *Task) bool) error {
	q := t.queue(queue, false)
	if q == nil {
		return nil
	}
	lo := ClaimPrefix(t.s.shard, q.num)
	start := lo
	if from != nil {
		start = ClaimKey(t.s.shard, q.num, from.Priority, from.At, from.ID)
	} else if q.head != nil {
		start = q.head
	}
	it, err := t.r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: ClaimPrefix(t.s.shard, q.num+1)})
	if err != nil {
		return err
	}
	defer it.Close()
	group := GroupOf(queue)
	for ok := it.SeekGE(start); ok; ok = it.Next() {
		_, _, _, _, id, err := ParseClaimKey(it.Key())
		if err != nil {
			return err
		}
		tk, err := t.get(group, id, false)
		if err != nil {
			return err
		}
		if tk == nil {
			return fmt.Errorf("ondisk: shard %d: claim key of %q has no task", t.s.shard, id)
		}
		if !fn(id, tk) {
			return nil
		}
	}
	return it.Error()
}

// Runs calls fn with the first task of each priority of the queue, highest
// first, for at most max priorities, while fn returns true; all reports
// whether it saw every priority.
func (t *Txn) Runs(queue string, max int, fn func(id string, tk *Task) bool) (all bool, err error) {
	q := t.queue(queue, false)
	if q == nil {
		return true, nil
	}
	lo := ClaimPrefix(t.s.shard, q.num)
	start := lo
	if q.head != nil {
		start = q.head
	}
	it, err := t.r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: ClaimPrefix(t.s.shard, q.num+1)})
	if err != nil {
		return false, err
	}
	defer it.Close()
	group := GroupOf(queue)
	ok := it.SeekGE(start)
	for n := 0; ok; n++ {
		if n == max {
			return false, nil
		}
		_, _, prio, _, id, err := ParseClaimKey(it.Key())
		if err != nil {
			return false, err
		}
		tk, err := t.get(group, id, false)
		if err != nil {
			return false, err
		}
		if tk == nil {
			return false, fmt.Errorf("ondisk: shard %d: claim key of %q has no task", t.s.shard, id)
		}
		if !fn(id, tk) || prio == -1<<31 {
			return true, nil
		}
		ok = it.SeekGE(ClaimPriority(t.s.shard, q.num, prio-1))
	}
	return true, it.Error()
}

// FirstDue returns the task with the smallest at past the clock (ties by
// queue number and id), and its queue; ok is false when none is.
func (t *Txn) FirstDue() (queue, id string, tk *Task, ok bool, err error) {
	lo := tableKey(t.s.shard, TableDue, 0)
	from := t.dueHead
	if from == nil {
		from = lo
	}
	it, err := t.r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: tableKey(t.s.shard, TableDue+1, 0)})
	if err != nil {
		return "", "", nil, false, err
	}
	defer it.Close()
	if !it.SeekGE(from) {
		return "", "", nil, false, it.Error()
	}
	_, _, num, id, err := ParseDueKey(it.Key())
	if err != nil {
		return "", "", nil, false, err
	}
	q, err := t.queueByNum(num)
	if err != nil {
		return "", "", nil, false, err
	}
	tk, err = t.Get(GroupOf(q.name), id)
	if err != nil {
		return "", "", nil, false, err
	}
	if tk == nil {
		return "", "", nil, false, fmt.Errorf("ondisk: shard %d: due key of %q has no task", t.s.shard, id)
	}
	return q.name, id, tk, true, nil
}

// AscendSessions calls fn with the sessions, least recently seen first
// (ties by client id), while fn returns true. fn may not change the
// transaction.
func (t *Txn) AscendSessions(fn func(client string, s *Session) bool) error {
	var err error
	t.order.Ascend(func(o sessionAt) bool {
		var s *Session
		if s, err = t.Session(o.client); err != nil {
			return false
		}
		if s == nil {
			err = fmt.Errorf("ondisk: shard %d: session %q in the order has no record", t.s.shard, o.client)
			return false
		}
		return fn(o.client, s)
	})
	return err
}

// QueueNames calls fn with the name of every queue the shard has a record
// of, in name order, from the first at or after from.
func (s *State) QueueNames(from string, fn func(name string) bool) error {
	if err := s.commitPending(); err != nil { // it reads the engine
		return err
	}
	prefix := QueueKey(s.shard, "")
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: tableKey(s.shard, TableQueue+1, 0)})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.SeekGE(QueueKey(s.shard, from)); ok; ok = it.Next() {
		if !fn(string(bytes.Clone(it.Key()[len(prefix):]))) {
			return nil
		}
	}
	return it.Error()
}

// AscendTasks calls fn with every task of a view, in the task table's
// order (by id), while fn returns true: one sequential read, where
// AscendQueue looks each task up by its claim key. A backup's copy of a
// shard reads its tasks so. Only a view may: it holds no writes of its own.
// tk is the same record for every call, rewritten each time, and its Value
// is the engine's buffer: both are valid only during the call (a copy
// encodes each task at once, with no allocation for either).
func (t *Txn) AscendTasks(fn func(id string, tk *Task) bool) error {
	var tk Task
	var derr error
	err := t.AscendTaskRecords(func(id, rec []byte) bool {
		if derr = decodeTaskInto(&tk, rec, true); derr != nil {
			return false
		}
		return fn(string(id), &tk)
	})
	if derr != nil {
		return derr
	}
	return err
}

// AscendTaskRecords is AscendTasks without the decoding: fn gets each
// task's id and its record as stored (AppendTask's encoding), both the
// engine's buffers, valid only during the call. A backup's copy of a shard
// re-encodes the stored bytes straight into its stream.
func (t *Txn) AscendTaskRecords(fn func(id, rec []byte) bool) error {
	if !t.view {
		return errors.New("ondisk: AscendTaskRecords reads a view only")
	}
	lo := tableKey(t.s.shard, TableTask, 0)
	hi := tableKey(t.s.shard, TableTask+1, 0)
	it, err := t.r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()[len(lo):]
		n, w := binary.Uvarint(k)
		if w <= 0 || uint64(len(k)-w) < n {
			return fmt.Errorf("ondisk: shard %d: damaged task key %x", t.s.shard, it.Key())
		}
		raw, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if !fn(k[w:w+int(n)], raw) {
			return nil
		}
	}
	return it.Error()
}
