package ondisk

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// TestDeferredRecordsReachTheEngine: the shard's record, a queue's, the
// small record and a session's are written back: a commit leaves them out
// of the engine, putting the pending writes into it writes them, and a
// State opened on the engine then reads what was committed.
func TestDeferredRecordsReachTheEngine(t *testing.T) {
	db := openMem(t)
	s, err := Open(db, 1)
	if err != nil {
		t.Fatal(err)
	}
	commitTxn(t, s, 7, func(tx *Txn) error {
		if err := tx.Put("x", "g/q", &Task{Version: 1, Value: []byte("v")}); err != nil {
			return err
		}
		if err := tx.PutSession("c1", &Session{Seq: 3, LastSeen: 11, Result: []byte("r")}); err != nil {
			return err
		}
		return tx.PutSmall([]byte("small"))
	})
	keys := map[string][]byte{"shard": MetaKey(1, "shard"), "queue": QueueKey(1, "g/q"), "small": MetaKey(1, "small"), "session": SessionKey(1, "c1")}
	for name, k := range keys {
		if _, c, err := db.Get(k); !errors.Is(err, pebble.ErrNotFound) {
			if err == nil {
				c.Close()
			}
			t.Errorf("%s record in the engine before the pending writes are: %v", name, err)
		}
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	for name, k := range keys {
		if _, c, err := db.Get(k); err != nil {
			t.Errorf("%s record not in the engine after the pending writes are: %v", name, err)
		} else {
			c.Close()
		}
	}
	again, err := Open(db, 1)
	if err != nil {
		t.Fatal(err)
	}
	if again.Applied() != 7 || again.Digest() != s.Digest() {
		t.Errorf("reopened at %d with digest %x, want 7 and %x", again.Applied(), again.Digest().Bytes(), s.Digest().Bytes())
	}
	if st, ok := again.Stats("g/q"); !ok || st.Total != 1 {
		t.Errorf("reopened queue g/q: %+v, %v; want 1 task", st, ok)
	}
	if small, err := again.Small(); err != nil || string(small) != "small" {
		t.Errorf("reopened small record: %q, %v", small, err)
	}
	tx := again.BeginRead()
	defer tx.Discard()
	if ss, err := tx.Session("c1"); err != nil || ss == nil || ss.Seq != 3 || string(ss.Result) != "r" {
		t.Errorf("reopened session c1: %+v, %v", ss, err)
	}
}

// TestDeferredSessionAfterRecentLetItGo: a session replaced since the
// engine last took the pending writes, and gone from the recent records
// (recentMax other sessions were written after it), reads as replaced,
// not as the engine's older record; a deleted one reads as none.
func TestDeferredSessionAfterRecentLetItGo(t *testing.T) {
	s, err := Open(openMem(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	commitTxn(t, s, 1, func(tx *Txn) error {
		if err := tx.PutSession("a", &Session{Seq: 1, Result: []byte("old")}); err != nil {
			return err
		}
		return tx.PutSession("b", &Session{Seq: 1, Result: []byte("old")})
	})
	if err := s.commitPending(); err != nil {
		t.Fatal(err)
	}
	commitTxn(t, s, 2, func(tx *Txn) error {
		if err := tx.PutSession("a", &Session{Seq: 2, Result: []byte("new")}); err != nil {
			return err
		}
		return tx.DeleteSession("b")
	})
	commitTxn(t, s, 3, func(tx *Txn) error {
		for i := range recentMax {
			if err := tx.PutSession(fmt.Sprintf("other%d", i), &Session{Seq: 1}); err != nil {
				return err
			}
		}
		return nil
	})
	if _, ok := s.recentSessions.m[string(SessionKey(1, "a"))]; ok {
		t.Fatal("session a still in the recent records: the test reads nothing past them")
	}
	tx := s.Begin()
	defer tx.Discard()
	if a, err := tx.Session("a"); err != nil || a == nil || a.Seq != 2 || !bytes.Equal(a.Result, []byte("new")) {
		t.Errorf("session a: %+v, %v; want its second record", a, err)
	}
	if b, err := tx.Session("b"); err != nil || b != nil {
		t.Errorf("session b, deleted: %+v, %v; want none", b, err)
	}
}

// TestDiscardLeavesNoDeferredRecord: a transaction discarded after it
// wrote a session leaves nothing for the engine or the next transaction.
func TestDiscardLeavesNoDeferredRecord(t *testing.T) {
	s, err := Open(openMem(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	tx := s.Begin()
	if err := tx.PutSession("a", &Session{Seq: 1}); err != nil {
		t.Fatal(err)
	}
	tx.Discard()
	if !s.deferred.empty() {
		t.Fatalf("deferred records after a discard: %+v", s.deferred)
	}
	next := s.Begin()
	defer next.Discard()
	if a, err := next.Session("a"); err != nil || a != nil {
		t.Errorf("session a after its transaction was discarded: %+v, %v", a, err)
	}
}

// TestDeferredSessionsAreBounded: commits that write nothing but sessions
// put them into the engine once deferredSessionsMax are written back, not
// only at the next read or snapshot.
func TestDeferredSessionsAreBounded(t *testing.T) {
	db := openMem(t)
	s, err := Open(db, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range deferredSessionsMax {
		commitTxn(t, s, uint64(i+1), func(tx *Txn) error {
			return tx.PutSession(fmt.Sprintf("c%d", i), &Session{Seq: 1})
		})
	}
	if n := len(s.deferred.sessions); n != 0 {
		t.Fatalf("%d sessions still written back after %d commits", n, deferredSessionsMax)
	}
	if _, c, err := db.Get(SessionKey(1, "c0")); err != nil {
		t.Fatalf("the first session is not in the engine: %v", err)
	} else {
		c.Close()
	}
}
