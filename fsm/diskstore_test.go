package fsm

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
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

// flushOnDisk puts what an on-disk machine has applied into its engine's
// files: its pending writes, then the memtables.
func flushOnDisk(t *testing.T, m *Machine) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.st.store.(*diskStore).st.Flush(); err != nil {
		t.Fatal(err)
	}
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
			// The engine flushes its memtables on its own too (and the
			// state's pending writes go into them): the stored state is
			// then ahead of raft's snapshot.
			flushOnDisk(t, m)
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

// minuteLog is genLog with each entry's time moved on by a third of a
// checkpoint period, so that it checkpoints every third entry.
func minuteLog(t testing.TB, seed uint64, steps int) []*raft.Log {
	t.Helper()
	log := genLog(t, seed, steps)
	for i, l := range log {
		cmd, err := DecodeCommand(l.Data)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Now += int64(i) * CheckpointEvery / 3
		if l.Data, err = EncodeCommand(cmd); err != nil {
			t.Fatal(err)
		}
	}
	return log
}

// TestOnDiskRestoreKeepsALaterState: raft restores its latest snapshot
// whenever a node starts, and the engine already holds that state or a
// later one of the same log: Restore keeps it, and the replay from the
// snapshot skips what it holds. A snapshot past the engine's index (an
// install interrupted by a crash, a follower far behind) is installed.
func TestOnDiskRestoreKeepsALaterState(t *testing.T) {
	log := genLog(t, 11, 300)
	mem := func(n int) *Machine {
		m := New(diskTestOptions)
		for _, l := range log[:n] {
			m.Apply(l)
		}
		return m
	}
	m := diskMachine(t, diskTestOptions)
	for _, l := range log[:200] {
		m.Apply(l)
	}
	before := m.Digest()
	if err := m.Restore(io.NopCloser(bytes.NewReader(persisted(t, mem(120))))); err != nil {
		t.Fatal(err)
	}
	if m.AppliedIndex() != 200 || m.Digest() != before {
		t.Fatalf("after restoring an earlier snapshot: applied %d (want 200), state kept %v", m.AppliedIndex(), m.Digest() == before)
	}
	m.ApplyBatch(log[120:]) // what raft replays after that snapshot
	if want := mem(300); m.Digest() != want.Digest() || m.AppliedIndex() != 300 {
		t.Fatalf("after the replay: applied %d, digest equal %v", m.AppliedIndex(), m.Digest() == want.Digest())
	}
	later := mem(250)
	behind := diskMachine(t, diskTestOptions)
	for _, l := range log[:100] {
		behind.Apply(l)
	}
	if err := behind.Restore(io.NopCloser(bytes.NewReader(persisted(t, later)))); err != nil {
		t.Fatal(err)
	}
	if behind.AppliedIndex() != 250 || behind.Digest() != later.Digest() {
		t.Fatalf("after restoring a later snapshot: applied %d (want 250), digest equal %v", behind.AppliedIndex(), behind.Digest() == later.Digest())
	}
}

// TestOnDiskCheckpointsAfterAnInstall: a replica that installed a snapshot
// (into the shard's other storage id, its queues numbered in another
// order) takes the same checkpoints as one that applied the whole log: a
// different digest there would stop a healthy replica as diverged.
func TestOnDiskCheckpointsAfterAnInstall(t *testing.T) {
	log := minuteLog(t, 5, 300)
	whole := diskMachine(t, diskTestOptions)
	for _, l := range log {
		whole.Apply(l)
	}
	src := New(diskTestOptions)
	for _, l := range log[:150] {
		src.Apply(l)
	}
	installed := diskMachine(t, diskTestOptions)
	installed.ApplyBatch(log[:40])
	if err := installed.Restore(io.NopCloser(bytes.NewReader(persisted(t, src)))); err != nil {
		t.Fatal(err)
	}
	for i := 150; i < len(log); i += 7 {
		installed.ApplyBatch(log[i:min(i+7, len(log))])
	}
	want := map[uint64][32]byte{}
	for _, cp := range whole.Checkpoints() {
		want[cp.Index] = cp.Digest
	}
	compared := 0
	for _, cp := range installed.Checkpoints() {
		if !cp.OnDisk {
			t.Fatalf("checkpoint %d of a machine on disk is not marked OnDisk", cp.Index)
		}
		d, ok := want[cp.Index]
		if !ok {
			continue
		}
		if d != cp.Digest {
			t.Fatalf("checkpoint at %d: the installed replica's digest differs from the one that applied the log", cp.Index)
		}
		compared++
	}
	if compared < 10 {
		t.Fatalf("%d checkpoints compared, want at least 10", compared)
	}
}

// TestMarkerSnapshots: with MarkerSnapshots a machine on disk writes a
// marker as raft's snapshot, which it restores by keeping its engine; a
// machine whose engine is behind the marker, or in memory, refuses it. A
// follower that installs the full stream made later (past the snapshot's
// index) and then gets the entries after the snapshot's index ends in the
// state of the whole log, in memory or on disk.
func TestMarkerSnapshots(t *testing.T) {
	log := genLog(t, 21, 300)
	opts := diskTestOptions
	opts.MarkerSnapshots = true
	m := diskMachine(t, opts)
	m.ApplyBatch(log[:200])
	marker := persisted(t, m)
	if len(marker) != markerLen || !IsMarker(bufio.NewReader(bytes.NewReader(marker))) {
		t.Fatalf("marker of %d bytes (want %d): %q", len(marker), markerLen, marker)
	}
	before := m.Digest()
	if err := m.Restore(io.NopCloser(bytes.NewReader(marker))); err != nil || m.Digest() != before || m.AppliedIndex() != 200 {
		t.Fatalf("restoring its own marker: %v, state kept %v, applied %d", err, m.Digest() == before, m.AppliedIndex())
	}
	behind := diskMachine(t, opts)
	behind.ApplyBatch(log[:100])
	if err := behind.Restore(io.NopCloser(bytes.NewReader(marker))); err == nil || !strings.Contains(err.Error(), "holds only index 100") {
		t.Fatalf("an engine behind the marker restored it: %v", err)
	}
	if err := New(opts).Restore(io.NopCloser(bytes.NewReader(marker))); !errors.Is(err, errMarkerInMemory) {
		t.Fatalf("a machine in memory restored a marker: %v", err)
	}
	damaged := bytes.Clone(marker)
	damaged[len(markerMagic)+3] ^= 1
	if err := m.Restore(io.NopCloser(bytes.NewReader(damaged))); err == nil {
		t.Fatal("a damaged marker restored")
	}

	full, err := m.FullSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink bufSink
	if err := full.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	full.Release()
	whole := New(diskTestOptions)
	whole.ApplyBatch(log)
	for _, f := range []*Machine{New(diskTestOptions), diskMachine(t, diskTestOptions)} {
		if err := f.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
			t.Fatal(err)
		}
		// raft took the marker at 150 and replays from 151.
		for i := 150; i < len(log); i += 9 {
			f.ApplyBatch(log[i:min(i+9, len(log))])
		}
		if f.Digest() != whole.Digest() || f.AppliedIndex() != 300 {
			t.Fatalf("follower after the install and the replay: applied %d, digest equal %v", f.AppliedIndex(), f.Digest() == whole.Digest())
		}
	}
}
