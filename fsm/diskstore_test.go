package fsm

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// diskTestOptions are the options of the on-disk machines below and of
// the in-memory ones they are compared with (the property test's).
var diskTestOptions = Options{MaxSessions: 3, SessionTTL: 200}

// genLog is a log of steps commands from the property test's generator.
func genLog(t testing.TB, seed uint64, steps int) []*raft.Log {
	t.Helper()
	g := &gen{r: rand.New(rand.NewPCG(seed, 9)), ref: newRefModel(3, 200), now: 1000, seqs: map[string]uint64{},
		queues: []string{"g/a", "g/b", "g", "h/a"}, clients: []string{"c1", "c2", "c3", "c4"}}
	log := make([]*raft.Log, 0, steps)
	for i := 1; i <= steps; i++ {
		cmd := g.command(true)
		g.ref.apply(cmd)
		data, err := EncodeCommand(cmd)
		if err != nil {
			t.Fatal(err)
		}
		log = append(log, &raft.Log{Index: uint64(i), Type: raft.LogCommand, Data: data})
	}
	return log
}

// openOnDisk opens an engine on fs and shard 7's machine in it.
func openOnDisk(t testing.TB, fs vfs.FS) (*pebble.DB, *Machine) {
	t.Helper()
	db, err := pebble.Open("", &pebble.Options{FS: fs, DisableWAL: true, Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewOnDisk(diskTestOptions, db, 7)
	if err != nil {
		t.Fatal(err)
	}
	return db, m
}

// persisted is a snapshot of m as raft takes one: persisted (on the
// on-disk store, that waits for the engine's flush), then released.
func persisted(t testing.TB, m *Machine) []byte {
	t.Helper()
	snap, err := m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink bufSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	return sink.Bytes()
}

// bufSink is a raft.SnapshotSink in memory.
type bufSink struct{ bytes.Buffer }

func (*bufSink) ID() string    { return "test" }
func (*bufSink) Cancel() error { return nil }
func (*bufSink) Close() error  { return nil }

// TestOnDiskSurvivesACrash: the on-disk machine keeps no WAL of its own.
// A crash loses what it committed after its last flush, and raft replays
// the log from its last snapshot; a snapshot flushes first, so the stored
// state is never older than that. The replay skips what the state holds
// and ends in the state the log builds, small state (format, pauses,
// limits, schedules) included.
func TestOnDiskSurvivesACrash(t *testing.T) {
	for seed := range uint64(3) {
		t.Run("", func(t *testing.T) { onDiskCrash(t, seed) })
	}
}

func onDiskCrash(t *testing.T, seed uint64) {
	const snapAt, flushAt = 300, 450
	log := genLog(t, seed, 600)
	fs := vfs.NewCrashableMem()
	db, m := openOnDisk(t, fs)
	ref := New(diskTestOptions)
	for _, l := range log {
		m.Apply(l)
		ref.Apply(l)
		switch l.Index {
		case snapAt:
			persisted(t, m)
		case flushAt:
			// The engine flushes its memtables on its own too: the stored
			// state is then ahead of raft's snapshot.
			if err := db.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if m.Digest() != ref.Digest() {
		t.Fatal("the on-disk machine's digest differs from the in-memory one's before the crash")
	}
	// Only what was synced survives (with no WAL, what is not flushed was
	// never written).
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	db.Close()
	db2, m2 := openOnDisk(t, crashed)
	defer db2.Close()
	applied := m2.AppliedIndex()
	if applied < flushAt || applied > uint64(len(log)) {
		t.Fatalf("reopened at applied index %d, want %d..%d (never before the last flush)", applied, flushAt, len(log))
	}
	// raft replays from its snapshot: entries the state holds are skipped.
	m2.ApplyBatch(log[snapAt:])
	if m2.AppliedIndex() != uint64(len(log)) || m2.Digest() != ref.Digest() {
		t.Fatalf("after the replay: applied %d, digest equal %v; want %d, true (reopened at %d)",
			m2.AppliedIndex(), m2.Digest() == ref.Digest(), len(log), applied)
	}
	// The small state came back with it.
	if m2.Format() != ref.Format() || len(m2.Schedules("")) != len(ref.Schedules("")) {
		t.Fatalf("format %d, %d schedules; want %d, %d", m2.Format(), len(m2.Schedules("")), ref.Format(), len(ref.Schedules("")))
	}
}

// TestOnDiskSnapshotIsAView: the on-disk machine's snapshot copies nothing
// when it is taken; it streams from a view of the engine as it was then,
// however many entries apply before Persist reads it.
func TestOnDiskSnapshotIsAView(t *testing.T) {
	const snapAt = 400
	m := diskMachine(t, diskTestOptions)
	ref := New(diskTestOptions)
	var snap raft.FSMSnapshot
	var want [32]byte
	for _, l := range genLog(t, 5, 800) {
		m.Apply(l)
		ref.Apply(l)
		if l.Index == snapAt {
			var err error
			if snap, err = m.Snapshot(); err != nil {
				t.Fatal(err)
			}
			want = ref.Digest()
		}
	}
	var sink bufSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	got := New(diskTestOptions)
	if err := got.Restore(io.NopCloser(&sink.Buffer)); err != nil {
		t.Fatal(err)
	}
	if got.AppliedIndex() != snapAt || got.Digest() != want {
		t.Fatalf("the snapshot restores to applied %d, digest equal %v; want %d, true", got.AppliedIndex(), got.Digest() == want, snapAt)
	}
	if m.Digest() != ref.Digest() {
		t.Fatal("the machine moved on differently from the reference")
	}
}

// TestOnDiskInstall: a snapshot installs into the shard's other range and
// becomes live by one write; a reopened engine (after a crash: only what
// was synced) serves the installed state, and a damaged stream leaves the
// state as it was, before and after a reopen.
func TestOnDiskInstall(t *testing.T) {
	src := New(diskTestOptions)
	src.ApplyBatch(genLog(t, 1, 500))
	stream := persisted(t, src)

	fs := vfs.NewCrashableMem()
	db, m := openOnDisk(t, fs)
	defer db.Close()
	m.ApplyBatch(genLog(t, 2, 300))
	persisted(t, m) // the state before the installs is on disk
	before := m.Digest()

	// A damaged stream: refused, nothing changes, here or after a crash.
	bad := append([]byte(nil), stream...)
	bad[len(bad)/2] ^= 0xff
	if err := m.Restore(io.NopCloser(bytes.NewReader(bad))); err == nil {
		t.Fatal("a damaged snapshot installed")
	}
	if m.Digest() != before {
		t.Fatal("a refused install changed the state")
	}
	db2, m2 := openOnDisk(t, fs.CrashClone(vfs.CrashCloneCfg{}))
	if m2.Digest() != before || m2.AppliedIndex() != 300 {
		t.Fatalf("after a refused install and a crash: applied %d, digest equal %v; want 300, true", m2.AppliedIndex(), m2.Digest() == before)
	}
	db2.Close()

	// A good one: live at once, and after a crash.
	if err := m.Restore(io.NopCloser(bytes.NewReader(stream))); err != nil {
		t.Fatal(err)
	}
	if m.Digest() != src.Digest() || m.AppliedIndex() != 500 {
		t.Fatalf("installed: applied %d, digest equal %v; want 500, true", m.AppliedIndex(), m.Digest() == src.Digest())
	}
	db3, m3 := openOnDisk(t, fs.CrashClone(vfs.CrashCloneCfg{}))
	defer db3.Close()
	if m3.Digest() != src.Digest() || m3.AppliedIndex() != 500 {
		t.Fatalf("installed, then a crash: applied %d, digest equal %v; want 500, true", m3.AppliedIndex(), m3.Digest() == src.Digest())
	}
}
