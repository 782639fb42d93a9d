package ondisk

import (
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
		commit := func(applied uint64, fn func(*Txn) error) {
			t.Helper()
			tx := s.Begin()
			if err := fn(tx); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(applied); err != nil {
				t.Fatal(err)
			}
		}
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
