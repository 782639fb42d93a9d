package ondisk

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// TestPrefetchReadsAsGetDoes: after Prefetch, the transaction's Gets answer
// as a transaction's Gets without it do: tasks committed and flushed (in
// the table files), written or deleted earlier in the same transaction,
// absent, of another group, of another shard, and ids that are prefixes
// of each other.
func TestPrefetchReadsAsGetDoes(t *testing.T) {
	db := openMem(t)
	s, err := Open(db, 5)
	if err != nil {
		t.Fatal(err)
	}
	other, err := Open(db, 6)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []*State{s, other} {
		tx := st.Begin()
		for i := range 50 {
			id := fmt.Sprintf("t%d", i)
			if err := tx.Put(id, "g/q", &Task{Version: 1, Value: []byte(fmt.Sprintf("%d-%s", st.shard, id))}); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Put("x", "h/q", &Task{Version: 1, Value: []byte("h")}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(1); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	ids := []string{"t7", "t1", "t10", "t100", "x", "t49", "t3", "t60", "new", "t", ""}
	// stage does the same to both transactions: the reads Prefetch must
	// see come from the transaction's own batch.
	stage := func(tx *Txn) {
		if err := tx.Put("new", "g/q", &Task{Version: 1, Value: []byte("new")}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Put("t60", "g/q", &Task{Version: 1, Value: []byte("t60")}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Delete("g", "t3"); err != nil {
			t.Fatal(err)
		}
	}
	with, without := s.Begin(), s.Begin()
	defer with.Discard()
	defer without.Discard()
	stage(with)
	stage(without)
	// Drop what stage remembered and what the commits left, so that
	// Prefetch reads the batch and the engine.
	with.tasks, s.recent = nil, recentSet[Task]{}
	if err := with.Prefetch("g", ids); err != nil {
		t.Fatal(err)
	}
	if got := len(with.tasks); got != len(ids) {
		t.Fatalf("Prefetch remembered %d tasks, want %d", got, len(ids))
	}
	want := map[string]string{"t7": "5-t7", "t1": "5-t1", "t10": "5-t10", "t49": "5-t49", "t60": "t60", "new": "new"}
	for _, id := range ids {
		a, err := with.Get("g", id)
		if err != nil {
			t.Fatal(err)
		}
		b, err := without.Get("g", id)
		if err != nil {
			t.Fatal(err)
		}
		var av, bv string
		if a != nil {
			av = string(a.Value)
		}
		if b != nil {
			bv = string(b.Value)
		}
		if av != bv || av != want[id] {
			t.Errorf("Get(g, %q): %q after Prefetch, %q without, want %q", id, av, bv, want[id])
		}
	}
}

// TestRecentRecordsFollowCommits: the records a State keeps from recent
// commits (State.recent) answer as the engine would: a later commit
// replaces or removes them, a discarded transaction leaves them alone, and
// a view reads its own snapshot, not a commit made after it.
func TestRecentRecordsFollowCommits(t *testing.T) {
	s, err := Open(openMem(t), 5)
	if err != nil {
		t.Fatal(err)
	}
	write := func(applied uint64, commit bool, fn func(tx *Txn) error) {
		t.Helper()
		tx := s.Begin()
		if err := fn(tx); err != nil {
			t.Fatal(err)
		}
		if !commit {
			tx.Discard()
			return
		}
		if err := tx.Commit(applied); err != nil {
			t.Fatal(err)
		}
	}
	put := func(v string) func(tx *Txn) error {
		return func(tx *Txn) error {
			if err := tx.PutSession("c", &Session{LastSeen: int64(len(v))}); err != nil {
				return err
			}
			return tx.Put("x", "g/q", &Task{Version: 1, Value: []byte(v)})
		}
	}
	read := func(tx *Txn) (value string, seen int64) {
		t.Helper()
		tk, err := tx.Get("g", "x")
		if err != nil {
			t.Fatal(err)
		}
		ss, err := tx.Session("c")
		if err != nil {
			t.Fatal(err)
		}
		if tk != nil {
			value = string(tk.Value)
		}
		if ss != nil {
			seen = ss.LastSeen
		}
		return value, seen
	}
	check := func(tx *Txn, what, value string, seen int64) {
		t.Helper()
		defer tx.Discard()
		if v, l := read(tx); v != value || l != seen {
			t.Errorf("%s: task %q, session seen %d; want %q, %d", what, v, l, value, seen)
		}
	}
	write(1, true, put("a"))
	view := s.View()
	write(2, true, put("bb"))
	check(view, "a view from before the second commit", "a", 1)
	check(s.Begin(), "after the second commit", "bb", 2)
	write(3, false, put("ccc"))
	check(s.Begin(), "after a discarded transaction", "bb", 2)
	write(4, true, func(tx *Txn) error {
		if err := tx.DeleteSession("c"); err != nil {
			return err
		}
		return tx.Delete("g", "x")
	})
	check(s.Begin(), "after the deletes", "", 0)
	write(5, true, put("dddd"))
	if err := s.Clear(); err != nil {
		t.Fatal(err)
	}
	check(s.Begin(), "after Clear", "", 0)
}

// TestRecentSetStaysBounded: a recentSet starts over at recentMax records
// or recentBytes, keeps no record over a sixteenth of recentBytes (and
// drops the version it held of one), and counts its bytes exactly.
func TestRecentSetStaysBounded(t *testing.T) {
	var r recentSet[Task]
	size := func(tk *Task) int { return len(tk.Value) }
	count := func() int {
		n := 0
		for k, tk := range r.m {
			n += len(k) + size(tk)
		}
		return n
	}
	for i := range recentMax + 10 {
		r.update(map[string]*Task{fmt.Sprintf("k%05d", i): {Value: []byte("v")}}, size)
		if len(r.m) > recentMax || r.bytes != count() {
			t.Fatalf("after %d records: %d held, %d bytes counted, %d held", i+1, len(r.m), r.bytes, count())
		}
	}
	if len(r.m) != 10 {
		t.Fatalf("%d records held after starting over once; want 10", len(r.m))
	}
	r.update(map[string]*Task{"k00000": {Value: make([]byte, recentBytes/8)}, "k04100": nil}, size)
	if _, ok := r.m["k00000"]; ok {
		t.Fatal("a record over recentBytes/16 was kept")
	}
	if _, ok := r.m["k04100"]; ok {
		t.Fatal("a record deleted by a commit was kept")
	}
	for i := range 40 {
		r.update(map[string]*Task{fmt.Sprintf("b%d", i): {Value: make([]byte, recentBytes/20)}}, size)
		if r.bytes > recentBytes || r.bytes != count() {
			t.Fatalf("after %d big records: %d bytes counted, %d held, bound %d", i+1, r.bytes, count(), recentBytes)
		}
	}
}

// TestPrefetchFailsOnAFailedRead: a read of the table files that fails
// while Prefetch seeks makes Prefetch fail, even when every later seek
// succeeds (a seek clears the iterator's error), rather than pass the
// task off as absent.
func TestPrefetchFailsOnAFailedRead(t *testing.T) {
	var failures atomic.Int32 // reads of table files still to fail
	s, ids := readFailingState(t, func() bool { return failures.Add(-1) >= 0 })
	tx := s.Begin()
	defer tx.Discard()
	failures.Store(1)
	if err := tx.Prefetch("g", ids); !errors.Is(err, errorfs.ErrInjected) {
		t.Fatalf("Prefetch with a failed read: %v, want the injected error", err)
	}
	if failures.Load() == 1 {
		t.Fatal("no read of a table file was failed: the test did not test anything")
	}
}

// TestAddReadsNothing: Add (a task the caller knows is new) writes without
// reading the state, so a batch of new tasks costs no reads of a large
// store; Put, which replaces the previous version, reads it. Every read of
// a table file fails here.
func TestAddReadsNothing(t *testing.T) {
	var failing atomic.Bool
	s, _ := readFailingState(t, failing.Load)

	failing.Store(true)
	tx := s.Begin()
	for i := range 100 {
		if err := tx.Add(fmt.Sprintf("n%03d", i), "g/q", &Task{Version: 1, Value: []byte("new")}); err != nil {
			t.Fatalf("Add with every table read failing: %v", err)
		}
	}
	if err := tx.Put("n100", "g/q", &Task{Version: 1}); !errors.Is(err, errorfs.ErrInjected) {
		t.Fatalf("Put with every table read failing: %v, want the injected error (it reads the previous version)", err)
	}
	tx.Discard()

	tx = s.Begin()
	for i := range 100 {
		if err := tx.Add(fmt.Sprintf("n%03d", i), "g/q", &Task{Version: 1, Value: []byte("new")}); err != nil {
			t.Fatal(err)
		}
	}
	failing.Store(false)
	if err := tx.Commit(2); err != nil {
		t.Fatal(err)
	}
	tx = s.Begin()
	defer tx.Discard()
	for _, id := range []string{"t000", "n000", "n099"} {
		tk, err := tx.Get("g", id)
		if err != nil || tk == nil {
			t.Fatalf("Get %s after the adds: %v, %v", id, tk, err)
		}
	}
	if total, _, _, _ := tx.QueueCounts("g/q"); total != 300 {
		t.Fatalf("queue holds %d tasks, want 300", total)
	}
}

// readFailingState is a state on an in-memory engine, without a block
// cache so that every block read reaches the files, whose reads of table
// files fail while fail() says so. It holds 200 tasks of group g (their
// ids are returned) in a table file, and no recent records.
func readFailingState(t *testing.T, fail func() bool) (*State, []string) {
	t.Helper()
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if (op.Kind == errorfs.OpFileReadAt || op.Kind == errorfs.OpFileRead) && strings.HasSuffix(op.Path, ".sst") && fail() {
			return errorfs.ErrInjected
		}
		return nil
	})
	cache := pebble.NewCache(0)
	t.Cleanup(cache.Unref)
	db, err := pebble.Open("", &pebble.Options{FS: errorfs.Wrap(vfs.NewMem(), inj), DisableWAL: true, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := Open(db, 5)
	if err != nil {
		t.Fatal(err)
	}
	tx := s.Begin()
	var ids []string
	for i := range 200 {
		id := fmt.Sprintf("t%03d", i)
		ids = append(ids, id)
		if err := tx.Put(id, "g/q", &Task{Version: 1, Value: bytes.Repeat([]byte{'v'}, 100)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(1); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.recent = recentSet[Task]{}
	return s, ids
}
