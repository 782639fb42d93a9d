package fsm

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"
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
