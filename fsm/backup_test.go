package fsm

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/fsm/ondisk"
)

// TestBackupSnapshotIsTheState: a backup's copy of a store on disk (tasks
// in table order) restores to the same state as the machine it came from,
// and so does a copy of a store in memory.
func TestBackupSnapshotIsTheState(t *testing.T) {
	mem := New(Options{})
	st := mem.st
	st.clock = 5000
	for i := range 300 {
		q := st.queueFor(fmt.Sprintf("g%d/q%d", i%3, i%5))
		st.add(&task{id: fmt.Sprintf("t%04d", 299-i), q: q, value: []byte{byte(i)}, version: uint64(1 + i%4),
			at: int64(i * 7 % 900), created: 1, modified: 2, priority: int32(i % 3), claimant: fmt.Sprint("c", i%2)})
	}
	// Every field set, negative numbers, and headers (which the disk
	// copy encodes the long way).
	for i := range 20 {
		q := st.queueFor(fmt.Sprintf("g%d/rare", i%2))
		tk := &task{id: fmt.Sprintf("r%02d", i), q: q, value: []byte("v"), version: 9, at: int64(-i), created: -5, modified: 7,
			priority: int32(-i), claimant: "w", key: fmt.Sprint("k", i), claims: uint32(i), attempt: 3, err: "boom"}
		switch i % 3 {
		case 1:
			tk.ext = newTaskExt(int64(i)*1e9, nil)
		case 2:
			tk.ext = newTaskExt(0, map[string]string{"trace": fmt.Sprint(i), "a": ""})
		}
		st.add(tk)
	}
	want := persist(t, mem)
	disk := diskMachine(t, Options{})
	if err := disk.Restore(io.NopCloser(bytes.NewReader(want))); err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]*Machine{"memory": mem, "disk": disk} {
		snap, err := m.BackupSnapshot()
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := snap.(*snapshot).writeTo(&buf); err != nil {
			t.Fatal(err)
		}
		snap.Release()
		back := New(Options{})
		if err := back.Restore(io.NopCloser(&buf)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := persist(t, back); !bytes.Equal(got, want) {
			t.Errorf("%s: the backup's copy restores to another state (%d bytes, want %d)", name, len(got), len(want))
		}
	}
}

// TestBackupCopyDoesNotFlush: a backup's copy of a store on disk leaves
// the engine's memtables alone, where a snapshot raft truncates its log
// after flushes them. The flush's new files set off a compaction of the
// levels below them, which took a fifth of the nodes' CPU from the writers
// while a backup ran; a backup truncates nothing, so it needs no flush.
func TestBackupCopyDoesNotFlush(t *testing.T) {
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), DisableWAL: true, Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m, err := NewOnDisk(Options{}, db, 7)
	if err != nil {
		t.Fatal(err)
	}
	flushes := func() int64 { return db.Metrics().Flush.Count }
	copyOf := func(take func() (raft.FSMSnapshot, error)) int {
		t.Helper()
		snap, err := take()
		if err != nil {
			t.Fatal(err)
		}
		defer snap.Release()
		var sink bufSink
		if err := snap.Persist(&sink); err != nil {
			t.Fatal(err)
		}
		return sink.Len()
	}

	m.ApplyCommand(1, insertCmd(10, "a", "b", "c"))
	before := flushes()
	if n := copyOf(m.BackupSnapshot); n == 0 {
		t.Fatal("the backup's copy is empty")
	}
	if got := flushes(); got != before {
		t.Errorf("a backup's copy flushed the engine %d times, want none", got-before)
	}

	// The same unflushed writes, as raft snapshots them: flushed, else it
	// would truncate a log the engine's files do not cover yet.
	m.ApplyCommand(2, insertCmd(20, "d"))
	before = flushes()
	copyOf(m.Snapshot)
	if got := flushes(); got <= before {
		t.Errorf("raft's snapshot did not flush the engine (%d flushes before and after)", got)
	}
}

// BenchmarkBackupCopy is what a backup's copy of one shard costs on each
// store at a million tasks: the time Machine.FullSnapshot holds the state
// machine (writers wait that long) and the rate its stream is written.
func BenchmarkBackupCopy(b *testing.B) {
	mem := New(Options{})
	fillMachine(mem, benchSnapshotTasks)
	data := persist(b, mem)
	disk := diskMachine(b, Options{})
	if err := disk.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		m    *Machine
	}{{"memory", mem}, {"disk", disk}} {
		b.Run(c.name, func(b *testing.B) {
			runtime.GC()
			var held, total time.Duration
			var size int64
			for range b.N {
				start := time.Now()
				snap, err := c.m.BackupSnapshot()
				if err != nil {
					b.Fatal(err)
				}
				held += time.Since(start)
				w := &countWriter{}
				if err := snap.(*snapshot).writeTo(w); err != nil {
					b.Fatal(err)
				}
				snap.Release()
				total += time.Since(start)
				size = w.n
			}
			b.ReportMetric(float64(held.Microseconds())/1000/float64(b.N), "held-ms")
			b.ReportMetric(float64(size)*float64(b.N)/1e6/total.Seconds(), "MB/s")
		})
	}
}

// TestMemorySnapshotIsAView: a snapshot of the store in memory is a view
// that the changes applied after it was taken (inserts into the same
// queue, deletes, new queues, new sessions) do not reach: its stream is
// the state as of the snapshot, though it is written afterwards. Also for
// a checkpoint's digest, taken the same way.
func TestMemorySnapshotIsAView(t *testing.T) {
	m := New(Options{})
	var ids []string
	for i := range 2000 {
		ids = append(ids, fmt.Sprintf("t%05d", i))
	}
	for i := 0; i < len(ids); i += 100 {
		cmd := insertCmd(10, ids[i:i+100]...)
		cmd.ClientId, cmd.Seq = fmt.Sprint("c", i%300), uint64(i+1)
		m.ApplyCommand(uint64(1+i/100), cmd)
	}
	// As the walk of every task (state.snapshot) writes the state now.
	var want bytes.Buffer
	m.mu.RLock()
	err := m.st.snapshot().writeTo(&want)
	wantDigest := digestOf(m.st.snapshot())
	m.mu.RUnlock()
	if err != nil {
		t.Fatal(err)
	}
	snaps := map[string]func() (any, error){
		"Snapshot":       func() (any, error) { return m.Snapshot() },
		"FullSnapshot":   func() (any, error) { return m.FullSnapshot() },
		"BackupSnapshot": func() (any, error) { return m.BackupSnapshot() },
	}
	taken := map[string]*snapshot{}
	for name, take := range snaps {
		s, err := take()
		if err != nil {
			t.Fatal(err)
		}
		taken[name] = s.(*snapshot)
	}
	m.mu.Lock()
	view := m.st.viewSnapshot()
	m.mu.Unlock()
	// Change every tree the view shares: delete half the tasks, insert
	// more into the same queue and into another, add sessions.
	index := uint64(100)
	for i := 0; i < len(ids); i += 2 {
		index++
		cmd := &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 20, Modify: &fsmpb.Modify{Group: "g", Deletes: []*fsmpb.Ref{{Id: ids[i], Version: 1}}},
			ClientId: fmt.Sprint("d", i), Seq: 1}
		if r := m.ApplyCommand(index, cmd); r.GetFailure() != nil {
			t.Fatalf("delete %s: %v", ids[i], r.GetFailure())
		}
	}
	for i := range 500 {
		index++
		cmd := insertCmd(30, fmt.Sprintf("n%05d", i))
		if i%2 == 1 {
			cmd.Modify.Inserts[0].Queue = "g/other"
		}
		m.ApplyCommand(index, cmd)
	}
	for name, s := range taken {
		var got bytes.Buffer
		if err := s.writeTo(&got); err != nil {
			t.Fatal(err)
		}
		s.Release()
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Errorf("%s: the stream written after the changes is not the state it was taken of (%d bytes, want %d)", name, got.Len(), want.Len())
		}
	}
	view.materialize()
	if digestOf(view) != wantDigest {
		t.Error("the view's digest is not the state's as of the view")
	}
	var now bytes.Buffer
	if err := m.st.snapshot().writeTo(&now); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(now.Bytes(), want.Bytes()) {
		t.Fatal("the changes changed nothing: the test proves nothing")
	}
}

// TestAppendTaskRecord: a stored task record renumbered into a Task
// message (a backup's copy on disk) is byte for byte what decoding it,
// filling a task and encoding that gives; records it does not take
// (headers, unknown fields, out of order, damaged) are refused so that the
// caller decodes them.
func TestAppendTaskRecord(t *testing.T) {
	q := &queue{name: "g/q", group: "g"}
	var tasks []*ondisk.Task
	for i := range 200 {
		tk := &ondisk.Task{Queue: uint32(1 + i%3)}
		if i%2 == 0 {
			tk.Version = uint64(i * 1001)
		}
		if i%3 == 0 {
			tk.At = int64(i-100) * 1e12
		}
		if i%5 != 0 {
			tk.Claimant, tk.Err = fmt.Sprint("c", i), fmt.Sprint("e", i%4)
		}
		tk.Priority = int32(i%7 - 3)
		if i%4 == 0 {
			tk.Priority = -1 << 31
		}
		if i%6 != 0 {
			tk.Key = fmt.Sprint("k", i)
		}
		if i%8 != 0 {
			tk.Value = bytes.Repeat([]byte{byte(i)}, i%70)
		}
		tk.Created, tk.Modified = int64(i)*-3, int64(i)*1e15
		tk.Claims, tk.Attempt = uint32(i%3), uint32(1<<32-1-i%2)
		if i%9 == 0 {
			tk.Dedup = int64(i) * 1e9
		}
		tasks = append(tasks, tk)
	}
	tasks = append(tasks, &ondisk.Task{}, &ondisk.Task{Queue: 5})
	for i, tk := range tasks {
		rec := ondisk.AppendTask(nil, tk)
		got, ok := appendTaskRecord([]byte("prefix"), []byte(fmt.Sprint("id", i)), q.name, rec)
		if !ok {
			t.Fatalf("task %d (%+v): refused", i, tk)
		}
		back, err := ondisk.DecodeTask(rec)
		if err != nil {
			t.Fatal(err)
		}
		var want task
		fillTask(&want, fmt.Sprint("id", i), back, q)
		if w := appendTask([]byte("prefix"), &want); !bytes.Equal(got, w) {
			t.Fatalf("task %d (%+v):\n got %x\nwant %x", i, tk, got, w)
		}
		if got := recordQueue(rec); got != tk.Queue {
			t.Errorf("task %d: queue %d, want %d", i, got, tk.Queue)
		}
	}
	ok := ondisk.AppendTask(nil, &ondisk.Task{Queue: 1, Version: 2, At: 3})
	for name, rec := range map[string][]byte{
		"headers":      ondisk.AppendTask(nil, &ondisk.Task{Queue: 1, Headers: map[string]string{"a": "b"}}),
		"unknown":      protowire.AppendVarint(protowire.AppendTag(slices.Clone(ok), 40, protowire.VarintType), 1),
		"out of order": append(protowire.AppendVarint(protowire.AppendTag(nil, 3, protowire.VarintType), 4), ok...),
		"wire type":    protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.VarintType), 1),
		"truncated":    ok[:len(ok)-1],
		"priority":     protowire.AppendVarint(protowire.AppendTag(nil, 5, protowire.VarintType), protowire.EncodeZigZag(1<<40)),
	} {
		if got, ok := appendTaskRecord([]byte("prefix"), []byte("id"), "q", rec); ok || string(got) != "prefix" {
			t.Errorf("%s: taken (%q, %v)", name, got, ok)
		}
	}
}
