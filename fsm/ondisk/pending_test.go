package ondisk

import (
	"fmt"
	"testing"
)

// TestPendingWritesCancel: what commits write stays in the State's
// pending batch until it is put into the engine, so a task inserted and
// deleted by two commits in between never reaches the engine; put into
// the engine in between, both writes do.
func TestPendingWritesCancel(t *testing.T) {
	written := func(settleBetween bool) uint64 {
		s, err := Open(openMem(t), 1)
		if err != nil {
			t.Fatal(err)
		}
		commit := func(applied uint64, fn func(*Txn) error) { t.Helper(); commitTxn(t, s, applied, fn) }
		commit(1, func(tx *Txn) error { return tx.Put("x", "g/q", &Task{Version: 1, Value: []byte("v"), At: 5}) })
		if settleBetween {
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		commit(2, func(tx *Txn) error { return tx.Delete("g", "x") })
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
		// Both read the same afterwards, from the engine.
		tx := s.BeginRead()
		defer tx.Discard()
		if tk, err := tx.Get("g", "x"); err != nil || tk != nil {
			t.Fatalf("x after its delete: %v, %v", tk, err)
		}
		keys, _ := s.Written()
		return keys
	}
	together, apart := written(false), written(true)
	if together >= apart {
		t.Fatalf("an insert and a delete in one pending batch wrote %d keys into the engine, put there one at a time %d: want fewer", together, apart)
	}
}

// commitTxn runs fn in a transaction of s and commits it at applied.
func commitTxn(t *testing.T, s *State, applied uint64, fn func(*Txn) error) {
	t.Helper()
	tx := s.Begin()
	if err := fn(tx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(applied); err != nil {
		t.Fatal(err)
	}
}

// TestReadsSeePendingWrites: a read beside the apply (BeginRead) and a
// view see what was committed, though it has not reached the engine.
func TestReadsSeePendingWrites(t *testing.T) {
	s, err := Open(openMem(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	tx := s.Begin()
	if err := tx.Put("x", "g/q", &Task{Version: 1, Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(1); err != nil {
		t.Fatal(err)
	}
	if s.pending == nil {
		t.Fatal("a small commit went into the engine at once: nothing pending to read")
	}
	for name, r := range map[string]*Txn{"read": s.BeginRead(), "view": s.View()} {
		tk, err := r.Get("g", "x")
		if err != nil || tk == nil || string(tk.Value) != "v" {
			t.Errorf("%s: x is %v, %v; want its value v", name, tk, err)
		}
		r.Discard()
	}
}

// TestDiscardOfAnEarlierTransaction: a transaction that only read,
// discarded after the pending batch it read went into the engine and a
// new one took later commits, drops nothing of them (Pebble reuses closed
// batches, so the new batch may be the same object as its old one).
func TestDiscardOfAnEarlierTransaction(t *testing.T) {
	s, err := Open(openMem(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		early := s.Begin()
		if err := s.commitPending(); err != nil { // a read beside the apply would
			t.Fatal(err)
		}
		tx := s.Begin()
		id := fmt.Sprintf("x%d", i)
		if err := tx.Put(id, "g/q", &Task{Version: 1, Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(uint64(i + 1)); err != nil {
			t.Fatal(err)
		}
		early.Discard()
		r := s.BeginRead()
		tk, err := r.Get("g", id)
		r.Discard()
		if err != nil || tk == nil {
			t.Fatalf("round %d: %s after an earlier transaction's discard: %v, %v", i, id, tk, err)
		}
	}
}
