package ondisk

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

func openMem(t *testing.T) *pebble.DB {
	t.Helper()
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), DisableWAL: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// model is the state as fsm defines it, in plain maps.
type model struct {
	clock    int64
	tasks    map[string]modelTask
	sessions map[string]Session
}

func (m *model) oldestSession() (string, int64) {
	best, seen := "", int64(0)
	for c, s := range m.sessions {
		if best == "" || s.LastSeen < seen || s.LastSeen == seen && c < best {
			best, seen = c, s.LastSeen
		}
	}
	return best, seen
}

type modelTask struct {
	queue string
	Task
}

func (m *model) claimable(queue string) []string {
	var ids []string
	for id, t := range m.tasks {
		if t.queue == queue && t.At <= m.clock {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b string) int {
		x, y := m.tasks[a], m.tasks[b]
		if c := cmp.Compare(y.Priority, x.Priority); c != 0 {
			return c
		}
		if c := cmp.Compare(x.At, y.At); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return ids
}

func (m *model) stats(queue string) (QueueStats, bool) {
	var st QueueStats
	for _, t := range m.tasks {
		if t.queue != queue {
			continue
		}
		st.Total++
		switch {
		case t.At <= m.clock:
			st.Available++
		case t.Claimant != "":
			st.Claimed++
		default:
			st.Delayed++
		}
	}
	return st, st.Total > 0
}

// TestStateAgreesWithModel applies random transactions (inserts, changes,
// deletes, clock moves, claims that take the first available tasks, some
// transactions discarded) to a State and to a model, and after each
// commit compares tasks, claim order, counts and unique keys, the
// incremental digest with one computed from scratch, and a State reopened
// from the engine with the live one.
func TestStateAgreesWithModel(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { checkAgainstModel(t, seed) })
	}
}

// TestStateAgreesWithModelSmallHeads runs the model with queue heads in
// memory much shorter than the queues, so that claims run off their end,
// fill them and fall back to the index; compare checks after every commit
// that each head is the first keys of its queue's claim index, with their
// records.
func TestStateAgreesWithModelSmallHeads(t *testing.T) {
	defer func(m, f int) { headMax, headFill = m, f }(headMax, headFill)
	headMax, headFill = 4, 2
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { checkAgainstModel(t, seed+100) })
	}
}

// checkHeads fails unless every queue's head in memory is the first keys
// of its claim index (all of them when complete), with their records.
func checkHeads(t *testing.T, step int, s *State) {
	t.Helper()
	for name, q := range s.queues {
		if q.cache == nil {
			continue
		}
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: ClaimPrefix(s.shard, q.num), UpperBound: ClaimPrefix(s.shard, q.num+1)})
		if err != nil {
			t.Fatal(err)
		}
		var keys [][]byte
		for ok := it.First(); ok; ok = it.Next() {
			keys = append(keys, bytes.Clone(it.Key()))
		}
		it.Close()
		c := q.cache
		if len(c.entries) > len(keys) || c.complete && len(c.entries) != len(keys) {
			t.Fatalf("step %d: head of %s: %d entries (complete %v), index %d keys", step, name, len(c.entries), c.complete, len(keys))
		}
		for i, e := range c.entries {
			if !bytes.Equal(e.key, keys[i]) {
				t.Fatalf("step %d: head of %s: entry %d is %x, index %x", step, name, i, e.key, keys[i])
			}
			if e.tk == nil {
				continue
			}
			raw, closer, err := s.db.Get(TaskKey(s.shard, GroupOf(name), e.id))
			if err != nil {
				t.Fatalf("step %d: head of %s: %s: %v", step, name, e.id, err)
			}
			if !bytes.Equal(raw, AppendTask(nil, e.tk)) {
				t.Fatalf("step %d: head of %s: record of %s differs from the engine's", step, name, e.id)
			}
			closer.Close()
		}
	}
}

func checkAgainstModel(t *testing.T, seed uint64) {
	db := openMem(t)
	s, err := Open(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	// A neighbour shard in the same engine must not be disturbed.
	other, err := Open(db, 4)
	if err != nil {
		t.Fatal(err)
	}
	otx := other.Begin()
	if err := otx.Put("x", "q0", &Task{At: 1, Value: []byte("other shard")}); err != nil {
		t.Fatal(err)
	}
	if err := otx.Commit(1); err != nil {
		t.Fatal(err)
	}

	r := rand.New(rand.NewPCG(seed, 99))
	m := &model{tasks: map[string]modelTask{}, sessions: map[string]Session{}}
	// Two groups: a task changes queues within its group only (as in fsm);
	// TestSameIDInTwoGroups covers one id in both.
	queues := []string{"g/q0", "g/q1", "g", "h/q3"}
	groupOf := func(id string, m *model) string {
		if t, ok := m.tasks[id]; ok {
			return GroupOf(t.queue)
		}
		return "g"
	}
	var version uint64
	for step := range 400 {
		tx := s.Begin()
		next := &model{clock: m.clock, tasks: maps(m.tasks), sessions: clone(m.sessions)}
		for range 1 + r.IntN(6) {
			id := fmt.Sprintf("t%d", r.IntN(60))
			if r.IntN(3) == 0 { // an exactly-once record: store, forget or evict the oldest
				client := fmt.Sprintf("c%d", r.IntN(8))
				switch r.IntN(4) {
				case 0, 1:
					rec := Session{Seq: uint64(step), LastSeen: next.clock + int64(r.IntN(5)), Result: []byte(fmt.Sprint("answer ", step))}
					if err := tx.PutSession(client, &rec); err != nil {
						t.Fatal(err)
					}
					next.sessions[client] = rec
				case 2:
					if err := tx.DeleteSession(client); err != nil {
						t.Fatal(err)
					}
					delete(next.sessions, client)
				default:
					want, wseen := next.oldestSession()
					if since, known := tx.SessionsSeenSince(); known && (want == "" || since > wseen) {
						t.Fatalf("step %d: no session seen before %d, model's oldest %q at %d", step, since, want, wseen)
					}
					got, seen, err := tx.OldestSession()
					if err != nil {
						t.Fatal(err)
					}
					if got != want || (want != "" && seen != wseen) {
						t.Fatalf("step %d: oldest session %q at %d, model %q at %d", step, got, seen, want, wseen)
					}
					if got != "" {
						if err := tx.DeleteSession(got); err != nil {
							t.Fatal(err)
						}
						delete(next.sessions, got)
					}
				}
			}
			switch op := r.IntN(10); {
			case op < 5: // insert or change
				version++
				tk := Task{Version: version, Priority: int32(r.IntN(3) - 1), At: next.clock + int64(r.IntN(40)-20),
					Value: []byte(fmt.Sprint(step)), Created: int64(step)}
				if r.IntN(3) == 0 {
					tk.Claimant = "w"
				}
				q := queues[r.IntN(len(queues))]
				if old, ok := next.tasks[id]; ok {
					for GroupOf(q) != GroupOf(old.queue) {
						q = queues[r.IntN(len(queues))]
					}
				}
				if r.IntN(4) == 0 {
					tk.Key = fmt.Sprintf("k%d", r.IntN(5))
					if owner, ok, err := tx.KeyOwner(q, tk.Key); err != nil {
						t.Fatal(err)
					} else if ok && owner != id {
						tk.Key = "" // fsm refuses a taken key; the model keeps it simple
					}
				}
				put := tk
				if err := tx.Put(id, q, &put); err != nil {
					t.Fatal(err)
				}
				next.tasks[id] = modelTask{queue: q, Task: tk}
			case op < 7:
				if err := tx.Delete(groupOf(id, next), id); err != nil {
					t.Fatal(err)
				}
				delete(next.tasks, id)
			case op < 8:
				now := next.clock + int64(r.IntN(15))
				if err := tx.Advance(now, func(string, string, int64) {}); err != nil {
					t.Fatal(err)
				}
				if now > next.clock {
					next.clock = now
				}
			default: // claim up to 2: take them out of the claim order with a lease
				q := queues[r.IntN(len(queues))]
				var got []string
				if err := tx.Claimable(q, func(id string, tk *Task) bool {
					got = append(got, id)
					return len(got) < 2
				}); err != nil {
					t.Fatal(err)
				}
				if want := next.claimable(q); !slices.Equal(got, want[:min(2, len(want))]) {
					t.Fatalf("step %d: claimable %s = %v, model %v", step, q, got, want)
				}
				for _, id := range got {
					c := next.tasks[id]
					version++
					c.Version, c.Claimant, c.At = version, "w", next.clock+10
					put := c.Task
					if err := tx.Put(id, q, &put); err != nil {
						t.Fatal(err)
					}
					next.tasks[id] = c
				}
			}
		}
		if r.IntN(8) == 0 {
			tx.Discard()
			continue
		}
		if err := tx.Commit(uint64(step + 10)); err != nil {
			t.Fatal(err)
		}
		m = next
		if step%16 == 15 {
			// Flushes and compactions are where a single delete drops
			// the set it meets: one that met a key set twice would
			// uncover the older set, an index key of no task.
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := db.Compact(context.Background(), ShardPrefix(3), ShardEnd(3), false); err != nil {
				t.Fatal(err)
			}
		}
		compare(t, step, s, m, queues)
	}
	for _, st := range []*State{s, other} { // what a restart finds is in the engine
		if err := st.commitPending(); err != nil {
			t.Fatal(err)
		}
	}
	reopened, err := Open(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	if reopened.meta != s.meta || len(reopened.queues) != len(s.queues) {
		t.Fatalf("reopened: meta %+v queues %d, live %+v %d", reopened.meta, len(reopened.queues), s.meta, len(s.queues))
	}
	compare(t, -1, reopened, m, queues)
	if got := fromScratch(t, db, 4); got != other.Digest() {
		t.Fatal("the neighbour shard's digest changed")
	}
}

func clone(in map[string]Session) map[string]Session {
	out := make(map[string]Session, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

func maps(in map[string]modelTask) map[string]modelTask {
	out := make(map[string]modelTask, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

func compare(t *testing.T, step int, s *State, m *model, queues []string) {
	t.Helper()
	if s.Clock() != m.clock {
		t.Fatalf("step %d: clock %d, model %d", step, s.Clock(), m.clock)
	}
	// Every other step also checks the engine itself, with the pending
	// writes put into it; the steps between read through them.
	engine := step%2 == 1
	if engine {
		if err := s.commitPending(); err != nil {
			t.Fatal(err)
		}
		checkHeads(t, step, s)
	}
	var due int
	for _, tk := range m.tasks {
		if tk.At > m.clock {
			due++
		}
	}
	if c, d := indexKeys(t, s.db, s.shard, TableClaim), indexKeys(t, s.db, s.shard, TableDue); engine && (c != len(m.tasks) || d != due) {
		t.Fatalf("step %d: %d claim keys and %d due keys, model %d tasks, %d due", step, c, d, len(m.tasks), due)
	}
	tx := s.Begin()
	defer tx.Discard()
	for i := range 60 {
		id := fmt.Sprintf("t%d", i)
		want, ok := m.tasks[id]
		group := "g"
		if ok {
			group = GroupOf(want.queue)
		}
		got, err := tx.Get(group, id)
		if err != nil {
			t.Fatal(err)
		}
		if (got != nil) != ok {
			t.Fatalf("step %d: %s present %v, model %v", step, id, got != nil, ok)
		}
		if !ok {
			continue
		}
		name, err := tx.QueueName(got)
		if err != nil || name != want.queue {
			t.Fatalf("step %d: %s in queue %q (%v), model %q", step, id, name, err, want.queue)
		}
		w := want.Task
		w.Queue = got.Queue
		if !bytes.Equal(AppendTask(nil, got), AppendTask(nil, &w)) {
			t.Fatalf("step %d: %s = %+v, model %+v", step, id, got, w)
		}
		if w.Key != "" {
			owner, ok, err := tx.KeyOwner(want.queue, w.Key)
			if err != nil || !ok || owner != id {
				t.Fatalf("step %d: key %s/%s owner %q %v %v, want %s", step, want.queue, w.Key, owner, ok, err, id)
			}
		}
	}
	for _, q := range queues {
		got, gok := s.Stats(q)
		want, wok := m.stats(q)
		if got != want || gok != wok {
			t.Fatalf("step %d: stats %s = %+v %v, model %+v %v", step, q, got, gok, want, wok)
		}
		var ids []string
		if err := tx.Claimable(q, func(id string, _ *Task) bool { ids = append(ids, id); return true }); err != nil {
			t.Fatal(err)
		}
		if want := m.claimable(q); !slices.Equal(ids, want) {
			t.Fatalf("step %d: claim order of %s = %v, model %v", step, q, ids, want)
		}
	}
	var size uint64
	for c := range 8 {
		client := fmt.Sprintf("c%d", c)
		got, err := tx.Session(client)
		if err != nil {
			t.Fatal(err)
		}
		want, ok := m.sessions[client]
		if (got != nil) != ok || ok && (got.Seq != want.Seq || got.LastSeen != want.LastSeen || !bytes.Equal(got.Result, want.Result)) {
			t.Fatalf("step %d: session %s = %+v, model %+v (%v)", step, client, got, want, ok)
		}
		if ok {
			size += SessionSize(client, &want)
		}
	}
	if n, b := s.Sessions(); n != uint64(len(m.sessions)) || b != size {
		t.Fatalf("step %d: %d sessions of %d bytes, model %d of %d", step, n, b, len(m.sessions), size)
	}
	if got, _, err := tx.OldestSession(); err != nil || got != func() string { c, _ := m.oldestSession(); return c }() {
		t.Fatalf("step %d: oldest session %q (%v)", step, got, err)
	}
	if d := fromScratch(t, s.db, s.shard); engine && d != s.Digest() {
		t.Fatalf("step %d: incremental digest %x, from scratch %x", step, s.Digest().Bytes(), d.Bytes())
	}
}

// fromScratch hashes shard's records the way the digest covers them
// (digest.go): without the storage id, tasks with their queue's name, and
// neither the indexes, the queue records nor the shard's own meta record.
func fromScratch(t *testing.T, db *pebble.DB, shard uint32) Digest {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: ShardPrefix(shard), UpperBound: ShardEnd(shard)})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	names := map[uint32]string{}
	for it.First(); it.Valid(); it.Next() {
		if k := it.Key(); k[4] == TableQueue {
			q, err := decodeQueue(string(k[5:]), it.Value())
			if err != nil {
				t.Fatal(err)
			}
			names[q.num] = q.name
		}
	}
	var d Digest
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		switch k[4] {
		case TableClaim, TableDue, TableKey, TableQueue:
		case TableSessionOrder:
			t.Fatalf("session order key %x: layout %d writes none", k, Layout)
		case TableSession:
			d.Add(k[shardLen:], it.Value())
			seen, err := sessionLastSeen(it.Value())
			if err != nil {
				t.Fatal(err)
			}
			d.Add(SessionOrderKey(shard, seen, string(k[5:]))[shardLen:], nil)
		case TableMeta:
			if string(k[5:]) == "small" {
				d.Add(k[shardLen:], it.Value())
			}
		case TableTask:
			tk, err := DecodeTask(it.Value())
			if err != nil {
				t.Fatal(err)
			}
			name, ok := names[tk.Queue]
			if !ok {
				t.Fatalf("task record %x: no queue numbered %d", k, tk.Queue)
			}
			d.Add(k[shardLen:], digestTask(name, tk))
		default:
			d.Add(k[shardLen:], it.Value())
		}
	}
	return d
}

// TestSameIDInTwoGroups: tasks are keyed by group and id
// (fsm.FormatGroupIDs): one id in two groups is two tasks, each reached
// through its group, both found by Lookup, each claimed from its own
// queue; deleting one leaves the other, and the digest stays that of the
// records.
func TestSameIDInTwoGroups(t *testing.T) {
	db := openMem(t)
	s, err := Open(db, 5)
	if err != nil {
		t.Fatal(err)
	}
	tx := s.Begin()
	for _, q := range []string{"h/b", "g/a"} {
		if err := tx.Put("x", q, &Task{Version: 1, Value: []byte(q)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(1); err != nil {
		t.Fatal(err)
	}
	tx = s.Begin()
	defer tx.Discard()
	var groups []string
	if err := tx.Lookup("x", func(group string, tk *Task) bool {
		groups = append(groups, group+"="+string(tk.Value))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"g=g/a", "h=h/b"}; !slices.Equal(groups, want) {
		t.Fatalf("Lookup(x) = %v, want %v", groups, want)
	}
	if err := tx.Lookup("xy", func(string, *Task) bool { t.Fatal("Lookup(xy) found x's tasks"); return false }); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"g/a", "h/b"} {
		var ids []string
		if err := tx.Claimable(q, func(id string, tk *Task) bool {
			ids = append(ids, id+"="+string(tk.Value))
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if want := []string{"x=" + q}; !slices.Equal(ids, want) {
			t.Fatalf("Claimable(%s) = %v, want %v", q, ids, want)
		}
	}
	if err := tx.Delete("g", "x"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(2); err != nil {
		t.Fatal(err)
	}
	tx = s.Begin()
	defer tx.Discard()
	if got, err := tx.Get("g", "x"); err != nil || got != nil {
		t.Fatalf("g's x after its delete: %v %v", got, err)
	}
	if got, err := tx.Get("h", "x"); err != nil || got == nil || string(got.Value) != "h/b" {
		t.Fatalf("h's x after g's delete: %v %v", got, err)
	}
	if err := s.commitPending(); err != nil {
		t.Fatal(err)
	}
	if got := fromScratch(t, db, 5); got != s.Digest() {
		t.Fatal("the kept digest is not the digest of the records")
	}
}

// TestDigestIgnoresStorageIDAndQueueNumbers: the same tasks, sessions and
// small state reached in another order, under another storage id (as after
// an install), with the queues numbered in another order and a queue
// emptied and created again, give the same digest; another value does not.
func TestDigestIgnoresStorageIDAndQueueNumbers(t *testing.T) {
	db := openMem(t)
	fill := func(shard uint32, queues []string, churn bool, value string) Digest {
		s, err := Open(db, shard)
		if err != nil {
			t.Fatal(err)
		}
		tx := s.Begin()
		if churn { // queue "c" numbered, emptied, gone: numbers move on
			if err := tx.Put("tmp", "c", &Task{Version: 1}); err != nil {
				t.Fatal(err)
			}
			if err := tx.Delete("c", "tmp"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(1); err != nil {
				t.Fatal(err)
			}
			tx = s.Begin()
		}
		for _, q := range queues {
			if err := tx.Put(fmt.Sprint("id", q), q, &Task{Version: uint64(len(q)), Priority: int32(q[0]), At: 50, Key: "k" + q, Value: []byte(value)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.PutSession("cl", &Session{LastSeen: 7, Group: "g"}); err != nil {
			t.Fatal(err)
		}
		if err := tx.PutSmall([]byte("small")); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(2); err != nil {
			t.Fatal(err)
		}
		return s.Digest()
	}
	a := fill(2, []string{"a", "b"}, false, "v")
	b := fill(7, []string{"b", "a"}, true, "v")
	if a != b {
		t.Fatalf("same records, different digests: %x %x", a.Bytes(), b.Bytes())
	}
	if c := fill(9, []string{"a", "b"}, false, "w"); c == a {
		t.Fatal("another value, the same digest")
	}
}

// indexKeys counts the keys of one of shard's tables in db.
func indexKeys(t *testing.T, db *pebble.DB, shard uint32, table byte) int {
	t.Helper()
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: tableKey(shard, table, 0), UpperBound: tableKey(shard, table+1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for it.First(); it.Valid(); it.Next() {
		n++
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSmallDigest: the small record's hash leaves the digest as it came
// in, whether the record was read back from the engine or kept from the
// commit that wrote it, written twice in one transaction, or written by a
// discarded one: the digest after all that is the one of the last record
// written alone, and the record reads back.
func TestSmallDigest(t *testing.T) {
	db := openMem(t)
	put := func(s *State, commit bool, recs ...string) {
		t.Helper()
		tx := s.Begin()
		for _, r := range recs {
			if err := tx.PutSmall([]byte(r)); err != nil {
				t.Fatal(err)
			}
		}
		if !commit {
			tx.Discard()
			return
		}
		if err := tx.Commit(1); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Open(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	put(s, true, "a")
	put(s, true, "b", "c")
	put(s, false, "x")
	put(s, true, "d")
	// A new State over the same range reads the record from the engine.
	s2, err := Open(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	put(s2, true, "e")
	if got, err := s2.Small(); err != nil || string(got) != "e" {
		t.Fatalf("Small() = %q, %v; want e", got, err)
	}
	alone, err := Open(db, 4)
	if err != nil {
		t.Fatal(err)
	}
	put(alone, true, "e")
	if s2.Digest() != alone.Digest() {
		t.Fatalf("digest %x, want %x (the record e alone)", s2.Digest().Bytes(), alone.Digest().Bytes())
	}
}
