package ondisk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/btree"
)

// State is one shard's state in an engine shared by the node's shards:
// tasks and their indexes on disk, and in memory only what is per queue
// (its number, counters and claim head) and per shard (applied index,
// clock, digest). Changes go through a Txn, one per log entry or batch of
// entries. A State is not safe for concurrent use.
type State struct {
	db     *pebble.DB
	shard  uint32
	queues map[string]*queueInfo
	byNum  map[uint32]*queueInfo
	meta   meta
	// dueHead: every due key of the shard below it is deleted (see
	// DESIGN.md, "Queue heads").
	dueHead []byte
	// order: the sessions by last-seen time (session.go), as committed.
	order *btree.BTreeG[sessionAt]
	// dueAt, when dueKnown: no task is due before it (a lower bound of the
	// due index's first at), so that advancing the clock short of it reads
	// nothing.
	dueAt    int64
	dueKnown bool
	// recent, recentSessions: the task and session records the last
	// commits read or wrote, as committed (absent ones left out): a
	// claim's commit, and every command's session, read what the previous
	// batch wrote, and a point read in the engine builds an iterator over
	// every level to find it in the memtable. A view does not use them:
	// its snapshot may be older.
	recent         recentSet[Task]
	recentSessions recentSet[Session]
	// ops and sortBuf are commitSorted's buffers, kept between commits.
	ops     []batchOp
	sortBuf []sortOp
	// pending: the writes of committed transactions that are not in the
	// engine yet (an indexed batch every transaction reads and writes
	// through), put into the engine once it holds pendingBytes, and
	// before anything reads the engine directly (commitPending). nil:
	// none. pendMu guards it against reads that run beside each other
	// (BeginRead, View, the flushes): the apply never runs beside them.
	pending *pebble.Batch
	pendMu  sync.Mutex
	// pendGen counts the pending batches begun: a transaction knows its
	// batch by it (Pebble pools closed batches, so a pointer may recur).
	pendGen uint64
	// cacheBytes: the queues' heads in memory together (heads.go).
	cacheBytes int
	// writtenKeys, writtenBytes: the keys (sets and deletes) and their
	// bytes (key and value) the commits wrote into the engine.
	writtenKeys, writtenBytes uint64
	// small, when smallKnown: the committed small record (PutSmall) and
	// its hash in the digest. The caller's small state changes with
	// nearly every commit (it counts the tasks' bytes), and reading the
	// old record back is a point read through every level.
	small      []byte
	smallSum   [32]byte
	smallKnown bool
	// deferred: the records kept in memory that commits changed and the
	// engine does not hold yet (deferred.go).
	deferred deferred
}

// Written is how many keys the state's commits have written into the
// engine (sets and deletes, the last write of each key per commit) and
// their bytes, keys and values: what the engine's memtables take in.
func (s *State) Written() (keys, bytes uint64) { return s.writtenKeys, s.writtenBytes }

// queueInfo is what is kept in memory per queue.
type queueInfo struct {
	name string
	num  uint32
	// total tasks; claimed and delayed count those with at > clock, with
	// and without a claimant.
	total, claimed, delayed uint64
	// head: every claim key of the queue below it is deleted.
	head []byte
	// cache: the queue's first claim keys and their records (heads.go);
	// nil when unknown. cacheMine: this copy of the record may change it.
	cache     *headCache
	cacheMine bool
}

func (q *queueInfo) encode() []byte {
	b := binary.AppendUvarint(nil, uint64(q.num))
	b = binary.AppendUvarint(b, q.total)
	b = binary.AppendUvarint(b, q.claimed)
	return binary.AppendUvarint(b, q.delayed)
}

func decodeQueue(name string, b []byte) (*queueInfo, error) {
	q := &queueInfo{name: name}
	var vs [4]uint64
	for i := range vs {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return nil, fmt.Errorf("ondisk: queue %q: bad record %x", name, b)
		}
		vs[i], b = v, b[n:]
	}
	if len(b) != 0 || vs[0] > 1<<32-1 {
		return nil, fmt.Errorf("ondisk: queue %q: bad record", name)
	}
	q.num, q.total, q.claimed, q.delayed = uint32(vs[0]), vs[1], vs[2], vs[3]
	return q, nil
}

// Open loads shard's per-queue and per-shard records from db.
func Open(db *pebble.DB, shard uint32) (*State, error) {
	s := &State{db: db, shard: shard, queues: map[string]*queueInfo{}, byNum: map[uint32]*queueInfo{}, meta: meta{layout: Layout}}
	v, c, err := db.Get(MetaKey(shard, "shard"))
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		s.meta, err = decodeMeta(v)
		c.Close()
		if err != nil {
			return nil, fmt.Errorf("ondisk: shard %d: %w", shard, err)
		}
		if err := s.upgrade(); err != nil {
			return nil, fmt.Errorf("ondisk: shard %d: upgrading from layout %d: %w", shard, s.meta.layout, err)
		}
	}
	if err := s.loadSessionOrder(); err != nil {
		return nil, err
	}
	prefix := QueueKey(shard, "")
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: tableKey(shard, TableQueue+1, 0)})
	if err != nil {
		return nil, err
	}
	for it.First(); it.Valid(); it.Next() {
		q, err := decodeQueue(string(it.Key()[len(prefix):]), it.Value())
		if err != nil {
			it.Close()
			return nil, err
		}
		s.queues[q.name] = q
		s.byNum[q.num] = q
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	return s, nil
}

// AsyncFlush starts writing the memtables to files; the channel closes
// when what was committed before the call is flushed.
func (s *State) AsyncFlush() (<-chan struct{}, error) {
	if err := s.commitPending(); err != nil {
		return nil, err
	}
	return s.db.AsyncFlush()
}

// Flush writes the engine's memtables to its files. Without a WAL, what
// is committed but not flushed is lost in a crash: the state then trails
// the Raft log, which replays it, but never the log's newest snapshot,
// which is why a snapshot flushes first (DESIGN.md).
func (s *State) Flush() error {
	if err := s.commitPending(); err != nil {
		return err
	}
	return s.db.Flush()
}

// pendingBytes is the size of the pending batch at which a commit puts it
// into the engine. The transactions of a shard's entries write many keys
// that the next few delete again (a claimed task's record and its due
// key, the claim key of a lease): in one batch the last write of each key
// is all commitSorted puts into the engine, and a key set and deleted
// again is not written at all.
var pendingBytes = 256 << 10

// commitPending puts the pending writes into the engine.
func (s *State) commitPending() error {
	s.pendMu.Lock()
	defer s.pendMu.Unlock()
	if s.pending == nil && s.deferred.empty() {
		return nil
	}
	b := s.pending
	s.pending = nil
	if b == nil {
		b = s.db.NewBatch()
	}
	defer b.Close()
	if err := s.writeDeferred(b); err != nil {
		return err
	}
	return s.commitSorted(b)
}

// truncatePending keeps the first n writes of the pending batch (a
// discarded transaction's come after them). A batch cannot be cut short,
// so they are copied into a new one: discarding a transaction that wrote
// is rare (an install that failed part way, tests).
func (s *State) truncatePending(n uint32) error {
	s.pendMu.Lock()
	defer s.pendMu.Unlock()
	old := s.pending
	s.pending = nil
	defer old.Close()
	if n == 0 {
		return nil
	}
	b := s.db.NewIndexedBatch()
	r := old.Reader()
	for range n {
		kind, k, v, ok, err := r.Next()
		switch {
		case err != nil:
			b.Close()
			return err
		case !ok:
			b.Close()
			return fmt.Errorf("the pending batch holds fewer than %d writes", n)
		case kind == pebble.InternalKeyKindSet:
			err = b.Set(k, v, nil)
		case kind == pebble.InternalKeyKindDelete:
			err = b.Delete(k, nil)
		default:
			err = fmt.Errorf("a write of kind %v in a transaction", kind)
		}
		if err != nil {
			b.Close()
			return err
		}
	}
	s.pending = b
	s.pendGen++
	return nil
}

// dropPending forgets the pending writes (Clear).
func (s *State) dropPending() {
	s.pendMu.Lock()
	defer s.pendMu.Unlock()
	if s.pending != nil {
		s.pending.Close()
		s.pending = nil
	}
	s.deferred = deferred{}
}

// Small returns the bytes PutSmall stored last, or nil.
func (s *State) Small() ([]byte, error) {
	if err := s.loadSmall(); err != nil {
		return nil, err
	}
	return bytes.Clone(s.small), nil
}

// loadSmall reads the small record into s.small, once.
func (s *State) loadSmall() error {
	if s.smallKnown {
		return nil
	}
	k := MetaKey(s.shard, "small")
	v, c, err := s.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		s.small, s.smallKnown = nil, true
		return nil
	}
	if err != nil {
		return err
	}
	defer c.Close()
	s.small, s.smallSum, s.smallKnown = bytes.Clone(v), recordSum(k[shardLen:], v), true
	return nil
}

// PutSmall stores the state the caller keeps beside the tables (fsm's
// format, pauses, limits, schedules and slot states), with the commit.
func (t *Txn) PutSmall(b []byte) error {
	k := MetaKey(t.s.shard, "small")
	switch {
	case t.smallSet:
		if t.small != nil {
			t.meta.digest.addSum(&t.smallSum, true)
		}
	default:
		if err := t.s.loadSmall(); err != nil {
			return err
		}
		if t.s.small != nil {
			t.meta.digest.addSum(&t.s.smallSum, true)
		}
	}
	t.small, t.smallSum, t.smallSet = bytes.Clone(b), recordSum(k[shardLen:], b), true
	t.meta.digest.addSum(&t.smallSum, false)
	return nil // written back (deferred.go)
}

// Clear deletes the shard's whole range (tasks, indexes, sessions,
// reservations, its own record): what a snapshot install does first.
func (s *State) Clear() error {
	s.dropPending()
	if err := s.db.DeleteRange(ShardPrefix(s.shard), ShardEnd(s.shard), pebble.NoSync); err != nil {
		return err
	}
	s.queues, s.byNum = map[string]*queueInfo{}, map[uint32]*queueInfo{}
	s.meta, s.dueHead, s.order, s.dueKnown = meta{layout: Layout}, nil, newSessionOrder(), false
	s.recent, s.recentSessions = recentSet[Task]{}, recentSet[Session]{}
	s.cacheBytes = 0
	s.small, s.smallKnown = nil, false
	return nil
}

// Applied is the index of the last log entry committed into the state.
func (s *State) Applied() uint64 { return s.meta.applied }

// Clock is the state's log time.
func (s *State) Clock() int64 { return s.meta.clock }

// Digest is the digest of the state's records.
func (s *State) Digest() Digest { return s.meta.digest }

// QueueStats counts a queue's tasks at the state's clock.
type QueueStats struct {
	Total, Available, Claimed, Delayed uint64
}

// Stats returns a queue's counts; ok is false for a queue with no tasks.
func (s *State) Stats(queue string) (st QueueStats, ok bool) {
	q := s.queues[queue]
	if q == nil {
		return QueueStats{}, false
	}
	return QueueStats{Total: q.total, Claimed: q.claimed, Delayed: q.delayed, Available: q.total - q.claimed - q.delayed}, true
}

// Queues is the number of queues that hold tasks.
func (s *State) Queues() int { return len(s.queues) }

// Txn is a set of changes that commit together, with the applied index of
// the last entry they apply. Its reads see its own writes.
type Txn struct {
	s *State
	b *pebble.Batch // writes (the State's pending batch); nil in a view
	// base: b's count of writes when the transaction began; own: b is
	// the transaction's own (a read's), not the pending batch.
	base      uint32
	gen       uint64 // the State's pendGen when it began
	own       bool
	committed bool          // Commit ran: Discard has nothing to drop
	r         pebble.Reader // reads: b, or a view's snapshot
	snap      *pebble.Snapshot
	view      bool
	meta      meta
	dueHead   []byte
	// order: the session order the transaction sees; orderMine: it is
	// the transaction's own copy (orderForWrite).
	order     *btree.BTreeG[sessionAt]
	orderMine bool
	dueAt     int64
	dueKnown  bool
	dirty     map[string]*queueInfo // copies of the queues changed, by name
	byNum     map[uint32]*queueInfo // the same, by number
	// tasks, sessions: the records this transaction read or wrote, by
	// key (nil: none there), so that a command that reads a task and then
	// replaces or deletes it (every claim and commit) reads it once.
	tasks    map[string]*Task
	sessions map[string]*Session
	// unhashed: the sessions written and not yet hashed into the digest
	// (session.go), by key.
	unhashed map[string]*Session
	// sessionWrites: the session records written, by key (nil: deleted),
	// which Commit hands to the State's deferred records.
	sessionWrites map[string][]byte
	buf           []byte // for what is copied where it goes (a record into the batch)
	// kbuf: for a key that is copied where it goes (into the batch, or a
	// map's string) and not kept: one at a time.
	kbuf []byte
	// small, smallSum, when smallSet: the small record PutSmall wrote,
	// installed in the State by Commit.
	small    []byte
	smallSum [32]byte
	smallSet bool
	// readOnly: a read that will be discarded (BeginRead), which uses the
	// queues' heads in memory but does not fill them.
	readOnly bool
}

// Begin starts a transaction.
func (s *State) Begin() *Txn {
	if s.pending == nil {
		s.pending = s.db.NewIndexedBatch()
		s.pendGen++
	}
	b := s.pending
	return &Txn{s: s, b: b, r: b, gen: s.pendGen, base: b.Count(), meta: s.meta, dueHead: s.dueHead, order: s.order,
		dueAt: s.dueAt, dueKnown: s.dueKnown, dirty: map[string]*queueInfo{}, byNum: map[uint32]*queueInfo{}}
}

// BeginRead starts a transaction that only reads and is discarded: it
// may run beside other reads (never beside a change), so it changes
// nothing it shares with them.
func (s *State) BeginRead() *Txn {
	// Reads run beside each other, and a batch is read by one at a time:
	// the pending writes go into the engine first, and the read has a
	// batch of its own over it, which it discards.
	if err := s.commitPending(); err != nil {
		panic(fmt.Sprintf("ondisk: shard %d: %v", s.shard, err))
	}
	b := s.db.NewIndexedBatch()
	return &Txn{s: s, b: b, r: b, own: true, readOnly: true, meta: s.meta, dueHead: s.dueHead, order: s.order,
		dueAt: s.dueAt, dueKnown: s.dueKnown, dirty: map[string]*queueInfo{}, byNum: map[uint32]*queueInfo{}}
}

// View is a read-only transaction over a consistent snapshot of the
// state's engine, that may be read while other transactions commit (a Raft
// snapshot streams from one while entries apply): it holds copies of the
// per-queue records, and a Pebble snapshot pins the files it reads. Its
// changes fail; Discard releases it.
func (s *State) View() *Txn {
	if err := s.commitPending(); err != nil {
		panic(fmt.Sprintf("ondisk: shard %d: %v", s.shard, err))
	}
	t := &Txn{s: s, snap: s.db.NewSnapshot(), view: true, meta: s.meta, dueHead: s.dueHead, order: s.order.Clone(),
		dueAt: s.dueAt, dueKnown: s.dueKnown, dirty: make(map[string]*queueInfo, len(s.queues)), byNum: make(map[uint32]*queueInfo, len(s.queues))}
	t.r = t.snap
	for name, q := range s.queues {
		c := *q
		c.cache, c.cacheMine = nil, false // a view reads the engine only
		t.dirty[name], t.byNum[c.num] = &c, &c
	}
	return t
}

// QueueNames lists the queues the transaction sees, in name order.
func (t *Txn) QueueNames() []string {
	names := make([]string, 0, len(t.dirty))
	for name := range t.dirty {
		names = append(names, name)
	}
	if !t.view { // a view has them all, and may not read the State's
		for name := range t.s.queues {
			if t.dirty[name] == nil {
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	return names
}

// Discard drops the transaction's changes (or releases the view).
func (t *Txn) Discard() {
	switch {
	case t.snap != nil:
		t.snap.Close()
	case t.own:
		t.b.Close()
	case t.committed || t.s.pending == nil || t.gen != t.s.pendGen:
		// Committed, or not the pending batch any more (a read that went
		// on past a commit of the pending writes: a transaction that wrote
		// is committed or discarded before anything else runs).
	case t.b.Count() != t.base:
		// Its writes are the pending batch's last: keep those before them.
		if err := t.s.truncatePending(t.base); err != nil {
			panic(fmt.Sprintf("ondisk: shard %d: discarding a transaction: %v", t.s.shard, err))
		}
	}
}

// Commit writes the changes and the applied index, without a sync (the
// Raft log is the durable record), and makes them the State's.
func (t *Txn) Commit(applied uint64) error {
	if applied > t.meta.applied {
		t.meta.applied = applied
	}
	t.hashSessions()
	s := t.s
	t.committed = true
	// The shard's record, its queues', the small record and the sessions
	// are written back (deferred.go).
	s.deferred.meta = true
	for name := range t.dirty {
		s.deferred.queue(name)
	}
	if t.smallSet {
		s.deferred.small = true
	}
	for k, rec := range t.sessionWrites {
		s.deferred.session(k, rec)
	}
	for _, q := range t.dirty {
		if old := s.queues[q.name]; old != nil {
			delete(s.byNum, old.num)
			if old.cache != nil {
				s.cacheBytes -= old.cache.bytes
			}
		}
		if q.total == 0 {
			delete(s.queues, q.name)
			continue
		}
		s.queues[q.name] = q
		s.byNum[q.num] = q
		if q.cache != nil {
			s.cacheBytes += q.cache.bytes
		}
	}
	if s.cacheBytes > headBytes {
		for _, q := range s.queues {
			q.cache = nil
		}
		s.cacheBytes = 0
	}
	s.meta, s.dueHead, s.order = t.meta, t.dueHead, t.order
	s.dueAt, s.dueKnown = t.dueAt, t.dueKnown
	s.recent.update(t.tasks, taskSize)
	s.recentSessions.update(t.sessions, sessionSize)
	if t.smallSet {
		s.small, s.smallSum, s.smallKnown = t.small, t.smallSum, true
	}
	if len(t.b.Repr()) >= pendingBytes || len(s.deferred.sessions) >= deferredSessionsMax {
		return s.commitPending()
	}
	return nil
}

// queue returns the transaction's copy of a queue, creating the queue if
// create is set; nil if it does not exist and create is not set.
func (t *Txn) queue(name string, create bool) *queueInfo {
	if q := t.dirty[name]; q != nil || t.view {
		return q // a view holds copies of every queue
	}
	if q := t.s.queues[name]; q != nil {
		c := *q
		c.cacheMine = false
		t.dirty[name], t.byNum[c.num] = &c, &c
		return &c
	}
	if !create {
		return nil
	}
	// A new number: no claim key has it, so its head is known (empty).
	q := &queueInfo{name: name, num: t.meta.nextQueue, cache: &headCache{complete: true, mine: true}, cacheMine: true}
	t.meta.nextQueue++
	t.dirty[name], t.byNum[q.num] = q, q
	return q
}

func (t *Txn) queueByNum(num uint32) (*queueInfo, error) {
	if q := t.byNum[num]; q != nil {
		return q, nil
	}
	if t.view {
		return nil, fmt.Errorf("ondisk: shard %d: no queue numbered %d", t.s.shard, num)
	}
	if q := t.s.byNum[num]; q != nil {
		return t.queue(q.name, false), nil
	}
	return nil, fmt.Errorf("ondisk: shard %d: no queue numbered %d", t.s.shard, num)
}

// Clock is the transaction's log time.
func (t *Txn) Clock() int64 { return t.meta.clock }

// Get returns group's task with id, or nil.
//
// A task it returns is shared with the transaction: callers must not
// modify it.
func (t *Txn) Get(group, id string) (*Task, error) { return t.get(group, id, true) }

// get is Get; keep says to remember the task read (a point read, likely
// to be replaced or deleted next), which scans do not: they would hold a
// whole queue in memory.
func (t *Txn) get(group, id string, keep bool) (*Task, error) {
	t.kbuf = appendTaskKey(t.kbuf[:0], t.s.shard, group, id)
	return readRecord(t, &t.tasks, &t.s.recent, nil, t.kbuf, keep, DecodeTask)
}

// readRecord reads the record at k as the transaction sees it: what it
// read or wrote itself (mine), what recent commits left (recent), what
// commits wrote back (deferred: encoded, nil for none), else the engine;
// with keep, it remembers what it found in mine. A view does not read
// recent: its snapshot may be older, and it may run beside a commit, so it
// does not touch them. deferred is nil for tasks, and for a view or a
// read (Txn.Session).
func readRecord[V any](t *Txn, mine *map[string]*V, recent *recentSet[V], deferred map[string][]byte, k []byte, keep bool, decode func([]byte) (*V, error)) (*V, error) {
	if v, ok := (*mine)[string(k)]; ok {
		return v, nil
	}
	if !t.view {
		if v, ok := recent.m[string(k)]; ok {
			rememberIn(mine, k, v)
			return v, nil
		}
	}
	if rec, ok := deferred[string(k)]; ok {
		var v *V
		if rec != nil {
			var err error
			if v, err = decode(rec); err != nil {
				return nil, err
			}
		}
		if keep {
			rememberIn(mine, k, v)
		}
		return v, nil
	}
	raw, c, err := t.r.Get(k)
	var v *V
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		v, err = decode(raw)
		c.Close()
		if err != nil {
			return nil, err
		}
	}
	if keep && !t.view {
		rememberIn(mine, k, v)
	}
	return v, nil
}

// rememberIn records in m what the record at k is now (nil: none).
func rememberIn[V any](m *map[string]*V, k []byte, v *V) {
	if *m == nil {
		*m = make(map[string]*V)
	}
	(*m)[string(k)] = v
}

// Prefetch reads group's tasks with ids into the transaction (as Get
// would, one at a time) in key order through one iterator: the not-found
// reads of a batch of inserts (the duplicate-id check) cost one iterator
// and a forward seek each, instead of a Get each, which builds an iterator
// over every level. Ids already read (here, or by a recent commit) are
// skipped.
func (t *Txn) Prefetch(group string, ids []string) error {
	if t.view || len(ids) < 2 {
		return nil
	}
	keys := make([][]byte, 0, len(ids))
	for _, id := range ids {
		k := TaskKey(t.s.shard, group, id)
		if t.known(k) {
			continue
		}
		if tk, ok := t.s.recent.m[string(k)]; ok {
			t.remember(k, tk)
			continue
		}
		keys = append(keys, k)
	}
	if len(keys) < 2 {
		return nil
	}
	slices.SortFunc(keys, bytes.Compare)
	it, err := t.r.NewIter(nil)
	if err != nil {
		return err
	}
	err = t.prefetch(it, keys)
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	return err
}

// prefetch reads keys (sorted) through it. Each seek clears the
// iterator's error, so it is checked after every one: a read that failed
// must not pass for a task that is not there.
func (t *Txn) prefetch(it *pebble.Iterator, keys [][]byte) error {
	for _, k := range keys {
		var tk *Task
		found := it.SeekPrefixGE(k) && bytes.Equal(it.Key(), k)
		if err := it.Error(); err != nil {
			return err
		}
		if found {
			v, err := it.ValueAndErr()
			if err == nil {
				tk, err = DecodeTask(v)
			}
			if err != nil {
				return err
			}
		}
		t.remember(k, tk)
	}
	return nil
}

// known reports whether the transaction has read or written the task at k.
func (t *Txn) known(k []byte) bool {
	_, ok := t.tasks[string(k)]
	return ok
}

// remember records what the task at k is now (nil: none).
func (t *Txn) remember(k []byte, tk *Task) { rememberIn(&t.tasks, k, tk) }

// QueueName is the name of the queue a task read from this transaction is
// in.
func (t *Txn) QueueName(tk *Task) (string, error) {
	q, err := t.queueByNum(tk.Queue)
	if err != nil {
		return "", err
	}
	return q.name, nil
}

// Put stores tk as the task id in queue (tk.Queue is set here), replacing
// the previous version of the task id in queue's group and its index
// entries.
func (t *Txn) Put(id, queue string, tk *Task) error {
	group := GroupOf(queue)
	old, err := t.Get(group, id)
	if err != nil {
		return err
	}
	if old != nil {
		if err := t.unindex(group, id, old); err != nil {
			return err
		}
	}
	return t.write(id, queue, tk)
}

// Add stores tk as the task id in queue (tk.Queue is set here) when the
// caller knows there is no task id in queue's group (fsm's add: the id was
// checked, the old version removed, or the leader chose it): unlike Put, it
// reads nothing.
func (t *Txn) Add(id, queue string, tk *Task) error { return t.write(id, queue, tk) }

// write stores tk and its index entries, over no previous version.
func (t *Txn) write(id, queue string, tk *Task) error {
	group := GroupOf(queue)
	q := t.queue(queue, true)
	tk.Queue = q.num
	// The batch copies what it is given: the record and the digest's
	// bytes are built in the transaction's buffer.
	t.buf = AppendTask(t.buf[:0], tk)
	t.kbuf = appendTaskKey(t.kbuf[:0], t.s.shard, group, id)
	k := t.kbuf
	if err := t.b.Set(k, t.buf, nil); err != nil {
		return err
	}
	t.buf = appendDigestTask(t.buf[:0], q.name, tk)
	t.meta.digest.Add(k[shardLen:], t.buf)
	t.remember(k, tk)
	return t.index(id, q, tk)
}

// Delete removes group's task id; it is not an error if there is none.
func (t *Txn) Delete(group, id string) error {
	old, err := t.Get(group, id)
	if err != nil || old == nil {
		return err
	}
	return t.unindex(group, id, old)
}

// Lookup calls fn with every group's task with id, in group order, while
// fn returns true (a read by id alone; fsm's Get).
func (t *Txn) Lookup(id string, fn func(group string, tk *Task) bool) error {
	prefix := TaskIDPrefix(t.s.shard, id)
	it, err := t.r.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		tk, err := DecodeTask(it.Value())
		if err != nil {
			return err
		}
		if !fn(string(it.Key()[len(prefix):]), tk) {
			return nil
		}
	}
	return it.Error()
}

// prefixEnd is the first key after every key starting with p (p is never
// all 0xff: it starts with a shard and a table byte below 0xff).
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// index adds a stored task's index entries and counts (Put wrote the
// record).
func (t *Txn) index(id string, q *queueInfo, tk *Task) error {
	q.total++
	t.meta.tasks++
	ck := ClaimKey(t.s.shard, q.num, tk.Priority, tk.At, id)
	if q.head != nil && bytes.Compare(ck, q.head) < 0 {
		q.head = ck
	}
	if err := t.b.Set(ck, nil, nil); err != nil {
		return err
	}
	t.headIndexed(q, ck, id, tk)
	if tk.Key != "" {
		uk := UniqueKey(t.s.shard, q.num, tk.Key)
		if err := t.b.Set(uk, []byte(id), nil); err != nil {
			return err
		}
	}
	if tk.At > t.meta.clock {
		if tk.Claimant != "" {
			q.claimed++
		} else {
			q.delayed++
		}
		t.kbuf = appendDueKey(t.kbuf[:0], t.s.shard, tk.At, q.num, id)
		dk := t.kbuf
		if t.dueHead != nil && bytes.Compare(dk, t.dueHead) < 0 {
			t.dueHead = bytes.Clone(dk)
		}
		if t.dueKnown && tk.At < t.dueAt {
			t.dueAt = tk.At
		}
		if err := t.b.Set(dk, nil, nil); err != nil {
			return err
		}
	}
	return nil
}

// unindex removes a stored task: its record, index entries and counts.
func (t *Txn) unindex(group, id string, old *Task) error {
	q, err := t.queueByNum(old.Queue)
	if err != nil {
		return err
	}
	t.kbuf = appendTaskKey(t.kbuf[:0], t.s.shard, group, id)
	k := t.kbuf
	t.buf = appendDigestTask(t.buf[:0], q.name, old)
	t.meta.digest.Remove(k[shardLen:], t.buf)
	if err := t.b.Delete(k, nil); err != nil {
		return err
	}
	t.remember(k, nil)
	q.total--
	t.meta.tasks--
	t.kbuf = appendClaimKey(t.kbuf[:0], t.s.shard, q.num, old.Priority, old.At, id)
	ck := t.kbuf
	if err := t.b.Delete(ck, nil); err != nil {
		return err
	}
	t.headUnindexed(q, ck)
	if old.Key != "" {
		uk := UniqueKey(t.s.shard, q.num, old.Key)
		v, c, err := t.r.Get(uk)
		if err == nil {
			owner := string(v)
			c.Close()
			if owner == id {
				if err := t.b.Delete(uk, nil); err != nil {
					return err
				}
			}
		} else if !errors.Is(err, pebble.ErrNotFound) {
			return err
		}
	}
	if old.At > t.meta.clock {
		if old.Claimant != "" {
			q.claimed--
		} else {
			q.delayed--
		}
		t.kbuf = appendDueKey(t.kbuf[:0], t.s.shard, old.At, q.num, id)
		if err := t.b.Delete(t.kbuf, nil); err != nil {
			return err
		}
	}
	return nil
}

// KeyOwner returns the id of the task holding key in queue.
func (t *Txn) KeyOwner(queue, key string) (id string, ok bool, err error) {
	q := t.queue(queue, false)
	if q == nil {
		return "", false, nil
	}
	v, c, err := t.r.Get(UniqueKey(t.s.shard, q.num, key))
	if errors.Is(err, pebble.ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	defer c.Close()
	return string(v), true, nil
}
