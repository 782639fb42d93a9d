package ondisk

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// layout1Digest is the digest the layout-1 fixture's binary recorded
// (testdata/layout1: shard 3, three tasks, five sessions, one of them
// touched in a later commit, a reservation, written by a binary of
// layout 1 and flushed).
const layout1Digest = "1b65884dc5ced490c7042e5c0e9d0672da272b41c9015518cce7ecf55ece2bc0"

// openFixture copies testdata/layout1 into a directory of its own and
// opens it.
func openFixture(t *testing.T) (*pebble.DB, string) {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir("testdata/layout1")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("testdata/layout1", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	db, err := pebble.Open(dir, fixtureOptions())
	if err != nil {
		t.Fatal(err)
	}
	return db, dir
}

// fixtureOptions are the engine's options, without its log lines.
func fixtureOptions() *pebble.Options {
	o := EngineOptions(8 << 20)
	o.Logger = quiet{}
	return o
}

type quiet struct{}

func (quiet) Infof(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}
func (quiet) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

func sessionOrderKeys(t *testing.T, db *pebble.DB, shard uint32) int {
	t.Helper()
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: tableKey(shard, TableSessionOrder, 0), UpperBound: tableKey(shard, TableSessionOrder+1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for it.First(); it.Valid(); it.Next() {
		n++
	}
	return n
}

func sessionsInOrder(t *testing.T, s *State) []string {
	t.Helper()
	tx := s.Begin()
	defer tx.Discard()
	var got []string
	if err := tx.AscendSessions(func(client string, _ *Session) bool {
		got = append(got, client)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestOpenUpgradesLayout1: a range written by a binary of layout 1 (with
// session order keys) opens: its order keys are gone, the sessions come in
// the order they were seen, the digest is the one that binary recorded and
// the one the records give, and it stays upgraded after a reopen.
func TestOpenUpgradesLayout1(t *testing.T) {
	db, dir := openFixture(t)
	if n := sessionOrderKeys(t, db, 3); n != 5 {
		t.Fatalf("the fixture has %d session order keys, want 5", n)
	}
	s, err := Open(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	if n := sessionOrderKeys(t, db, 3); n != 0 {
		t.Fatalf("%d session order keys after the upgrade", n)
	}
	if d := s.Digest().Bytes(); hex.EncodeToString(d[:]) != layout1Digest {
		t.Fatalf("digest %x after the upgrade, want %s", d, layout1Digest)
	}
	if got := fromScratch(t, db, 3); got != s.Digest() {
		t.Fatalf("digest from the records %x, the state's %x", got.Bytes(), s.Digest().Bytes())
	}
	// Seen at 10 (d), 30 (c), 50 (a), 60 (b, touched), 70 (e).
	want := []string{"d", "c", "a", "b", "e"}
	if got := sessionsInOrder(t, s); !slices.Equal(got, want) {
		t.Fatalf("sessions in order %v, want %v", got, want)
	}
	tx := s.Begin()
	if c, seen, err := tx.OldestSession(); err != nil || c != "d" || seen != 10 {
		t.Fatalf("oldest session %q at %d (%v), want d at 10", c, seen, err)
	}
	if err := tx.PutSession("d", &Session{Seq: 9, LastSeen: 80}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(44); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = pebble.Open(dir, fixtureOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err = Open(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	if s.meta.layout != Layout || s.Applied() != 44 {
		t.Fatalf("reopened at layout %d, applied %d; want %d, 44", s.meta.layout, s.Applied(), Layout)
	}
	want = []string{"c", "a", "b", "e", "d"}
	if got := sessionsInOrder(t, s); !slices.Equal(got, want) {
		t.Fatalf("sessions in order %v after a reopen, want %v", got, want)
	}
	if got := fromScratch(t, db, 3); got != s.Digest() {
		t.Fatalf("digest from the records %x, the state's %x", got.Bytes(), s.Digest().Bytes())
	}
}

// TestOpenRefusesANewerLayout: a range whose record names a layout this
// binary does not know is refused, saying so, not misread.
func TestOpenRefusesANewerLayout(t *testing.T) {
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), DisableWAL: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rec := meta{applied: 5}.encode()
	rec[len(rec)-1] = Layout + 1
	if err := db.Set(MetaKey(1, "shard"), rec, pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	_, err = Open(db, 1)
	if err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Fatalf("Open of layout %d: %v, want a refusal", Layout+1, err)
	}
}

// TestLayoutWritesNoSessionOrder: the shard record names the layout, and
// sessions written, replaced and deleted leave no order key.
func TestLayoutWritesNoSessionOrder(t *testing.T) {
	db := openMem(t)
	s, err := Open(db, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []string{"x", "y", "x", "z"} {
		tx := s.Begin()
		if err := tx.PutSession(c, &Session{Seq: uint64(i), LastSeen: int64(i)}); err != nil {
			t.Fatal(err)
		}
		if c == "z" {
			if err := tx.DeleteSession("y"); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(uint64(i + 1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.commitPending(); err != nil {
		t.Fatal(err)
	}
	if n := sessionOrderKeys(t, db, 1); n != 0 {
		t.Fatalf("%d session order keys", n)
	}
	v, c, err := db.Get(MetaKey(1, "shard"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if len(v) != metaLen || v[metaLen1] != Layout {
		t.Fatalf("shard record of %d bytes, layout byte %d; want %d, %d", len(v), v[len(v)-1], metaLen, Layout)
	}
	if got, want := sessionsInOrder(t, s), []string{"x", "z"}; !slices.Equal(got, want) {
		t.Fatalf("sessions %v, want %v", got, want)
	}
}
