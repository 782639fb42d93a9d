package fsm

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/btree"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/fsm/ondisk"
)

// diskStore is the store on Pebble (fsm/ondisk): one shard's range of a
// node's engine holds the tasks, their indexes, the sessions and the key
// reservations, and memory holds a record per queue (its name and counts).
// The applier's changes between begin and commit are one Pebble batch,
// committed with the index of the last entry they apply and no sync of
// their own (fsm/ondisk/DESIGN.md). Reads outside an apply (the Machine's
// read lock) each read the committed state.
//
// A task it hands out is decoded for the call; callers never modify one.
// An error of the engine is a panic: the state can no more go on without
// its storage than with an entry it cannot decode (a replica that skipped
// a write would diverge).
//
// Not yet: the small state (format, pauses, limits, schedules, slot
// states) is kept in memory only, snapshots copy the whole state through
// memory, and a restore installs through a memStore. The machine on it is
// for tests until the node wires it (ondisk/DESIGN.md, step 3).
type diskStore struct {
	db    *pebble.DB
	shard uint32
	gen   uint32 // which of the shard's two ranges is live (storageID)
	st    *ondisk.State
	tx    *ondisk.Txn // the apply's transaction, between begin and commit
	// queues holds the record of every queue that exists (holds tasks, or
	// was created in this apply and not pruned); names orders them.
	queues map[string]*queue
	names  *btree.BTreeG[*queue]
	small  []byte // the small state as last stored
}

var (
	_ store    = (*diskStore)(nil)
	_ txnStore = (*diskStore)(nil)
)

// txnStore is a store whose changes commit together: the Machine begins
// before it applies a batch of entries and commits after, with the index
// of the last.
type txnStore interface {
	begin()
	// commit writes the batch with the applied index and the state's
	// small part (encodeSmall), which it stores when it changed.
	commit(applied uint64, small []byte)
	// flush makes what was committed survive a crash (before a snapshot:
	// the log it covers is then truncated).
	flush()
	// abort drops the open transaction.
	abort()
}

// A shard has two ranges in the engine, storage ids 2*shard and 2*shard+1:
// one is live, the other receives a snapshot install, which then becomes
// the live one by a single write (genKey), so that a damaged or
// interrupted install leaves the state as it was.

// maxShard bounds the shard ids an engine holds (two storage ids each,
// below the one the engine's own records use).
const maxShard = 1<<31 - 2

// engineID is the storage id of the engine's own records.
const engineID = 1<<32 - 1

func storageID(shard, gen uint32) uint32 { return shard<<1 | gen }

func genKey(shard uint32) []byte { return ondisk.MetaKey(engineID, fmt.Sprintf("live/%d", shard)) }

// openDiskStore opens the live range of shard, clearing the other (what an
// interrupted install left).
func openDiskStore(db *pebble.DB, shard uint32) (*diskStore, error) {
	if err := checkShard(shard); err != nil {
		return nil, err
	}
	gen := uint32(0)
	v, c, err := db.Get(genKey(shard))
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		if len(v) == 1 && v[0] <= 1 {
			gen = uint32(v[0])
		} else {
			err = fmt.Errorf("fsm: shard %d: bad live range record %x", shard, v)
		}
		c.Close()
		if err != nil {
			return nil, err
		}
	}
	if err := clearRange(db, shard, 1-gen); err != nil {
		return nil, err
	}
	return newDiskStore(db, shard, gen)
}

// checkShard refuses a shard number the engine's storage ids cannot hold.
func checkShard(shard uint32) error {
	if shard > maxShard {
		return fmt.Errorf("fsm: shard %d: an engine holds shards up to %d", shard, maxShard)
	}
	return nil
}

// clearRange empties one of shard's two ranges (gen).
func clearRange(db *pebble.DB, shard, gen uint32) error {
	st, err := ondisk.Open(db, storageID(shard, gen))
	if err != nil {
		return err
	}
	return st.Clear()
}

func newDiskStore(db *pebble.DB, shard, gen uint32) (*diskStore, error) {
	st, err := ondisk.Open(db, storageID(shard, gen))
	if err != nil {
		return nil, err
	}
	d := &diskStore{db: db, shard: shard, gen: gen, st: st}
	if err := d.load(); err != nil {
		return nil, err
	}
	if d.small, err = st.Small(); err != nil {
		return nil, err
	}
	return d, nil
}

// load reads the queue records.
func (d *diskStore) load() error {
	d.queues, d.names = map[string]*queue{}, btree.NewG(btreeDegree, queueLess)
	tx := d.st.Begin()
	defer tx.Discard()
	return d.st.QueueNames("", func(name string) bool {
		q := &queue{name: name, group: groupOf(name)}
		_, q.futureClaimed, q.futureDelayed, _ = tx.QueueCounts(name)
		d.queues[name] = q
		d.names.ReplaceOrInsert(q)
		return true
	})
}

// clear empties the shard's range (a snapshot install).
func (d *diskStore) clear() {
	must(d.st.Clear())
	must(d.load())
	d.small = nil
}

func (d *diskStore) begin() {
	if d.tx != nil {
		panic("fsm: a transaction of the on-disk state is already open")
	}
	d.tx = d.st.Begin()
}

func (d *diskStore) commit(applied uint64, small []byte) {
	tx := d.tx
	d.tx = nil
	if !bytes.Equal(small, d.small) {
		must(tx.PutSmall(small))
		d.small = small
	}
	must(tx.Commit(applied))
}

func (d *diskStore) flush() { must(d.st.Flush()) }

func (d *diskStore) abort() {
	if d.tx != nil {
		d.tx.Discard()
		d.tx = nil
	}
}

// staging returns the shard's other range, emptied, for an install.
func (d *diskStore) staging() (*diskStore, error) {
	s, err := newDiskStore(d.db, d.shard, 1-d.gen)
	if err != nil {
		return nil, err
	}
	s.clear()
	return s, nil
}

// switchTo makes staged (an install, committed and flushed) the live
// range: one durable write names it, then d's range is cleared. The
// machine's state moves to staged; d is not used again.
func (d *diskStore) switchTo(staged *diskStore) {
	must(d.db.Set(genKey(d.shard), []byte{byte(staged.gen)}, pebble.NoSync))
	must(d.db.Flush()) // no WAL: a write lasts once flushed
	must(d.st.Clear())
}

// txn is the apply's transaction, or a read of the committed state that
// done ends.
func (d *diskStore) txn() (tx *ondisk.Txn, done func()) {
	if d.tx != nil {
		return d.tx, func() {}
	}
	tx = d.st.BeginRead()
	return tx, tx.Discard
}

func must(err error) {
	if err != nil {
		panic(fmt.Sprintf("fsm: the on-disk state failed: %v", err))
	}
}

// queueRecord is the record of the named queue, or a detached one when the
// queue does not exist (a reservation's, whose tasks are gone).
func (d *diskStore) queueRecord(name string) *queue {
	if q := d.queues[name]; q != nil {
		return q
	}
	return &queue{name: name, group: groupOf(name)}
}

func (d *diskStore) toTask(tx *ondisk.Txn, id string, tk *ondisk.Task, q *queue) *task {
	if q == nil {
		name, err := tx.QueueName(tk)
		must(err)
		q = d.queueRecord(name)
	}
	t := &task{}
	fillTask(t, id, tk, q)
	return t
}

// fillTask sets t to the task record tk of queue q.
func fillTask(t *task, id string, tk *ondisk.Task, q *queue) {
	*t = task{id: id, key: tk.Key, claimant: tk.Claimant, err: tk.Err, value: tk.Value, ext: newTaskExt(tk.Dedup, tk.Headers), q: q,
		version: tk.Version, at: tk.At, created: tk.Created, modified: tk.Modified, priority: tk.Priority,
		claims: tk.Claims, attempt: tk.Attempt}
}

func fromTask(t *task) *ondisk.Task {
	return &ondisk.Task{Version: t.version, At: t.at, Claimant: t.claimant, Priority: t.priority, Key: t.key,
		Value: t.value, Created: t.created, Modified: t.modified, Claims: t.claims, Attempt: t.attempt, Err: t.err,
		Dedup: t.dedupWindow(), Headers: t.headers()}
}

// refresh copies q's counts from tx into its record.
func (d *diskStore) refresh(tx *ondisk.Txn, q *queue) {
	_, q.futureClaimed, q.futureDelayed, _ = tx.QueueCounts(q.name)
}

// sync brings the transaction's clock to the state's (on a restore, which
// sets the state's clock without advancing).
func (d *diskStore) sync(tx *ondisk.Txn, clock int64) {
	if tx.Clock() < clock {
		must(tx.Advance(clock, func(string, string, int64) {}))
	}
}

func (d *diskStore) prefetch(m *fsmpb.Modify) {
	n := len(m.Depends) + len(m.Deletes) + len(m.Changes) + len(m.Inserts)
	if n < 2 {
		return
	}
	ids := make([]string, 0, n)
	for _, r := range m.Depends {
		ids = append(ids, r.Id)
	}
	for _, r := range m.Deletes {
		ids = append(ids, r.Id)
	}
	for _, c := range m.Changes {
		ids = append(ids, c.Id)
	}
	for _, in := range m.Inserts {
		if !in.IdChosenByLeader { // in no task: nothing to read
			ids = append(ids, in.Id)
		}
	}
	tx, done := d.txn()
	defer done()
	must(tx.Prefetch(m.Group, ids))
}

func (d *diskStore) find(group, id string) *task {
	tx, done := d.txn()
	defer done()
	tk, err := tx.Get(group, id)
	must(err)
	if tk == nil {
		return nil
	}
	return d.toTask(tx, id, tk, nil)
}

func (d *diskStore) withID(id string, fn func(*task) bool) {
	tx, done := d.txn()
	defer done()
	var found []*task
	must(tx.Lookup(id, func(_ string, tk *ondisk.Task) bool {
		found = append(found, d.toTask(tx, id, tk, nil))
		return true
	}))
	for _, t := range found {
		if !fn(t) {
			return
		}
	}
}

func (d *diskStore) holds(id string) bool {
	tx, done := d.txn()
	defer done()
	found := false
	must(tx.Lookup(id, func(string, *ondisk.Task) bool {
		found = true
		return false
	}))
	return found
}

func (d *diskStore) count() int {
	tx, done := d.txn()
	defer done()
	return int(tx.TaskCount())
}

func (d *diskStore) queue(name string) *queue { return d.queues[name] }

func (d *diskStore) queueFor(name string) *queue {
	if q := d.queues[name]; q != nil {
		return q
	}
	q := &queue{name: name, group: groupOf(name)}
	d.queues[name] = q
	d.names.ReplaceOrInsert(q)
	return q
}

func (d *diskStore) prune(name string) {
	if q := d.queues[name]; q != nil && d.queueLen(q) == 0 {
		delete(d.queues, name)
		d.names.Delete(q)
	}
}

func (d *diskStore) ascendQueues(from string, fn func(*queue) bool) {
	d.names.AscendGreaterOrEqual(&queue{name: from}, fn)
}

func (d *diskStore) queueLen(q *queue) int {
	if d.tx == nil {
		// Outside an apply the committed counts are the state's: no
		// transaction (an indexed batch) per queue for a walk of them all.
		st, _ := d.st.Stats(q.name)
		return int(st.Total)
	}
	total, _, _, _ := d.tx.QueueCounts(q.name)
	return int(total)
}

func (d *diskStore) ascendQueue(q *queue, from *task, fn func(*task) bool) {
	tx, done := d.txn()
	defer done()
	var pos *ondisk.ClaimPos
	if from != nil {
		pos = &ondisk.ClaimPos{Priority: from.priority, At: from.at, ID: from.id}
	}
	// Collected first: fn may change the state (dropSlot removes what it
	// is given), and an iterator must not see its own batch change.
	var tasks []*task
	must(tx.AscendQueue(q.name, pos, func(id string, tk *ondisk.Task) bool {
		tasks = append(tasks, d.toTask(tx, id, tk, q))
		return len(tasks) < ascendChunk
	}))
	for len(tasks) > 0 {
		for _, t := range tasks {
			if !fn(t) {
				return
			}
		}
		if len(tasks) < ascendChunk {
			return
		}
		last := tasks[len(tasks)-1]
		tasks = tasks[:0]
		must(tx.AscendQueue(q.name, &ondisk.ClaimPos{Priority: last.priority, At: last.at, ID: last.id + "\x00"}, func(id string, tk *ondisk.Task) bool {
			tasks = append(tasks, d.toTask(tx, id, tk, q))
			return len(tasks) < ascendChunk
		}))
	}
}

// ascendChunk is how many tasks ascendQueue reads ahead of its caller.
const ascendChunk = 256

func (d *diskStore) keyOwner(queue, key string) string {
	tx, done := d.txn()
	defer done()
	id, _, err := tx.KeyOwner(queue, key)
	must(err)
	return id
}

func (d *diskStore) available(q *queue, clock int64, limit int, out []*task) []*task {
	if limit <= 0 {
		return out
	}
	tx, done := d.txn()
	defer done()
	n := 0
	must(tx.ClaimableAt(q.name, clock, func(id string, tk *ondisk.Task) bool {
		out = append(out, d.toTask(tx, id, tk, q))
		n++
		return n < limit
	}))
	return out
}

func (d *diskStore) runs(q *queue, visit func(first *task) bool) bool {
	tx, done := d.txn()
	defer done()
	all, err := tx.Runs(q.name, maxRuns, func(id string, tk *ondisk.Task) bool {
		return visit(d.toTask(tx, id, tk, q))
	})
	must(err)
	return all
}

// writes are the apply's: outside one there is no transaction to write in.
func (d *diskStore) writeTxn(clock int64) *ondisk.Txn {
	if d.tx == nil {
		panic("fsm: a change of the on-disk state outside a transaction")
	}
	d.sync(d.tx, clock)
	return d.tx
}

func (d *diskStore) add(t *task, clock int64) {
	tx := d.writeTxn(clock)
	must(tx.Add(t.id, t.q.name, fromTask(t)))
	d.refresh(tx, t.q)
}

func (d *diskStore) remove(t *task, clock int64) {
	tx := d.writeTxn(clock)
	must(tx.Delete(t.q.group, t.id))
	d.refresh(tx, t.q)
}

func (d *diskStore) replace(old, t *task, clock int64) {
	tx := d.writeTxn(clock)
	if old.q != t.q {
		must(tx.Delete(old.q.group, old.id))
		d.refresh(tx, old.q)
	}
	must(tx.Put(t.id, t.q.name, fromTask(t)))
	d.refresh(tx, t.q)
}

func (d *diskStore) purge(q *queue, clock int64) (int, int64, []*task) {
	tx := d.writeTxn(clock)
	var all, keyed []*task
	var size int64
	must(tx.AscendQueue(q.name, nil, func(id string, tk *ondisk.Task) bool {
		t := d.toTask(tx, id, tk, q)
		all = append(all, t)
		size += taskSize(t)
		if t.key != "" && t.dedupWindow() > 0 {
			keyed = append(keyed, t)
		}
		return true
	}))
	for _, t := range all {
		must(tx.Delete(q.group, t.id))
	}
	delete(d.queues, q.name)
	d.names.Delete(q)
	return len(all), size, keyed
}

func (d *diskStore) advance(clock, now int64, became []string) []string {
	tx := d.writeTxn(clock)
	type due struct {
		queue, id string
		at        int64
	}
	var all []due
	must(tx.Advance(now, func(queue, id string, at int64) { all = append(all, due{queue, id, at}) }))
	// In memStore's order (at, id, queue name), so that waiters are told
	// in the same order whichever store: the engine's order is by queue
	// number within an at.
	slices.SortFunc(all, func(a, b due) int {
		return cmp.Or(cmp.Compare(a.at, b.at), strings.Compare(a.id, b.id), strings.Compare(a.queue, b.queue))
	})
	for _, d := range all {
		became = append(became, d.queue)
	}
	for _, name := range became {
		if q := d.queues[name]; q != nil {
			d.refresh(tx, q)
		}
	}
	return became
}

func (d *diskStore) nextDue() (*task, bool) {
	tx, done := d.txn()
	defer done()
	_, id, tk, ok, err := tx.FirstDue()
	must(err)
	if !ok {
		return nil, false
	}
	return d.toTask(tx, id, tk, nil), true
}

// toSession keeps the answer encoded (session.answer decodes it): its
// size is the encoding's, which proto.Size of the decoded answer is.
func toSession(client string, s *ondisk.Session) *session {
	return &session{clientID: client, seq: s.Seq, group: s.Group, lastSeen: s.LastSeen, raw: s.Result, encoded: true,
		size: uint64(len(client)+len(s.Result)) + sessionOverheadBytes}
}

func (d *diskStore) session(clientID string) *session {
	tx, done := d.txn()
	defer done()
	s, err := tx.Session(clientID)
	must(err)
	if s == nil {
		return nil
	}
	return toSession(clientID, s)
}

func (d *diskStore) putSession(s *session) {
	tx := d.writeTxn(0)
	res := s.raw
	if !s.encoded {
		var err error
		res, err = proto.MarshalOptions{Deterministic: true}.Marshal(s.result)
		must(err)
	}
	must(tx.PutSession(s.clientID, &ondisk.Session{Seq: s.seq, LastSeen: s.lastSeen, Group: s.group, Result: res}))
}

func (d *diskStore) oldestSeen() (int64, bool) {
	tx, done := d.txn()
	defer done()
	client, lastSeen, err := tx.OldestSession()
	must(err)
	return lastSeen, client != ""
}

func (d *diskStore) seenSince() (int64, bool) {
	tx, done := d.txn()
	defer done()
	return tx.SessionsSeenSince()
}

func (d *diskStore) dropOldestSession() {
	tx := d.writeTxn(0)
	client, _, err := tx.OldestSession()
	must(err)
	if client != "" {
		must(tx.DeleteSession(client))
	}
}

func (d *diskStore) sessionCount() int {
	tx, done := d.txn()
	defer done()
	n, _ := tx.Sessions()
	return int(n)
}

func (d *diskStore) sessionBytes() uint64 {
	tx, done := d.txn()
	defer done()
	_, b := tx.Sessions()
	return b
}

func (d *diskStore) ascendSessions(fn func(*session) bool) {
	tx, done := d.txn()
	defer done()
	var all []*session
	must(tx.AscendSessions(func(client string, s *ondisk.Session) bool {
		all = append(all, toSession(client, s))
		return true
	}))
	for _, s := range all {
		if !fn(s) {
			return
		}
	}
}

func (d *diskStore) toReservation(name string, r *ondisk.Reservation) *reservation {
	q := &queue{name: name, group: groupOf(name)} // detached: only the name counts
	t := &task{id: r.ID, key: r.Task.Key, claimant: r.Task.Claimant, err: r.Task.Err, value: r.Task.Value, ext: newTaskExt(r.Task.Dedup, r.Task.Headers),
		q: q, version: r.Task.Version, at: r.Task.At, created: r.Task.Created, modified: r.Task.Modified,
		priority: r.Task.Priority, claims: r.Task.Claims, attempt: r.Task.Attempt}
	return &reservation{last: t, until: r.Until}
}

func (d *diskStore) reservation(queue, key string) *reservation {
	tx, done := d.txn()
	defer done()
	r, err := tx.Reservation(queue, key)
	must(err)
	if r == nil {
		return nil
	}
	return d.toReservation(queue, r)
}

func (d *diskStore) putReservation(r *reservation) {
	tx := d.writeTxn(0)
	must(tx.PutReservation(r.last.q.name, r.last.key, &ondisk.Reservation{Until: r.until, ID: r.last.id, Task: fromTask(r.last)}))
}

func (d *diskStore) firstReservation() (*reservation, bool) {
	tx, done := d.txn()
	defer done()
	if tx.Reservations() == 0 {
		return nil, false
	}
	var first *reservation
	must(tx.AscendReservations(func(queue, _ string, r *ondisk.Reservation) bool {
		first = d.toReservation(queue, r)
		return false
	}))
	return first, first != nil
}

func (d *diskStore) dropReservation(r *reservation) {
	tx := d.writeTxn(0)
	must(tx.DeleteReservation(r.last.q.name, r.last.key))
}

func (d *diskStore) ascendReservations(fn func(*reservation) bool) {
	tx, done := d.txn()
	defer done()
	var all []*reservation
	must(tx.AscendReservations(func(queue, _ string, r *ondisk.Reservation) bool {
		all = append(all, d.toReservation(queue, r))
		return true
	}))
	for _, r := range all {
		if !fn(r) {
			return
		}
	}
}

// closedChan is a flush that is already done.
var closedChan = func() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

func (d *diskStore) reservationCount() int {
	tx, done := d.txn()
	defer done()
	return int(tx.Reservations())
}

// snapshot is a snapshot of st, whose store d is, that copies nothing: a
// view of the engine (a Pebble snapshot and the per-queue records) that
// Persist streams while entries go on applying. With flush, the engine
// flushes what is committed meanwhile, and Persist waits for that before
// it reports the snapshot taken: raft then truncates the log it covers, so
// the state on disk must not be older (DESIGN.md, "Durability without a
// sync"). A copy that truncates nothing (a backup's) does not flush: the
// flush's new files set off a compaction of the engine's levels below
// them, CPU taken from the writers while the copy runs.
func (d *diskStore) snapshot(st *state, flush bool) (*snapshot, error) {
	flushed := closedChan
	if flush {
		var err error
		if flushed, err = d.st.AsyncFlush(); err != nil {
			return nil, fmt.Errorf("fsm: snapshot: flush the engine: %w", err)
		}
	}
	view := d.st.View()
	snap := st.smallSnapshot()
	nsessions, _ := view.Sessions()
	snap.stream = &snapshotStream{
		tasks: view.TaskCount(), sessions: nsessions, reserved: view.Reservations(),
		eachTask: func(fn func(*task) error) error {
			for _, name := range view.QueueNames() {
				q := &queue{name: name, group: groupOf(name)}
				var ferr error
				err := view.AscendQueue(name, nil, func(id string, tk *ondisk.Task) bool {
					ferr = fn(d.toTask(view, id, tk, q))
					return ferr == nil
				})
				if err = cmp.Or(ferr, err); err != nil {
					return err
				}
			}
			return nil
		},
		eachSession: func(fn func(*session) error) error {
			var ferr error
			err := view.AscendSessions(func(client string, s *ondisk.Session) bool {
				ferr = fn(toSession(client, s))
				return ferr == nil
			})
			return cmp.Or(ferr, err)
		},
		eachReserved: func(fn func(*reservation) error) error {
			var ferr error
			err := view.AscendReservations(func(queue, _ string, r *ondisk.Reservation) bool {
				ferr = fn(d.toReservation(queue, r))
				return ferr == nil
			})
			return cmp.Or(ferr, err)
		},
		done: func() error {
			<-flushed
			return nil
		},
		release: view.Discard,
		view:    view,
	}
	return snap, nil
}
