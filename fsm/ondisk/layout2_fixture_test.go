package ondisk

import (
	"context"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// layout2Digest is the digest the layout-2 fixture's binary recorded.
const layout2Digest = "55191886c0695c45115effea5f3a85a95e962ebb8f187fa73c24b54e4d5e0819"

var writeLayout2 = flag.String("ondisk.write-layout2", "", "write the layout-2 fixture (testdata/layout2) into this directory and stop; only a binary of layout 2 writes it as it is")

// TestWriteLayout2Fixture writes testdata/layout2 when asked
// (-ondisk.write-layout2 DIR), with a binary of layout 2: shard 3, queue
// g/q, task "a" (available) and task "b" (due at 100, past the clock of
// 1), each written, flushed, and written again with the same priority and
// at, flushed, so that the engine holds two sets of the same claim key
// (a) and due key (b) in different files, as a layout-2 binary left them
// after replacing a task without moving it.
func TestWriteLayout2Fixture(t *testing.T) {
	dir := *writeLayout2
	if dir == "" {
		t.Skip("-ondisk.write-layout2 not given")
	}
	db, err := pebble.Open(dir, layout2Options())
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range []string{"first", "second"} {
		tx := s.Begin()
		if err := tx.Advance(1, func(string, string, int64) {}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Put("a", "g/q", &Task{Version: uint64(i + 1), Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Put("b", "g/q", &Task{Version: uint64(i + 1), At: 100, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(uint64(10 + i)); err != nil {
			t.Fatal(err)
		}
		if err := db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("layout %d, digest %x", s.meta.layout, s.Digest().Bytes())
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// layout2Options are fixtureOptions without automatic compactions, which
// would merge the fixture's files (and the two sets of each key in them).
func layout2Options() *pebble.Options {
	o := fixtureOptions()
	o.DisableAutomaticCompactions = true
	return o
}

// flushAndCompact writes the memtables out and compacts shard's range:
// where a single delete meets the set it deletes.
func flushAndCompact(t *testing.T, db *pebble.DB, shard uint32) {
	t.Helper()
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Compact(context.Background(), ShardPrefix(shard), ShardEnd(shard), false); err != nil {
		t.Fatal(err)
	}
}

// TestReplacedInPlaceThenDeleted: a task replaced without moving (the
// same claim and due keys) and then deleted leaves no claim or due key
// once flushes and compactions have run: a single delete correct only
// for a key set once since its last delete, which a set of the key over
// itself would break (the older set would come back).
func TestReplacedInPlaceThenDeleted(t *testing.T) {
	// No automatic compactions: one would merge the sets before the
	// delete comes.
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), DisableWAL: true, DisableAutomaticCompactions: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := Open(db, 1)
	if err != nil {
		t.Fatal(err)
	}
	step := func(applied uint64, fn func(tx *Txn) error) {
		t.Helper()
		commitTxn(t, s, applied, fn)
		if err := s.Flush(); err != nil { // each write in a file of its own
			t.Fatal(err)
		}
	}
	put := func(v string) func(tx *Txn) error {
		return func(tx *Txn) error {
			if err := tx.Put("a", "g/q", &Task{Value: []byte(v), At: 5}); err != nil {
				return err
			}
			return tx.Put("b", "g/q", &Task{Value: []byte(v), At: 50})
		}
	}
	step(1, func(tx *Txn) error { return tx.Advance(10, func(string, string, int64) {}) })
	step(2, put("first"))
	step(3, put("second"))
	step(4, put("third"))
	if c, d := indexKeys(t, db, 1, TableClaim), indexKeys(t, db, 1, TableDue); c != 2 || d != 1 {
		t.Fatalf("%d claim keys, %d due keys; want 2, 1", c, d)
	}
	step(5, func(tx *Txn) error {
		if err := tx.Delete("g", "a"); err != nil {
			return err
		}
		return tx.Delete("g", "b")
	})
	flushAndCompact(t, db, 1)
	if c, d := indexKeys(t, db, 1, TableClaim), indexKeys(t, db, 1, TableDue); c != 0 || d != 0 {
		t.Fatalf("%d claim keys, %d due keys after the tasks' deletion", c, d)
	}
	if got := fromScratch(t, db, 1); got != s.Digest() {
		t.Fatalf("digest from the records %x, the state's %x", got.Bytes(), s.Digest().Bytes())
	}
}

// TestOpenUpgradesLayout2: a range a binary of layout 2 wrote
// (testdata/layout2), whose claim key (a) and due key (b) were each set
// twice in two files, opens in layout 3 with the digest that binary
// recorded; deleting both tasks, with single deletes, then leaves no
// index key after a compaction, and the range stays upgraded after a
// reopen.
func TestOpenUpgradesLayout2(t *testing.T) {
	dir := t.TempDir()
	entries, err := os.ReadDir("testdata/layout2")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("testdata/layout2", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	db, err := pebble.Open(dir, layout2Options())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { db.Close() }()
	defer func(n int) { rewriteChunk = n }(rewriteChunk)
	rewriteChunk = 1 // a batch per key: the chunks' bounds are tested too
	s, err := Open(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	if s.meta.layout != Layout {
		t.Fatalf("opened at layout %d, want %d", s.meta.layout, Layout)
	}
	if d := s.Digest().Bytes(); hex.EncodeToString(d[:]) != layout2Digest {
		t.Fatalf("digest %x after the upgrade, want %s", d, layout2Digest)
	}
	if got := fromScratch(t, db, 3); got != s.Digest() {
		t.Fatalf("digest from the records %x, the state's %x", got.Bytes(), s.Digest().Bytes())
	}
	if c, d := indexKeys(t, db, 3, TableClaim), indexKeys(t, db, 3, TableDue); c != 2 || d != 1 {
		t.Fatalf("%d claim keys, %d due keys after the upgrade; want 2, 1", c, d)
	}
	tx := s.Begin()
	var ids []string
	if err := tx.Claimable("g/q", func(id string, _ *Task) bool { ids = append(ids, id); return true }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []string{"a"}) {
		t.Fatalf("claimable %v, want [a]", ids)
	}
	for _, id := range []string{"a", "b"} {
		if err := tx.Delete("g", id); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(20); err != nil {
		t.Fatal(err)
	}
	if err := s.commitPending(); err != nil {
		t.Fatal(err)
	}
	flushAndCompact(t, db, 3)
	if c, d := indexKeys(t, db, 3, TableClaim), indexKeys(t, db, 3, TableDue); c != 0 || d != 0 {
		t.Fatalf("%d claim keys, %d due keys after the tasks' deletion", c, d)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if db, err = pebble.Open(dir, layout2Options()); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(db, 3); err != nil {
		t.Fatal(err)
	}
	if s.meta.layout != Layout || s.Applied() != 20 || s.Queues() != 0 {
		t.Fatalf("reopened at layout %d, applied %d, %d queues; want %d, 20, 0", s.meta.layout, s.Applied(), s.Queues(), Layout)
	}
}
