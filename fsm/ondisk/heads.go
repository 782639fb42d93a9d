package ondisk

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/cockroachdb/pebble/v2"
)

// A queue's claimable head in memory (DESIGN.md, "Queue heads in
// memory"): the first keys of the queue's claim order, as committed, with
// their task records, so that a claim reads neither the claim index (an
// iterator over every level) nor the task it takes (a point read). It is
// kept exact through index and unindex, the only writers of claim keys:
// an entry is inserted only where the cached prefix covers its key, and a
// full prefix drops its last entry instead of growing. Dropping it is
// always safe; a transaction changes a copy (the committed one may be read
// by concurrent reads) and Commit installs it with the queue's record.

// headCache holds the first len(entries) claim keys of a queue, in key
// order; complete says they are all of them.
type headCache struct {
	entries  []headEntry
	complete bool
	// mine: entries' array belongs to this copy. A copy shares its
	// original's array and may only reslice it (drop the first entry)
	// until it clones it.
	mine  bool
	bytes int
}

type headEntry struct {
	key  []byte // the claim key
	id   string
	prio int32
	at   int64
	tk   *Task // nil when the record is too large to keep: read it
}

// headMax bounds a queue's cached head, headFill is what a fill reads at
// most at once (variables for tests, which make them small).
var (
	headMax  = 64
	headFill = 32
)

const (
	// headBytes bounds the heads of a shard together: past it, Commit
	// drops them all (they refill on the next claims).
	headBytes = 4 << 20
	// headRecordMax: a larger record is not kept in a head (its key is).
	headRecordMax = 4 << 10
)

func (e *headEntry) size() int {
	n := len(e.key) + len(e.id) + 64
	if e.tk != nil {
		n += taskSize(e.tk)
	}
	return n
}

// own makes q's head the transaction's own to change (q is the
// transaction's copy of the queue); nil if q has none.
func (q *queueInfo) own() *headCache {
	if q.cache == nil || q.cacheMine {
		return q.cache
	}
	c := *q.cache
	c.mine = false
	q.cache, q.cacheMine = &c, true
	return q.cache
}

// writable gives c's entries an array of their own.
func (c *headCache) writable() {
	if !c.mine {
		c.entries = append(make([]headEntry, 0, min(headMax+1, len(c.entries)+headFill)), c.entries...)
		c.mine = true
	}
}

func (c *headCache) search(k []byte) (int, bool) {
	return sort.Find(len(c.entries), func(i int) int { return bytes.Compare(k, c.entries[i].key) })
}

// headIndexed updates q's head for a claim key written (tk is the task's
// record).
func (t *Txn) headIndexed(q *queueInfo, ck []byte, id string, tk *Task) {
	if t.view || q.cache == nil {
		return
	}
	c := q.cache
	if !c.complete && (len(c.entries) == 0 || bytes.Compare(ck, c.entries[len(c.entries)-1].key) > 0) {
		return // past the cached prefix
	}
	c = q.own()
	i, found := c.search(ck)
	e := headEntry{key: ck, id: id, prio: tk.Priority, at: tk.At}
	if taskSize(tk) <= headRecordMax {
		e.tk = tk
	}
	c.writable()
	if found { // not expected (a write of a key follows its delete); replace
		c.bytes -= c.entries[i].size()
		c.entries[i] = e
	} else {
		c.entries = slices.Insert(c.entries, i, e)
	}
	c.bytes += e.size()
	if len(c.entries) > headMax {
		last := len(c.entries) - 1
		c.bytes -= c.entries[last].size()
		c.entries[last] = headEntry{}
		c.entries, c.complete = c.entries[:last], false
	}
}

// headUnindexed updates q's head for a claim key deleted.
func (t *Txn) headUnindexed(q *queueInfo, ck []byte) {
	if t.view || q.cache == nil {
		return
	}
	i, found := q.cache.search(ck)
	if !found {
		return
	}
	c := q.own()
	c.bytes -= c.entries[i].size()
	if i == 0 {
		// Every claim key of the queue below this one is gone, and so is
		// this one: a seek of the index starts here.
		q.head = c.entries[0].key
		c.entries = c.entries[1:]
		return
	}
	c.writable()
	c.entries = slices.Delete(c.entries, i, i+1)
}

// claimableHead is ClaimableAt through q's head in memory; ok is false
// when the transaction cannot use one (a view; a read that finds none).
func (t *Txn) claimableHead(q *queueInfo, clock int64, fn func(id string, tk *Task) bool) (ok bool, err error) {
	if t.view || (q.cache == nil && t.readOnly) {
		return false, nil
	}
	if q.cache == nil {
		q.cache, q.cacheMine = &headCache{mine: true}, true
	}
	group := GroupOf(q.name)
	for i := 0; ; {
		c := q.cache
		for i < len(c.entries) {
			e := &c.entries[i]
			if e.at > clock {
				// The rest of this priority is in the future.
				if e.prio == math.MinInt32 {
					return true, nil
				}
				p := e.prio
				i += sort.Search(len(c.entries)-i, func(j int) bool { return c.entries[i+j].prio < p })
				if i == len(c.entries) && !c.complete {
					return true, t.claimableDisk(q, ClaimPriority(t.s.shard, q.num, p-1), clock, fn)
				}
				continue
			}
			tk := e.tk
			if tk == nil {
				if tk, err = t.get(group, e.id, true); err != nil {
					return true, err
				}
				if tk == nil {
					return true, errNoTask(t, e.id)
				}
			} else {
				t.remember(TaskKey(t.s.shard, group, e.id), tk)
			}
			if !fn(e.id, tk) {
				return true, nil
			}
			i++
		}
		if c.complete {
			return true, nil
		}
		if t.readOnly || len(c.entries) >= headMax {
			from := ClaimPrefix(t.s.shard, q.num)
			if n := len(c.entries); n > 0 {
				from = append(bytes.Clone(c.entries[n-1].key), 0)
			} else if q.head != nil {
				from = q.head
			}
			return true, t.claimableDisk(q, from, clock, fn)
		}
		if err := t.fillHead(q); err != nil {
			return true, err
		}
	}
}

// fillHead reads the claim keys after q's cached head into it, with their
// records: one iterator over the claim index and one over the tasks.
func (t *Txn) fillHead(q *queueInfo) error {
	c := q.own()
	from := ClaimPrefix(t.s.shard, q.num)
	if n := len(c.entries); n > 0 {
		from = append(bytes.Clone(c.entries[n-1].key), 0)
	} else if q.head != nil {
		from = q.head
	}
	want := min(headFill, headMax-len(c.entries))
	it, err := t.r.NewIter(&pebble.IterOptions{LowerBound: ClaimPrefix(t.s.shard, q.num), UpperBound: ClaimPrefix(t.s.shard, q.num+1)})
	if err != nil {
		return err
	}
	var add []headEntry
	for ok := it.SeekGE(from); ok && len(add) < want; ok = it.Next() {
		k := bytes.Clone(it.Key())
		_, _, prio, at, id, err := ParseClaimKey(k)
		if err != nil {
			it.Close()
			return err
		}
		add = append(add, headEntry{key: k, id: id, prio: prio, at: at})
	}
	if err := it.Close(); err != nil {
		return err
	}
	if len(c.entries) == 0 && len(add) > 0 {
		q.head = add[0].key
	}
	if err := t.headRecords(GroupOf(q.name), add); err != nil {
		return err
	}
	c.writable()
	for i := range add {
		c.bytes += add[i].size()
	}
	c.entries = append(c.entries, add...)
	c.complete = len(add) < want
	return nil
}

// headRecords reads the records of entries, in task key order through one
// iterator, except those the transaction or a recent commit holds.
func (t *Txn) headRecords(group string, entries []headEntry) error {
	type want struct {
		key []byte
		e   *headEntry
	}
	var read []want
	for i := range entries {
		e := &entries[i]
		k := TaskKey(t.s.shard, group, e.id)
		if tk, ok := t.tasks[string(k)]; ok {
			e.tk = tk
		} else if tk, ok := t.s.recent.m[string(k)]; ok {
			e.tk = tk
		} else {
			read = append(read, want{k, e})
			continue
		}
		if e.tk == nil {
			return errNoTask(t, e.id)
		}
	}
	if len(read) == 0 {
		return t.headSized(entries)
	}
	slices.SortFunc(read, func(a, b want) int { return bytes.Compare(a.key, b.key) })
	it, err := t.r.NewIter(nil)
	if err != nil {
		return err
	}
	defer it.Close()
	for _, w := range read {
		found := it.SeekPrefixGE(w.key) && bytes.Equal(it.Key(), w.key)
		if err := it.Error(); err != nil {
			return err
		}
		if !found {
			return errNoTask(t, w.e.id)
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if w.e.tk, err = DecodeTask(v); err != nil {
			return err
		}
	}
	return t.headSized(entries)
}

// headSized drops the records too large to keep.
func (t *Txn) headSized(entries []headEntry) error {
	for i := range entries {
		if tk := entries[i].tk; tk != nil && taskSize(tk) > headRecordMax {
			entries[i].tk = nil
		}
	}
	return nil
}

func errNoTask(t *Txn, id string) error {
	return fmt.Errorf("ondisk: shard %d: claim key of %q has no task", t.s.shard, id)
}
