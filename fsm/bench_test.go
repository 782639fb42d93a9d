package fsm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/fsm/ondisk"
)

// Benchmarks run only with -bench; their setup builds up to a million
// tasks. Compare runs with benchstat:
//
//	go test -run '^$' -bench 'Claim|Modify' -benchmem -benchtime 100000x -count 3 ./fsm/
//
// (At 2000x a run lasts milliseconds and the 1M figures are dominated by
// cold caches after setup; use 100000x to compare 1k with 1M.)
//	go test -run '^$' -bench 'Snapshot|Restore|BytesPerTask' -benchmem -benchtime 3x ./fsm/

var benchSizes = []struct {
	name string
	n    int
}{{"1k", 1000}, {"1M", 1000000}}

// fillMachine adds n available tasks to queue b/q directly (not through
// commands, to keep setup fast): priorities 0-3, distinct at, 16-byte values.
func fillMachine(m *Machine, n int) {
	st := m.st
	st.clock = int64(n) + 1
	q := st.queueFor("b/q")
	for i := range n {
		value := fmt.Appendf(make([]byte, 0, 16), "value-%010d", i)
		st.add(&task{id: fmt.Sprintf("t%08d", i), q: q, value: value, version: 1,
			at: int64(i), created: int64(i), modified: int64(i), priority: int32(i % 4)})
	}
}

func BenchmarkClaim(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(size.name, func(b *testing.B) {
			m := New(Options{})
			fillMachine(m, size.n)
			now := m.Clock()
			cmd := &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM,
				Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"b/q"}, Lease: 500, Limit: 1}}
			runtime.GC() // settle the setup's garbage collection before timing
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				// Time moves one tick per claim; leases of 500 ticks run
				// out, so the queue never empties, even at 1k.
				cmd.Now = now + int64(i)
				res := m.ApplyCommand(uint64(i+1), cmd)
				if len(res.GetClaim().GetTasks()) != 1 {
					b.Fatalf("claim %d: %v", i, res)
				}
			}
		})
	}
}

func BenchmarkModify(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(size.name, func(b *testing.B) {
			m := New(Options{})
			fillMachine(m, size.n)
			now := m.Clock()
			// Each transaction inserts a task, changes an existing one and
			// deletes the previous transaction's insert: the size holds.
			cmds := make([]*fsmpb.Command, b.N)
			value := []byte("fedcba9876543210")
			for i := range cmds {
				j := i % size.n
				mod := &fsmpb.Modify{Group: "b",
					Inserts: []*fsmpb.Insert{{Id: fmt.Sprintf("n%d", i), Queue: "b/q", Value: value}},
					Changes: []*fsmpb.Change{{Id: fmt.Sprintf("t%08d", j), Version: uint64(1 + i/size.n), Value: value}}}
				if i > 0 {
					mod.Deletes = []*fsmpb.Ref{{Id: fmt.Sprintf("n%d", i-1), Version: 1}}
				}
				cmds[i] = &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: now + int64(i), Modify: mod}
			}
			runtime.GC() // settle the setup's garbage collection before timing
			b.ReportAllocs()
			b.ResetTimer()
			for i, cmd := range cmds {
				if res := m.ApplyCommand(uint64(i+1), cmd); res.Failure != nil {
					b.Fatalf("modify %d: %v", i, res.Failure)
				}
			}
		})
	}
}

const benchSnapshotTasks = 1000000

func BenchmarkSnapshot(b *testing.B) {
	m := New(Options{})
	fillMachine(m, benchSnapshotTasks)
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	var size int64
	for range b.N {
		snap, err := m.Snapshot() // the part under the lock
		if err != nil {
			b.Fatal(err)
		}
		w := &countWriter{}
		if err := snap.(*snapshot).writeTo(w); err != nil {
			b.Fatal(err)
		}
		size = w.n
	}
	b.ReportMetric(float64(size)/benchSnapshotTasks, "stream-bytes/task")
}

// BenchmarkSnapshotLock measures only what Snapshot does under the lock.
func BenchmarkSnapshotLock(b *testing.B) {
	m := New(Options{})
	fillMachine(m, benchSnapshotTasks)
	runtime.GC()
	b.ResetTimer()
	for range b.N {
		if _, err := m.Snapshot(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRestore(b *testing.B) {
	m := New(Options{})
	fillMachine(m, benchSnapshotTasks)
	data := persist(b, m)
	m = nil
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		m2 := New(Options{})
		if err := m2.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
			b.Fatal(err)
		}
		if m2.TaskCount() != benchSnapshotTasks {
			b.Fatal("short restore")
		}
	}
}

// BenchmarkRestoreDisk is BenchmarkRestore into the store on disk (an
// engine in memory): what a restored node or a replica catching up by
// snapshot does with each shard's stream.
//
//	go test -run '^$' -bench RestoreDisk -benchtime 1x ./fsm/
func BenchmarkRestoreDisk(b *testing.B) {
	m := New(Options{})
	m.st.format = MaxFormat // as a cluster's shards are: ids unique per group
	fillMachine(m, benchSnapshotTasks)
	data := persist(b, m)
	m = nil
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		m2 := diskMachine(b, Options{})
		if err := m2.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
			b.Fatal(err)
		}
		if m2.TaskCount() != benchSnapshotTasks {
			b.Fatal("short restore")
		}
	}
	b.ReportMetric(float64(len(data))*float64(b.N)/1e6/b.Elapsed().Seconds(), "MB/s")
}

// BenchmarkBytesPerTask reports the heap held per task at a million tasks
// (9-byte ids, 16-byte values, one queue), indexes and values included.
func BenchmarkBytesPerTask(b *testing.B) {
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		m := New(Options{})
		fillMachine(m, benchSnapshotTasks)
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/benchSnapshotTasks, "heap-bytes/task")
		runtime.KeepAlive(m)
	}
}

type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// BenchmarkOnDiskBytesPerTask loads a million tasks into the on-disk store
// (Pebble in a temporary directory, ondisk.EngineOptions with a 64 MiB
// block cache) in batches of 10,000 and reports the heap held per task,
// the disk used per task, and a claim of the million-task queue.
func BenchmarkOnDiskBytesPerTask(b *testing.B) {
	for range b.N {
		db, err := pebble.Open(b.TempDir(), ondisk.EngineOptions(64<<20))
		if err != nil {
			b.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		m, err := NewOnDisk(Options{}, db, 1)
		if err != nil {
			b.Fatal(err)
		}
		d := m.st.store.(*diskStore)
		m.st.clock = int64(benchSnapshotTasks) + 1
		q := m.st.queueFor("b/q")
		for i := range benchSnapshotTasks {
			if i%10000 == 0 {
				d.begin()
			}
			value := fmt.Appendf(make([]byte, 0, 16), "value-%010d", i)
			m.st.add(&task{id: fmt.Sprintf("t%08d", i), q: q, value: value, version: 1,
				at: int64(i), created: int64(i), modified: int64(i), priority: int32(i % 4)})
			if i%10000 == 9999 {
				d.commit(uint64(i+1), m.st.encodeSmall())
			}
		}
		if err := db.Flush(); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/benchSnapshotTasks, "heap-bytes/task")
		b.ReportMetric(float64(db.Metrics().DiskSpaceUsage())/benchSnapshotTasks, "disk-bytes/task")
		// Claims, one per command (its own batch), timed after as many
		// again warmed the cache.
		const claims = 2000
		var start time.Time
		for i := range 2 * claims {
			if i == claims {
				start = time.Now()
			}
			res := m.ApplyCommand(uint64(benchSnapshotTasks+i+1), &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: int64(benchSnapshotTasks) + 2 + int64(i),
				Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"b/q"}, Lease: 1 << 40, Limit: 1}})
			if len(res.GetClaim().GetTasks()) != 1 {
				b.Fatalf("claim %d: %v", i, res)
			}
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/claims, "us/claim")
		runtime.KeepAlive(m)
		db.Close()
	}
}

// storeMachine is an empty machine in memory, or on disk (Pebble in a
// temporary directory, ondisk.EngineOptions, closed when b ends).
// benchMemtable overrides the engine's memtable size in the benchmarks
// (MiB; 0: ondisk.EngineOptions').
var benchMemtable = flag.Int("fsm.memtable", 0, "the on-disk benchmarks' memtable size in MiB (0: the engine's default)")

func storeMachine(b *testing.B, store string) *Machine {
	if store == "memory" {
		return New(Options{})
	}
	o := ondisk.EngineOptions(128 << 20)
	if *benchMemtable > 0 {
		o.MemTableSize = uint64(*benchMemtable) << 20
	}
	o.Logger = quietLogger{}
	db, err := pebble.Open(b.TempDir(), o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	m, err := NewOnDisk(Options{}, db, 1)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// BenchmarkInsertBatch applies raft batches of Modify commands of 500
// inserts each (taskbench's insert-batch: one queue of one group per
// command, 64-byte values, each a client's next request) to a machine in memory and to one on disk
// (Pebble in a temporary directory, ondisk.EngineOptions), and reports
// tasks per second and the process's CPU per task (the engine's flushes
// and compactions included; steadier than wall time on a shared
// machine), and on disk the keys and bytes written into the engine and
// into its files per task, as BenchmarkClaimDelete does. Ids are the
// client's ("client": each is looked up, the duplicate-id check) or the leader's ("leader": rpc's, the shard's clock
// then random bits, which the state machine does not look up), as
// taskbench's are. Compare with benchstat:
//
//	go test -run '^$' -bench InsertBatch -benchtime 200x -count 6 ./fsm/
func BenchmarkInsertBatch(b *testing.B) {
	const perCommand, perBatch = 500, 4
	value := bytes.Repeat([]byte("v"), 64)
	for _, ids := range []string{"client", "leader"} {
		for _, store := range []string{"memory", "disk"} {
			b.Run(ids+"/"+store, func(b *testing.B) {
				m := storeMachine(b, store)
				m.ApplyCommand(1, SetFormatCommand(MaxFormat)) // as a cluster runs
				logs := make([]*raft.Log, perBatch)
				rnd := rand.New(rand.NewPCG(1, 2))
				mt := startMeter(b, m)
				index := uint64(1)
				for i := range b.N {
					b.StopTimer() // building the entries is the proposer's cost
					mt.cpu.pause()
					for j := range logs {
						n := i*perBatch + j
						mod := &fsmpb.Modify{Group: fmt.Sprintf("g%d", n%100)}
						queue := fmt.Sprintf("g%d/q%d", n%100, n%1000)
						for k := range perCommand {
							in := &fsmpb.Insert{Id: fmt.Sprintf("t%d-%d", n, k), Queue: queue, Value: value}
							if ids == "leader" {
								in.Id, in.IdChosenByLeader = leaderID(int64(n+1), rnd), true
							}
							mod.Inserts = append(mod.Inserts, in)
						}
						// One client per command of a batch, as taskbench's
						// clients are: each command replaces its session.
						data, err := EncodeCommand(&fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: int64(n + 1), Modify: mod,
							ClientId: fmt.Sprintf("c%d", j), Seq: uint64(i + 1)})
						if err != nil {
							b.Fatal(err)
						}
						index++
						logs[j] = &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
					}
					mt.cpu.resume()
					b.StartTimer()
					for j, res := range m.ApplyBatch(logs) {
						if r := res.(*fsmpb.Result); r.Failure != nil {
							b.Fatalf("modify %d: %v", i*perBatch+j, r.Failure)
						}
					}
				}
				b.StopTimer()
				tasks := float64(b.N * perBatch * perCommand)
				mt.report(b, m, tasks)
			})
		}
	}
}

// BenchmarkInsert is taskbench's single inserts at the state machine:
// raft batches of five entries (what a shard's entry carries under 16
// clients), each one Modify inserting one task with a leader-chosen id
// into one of 8 queues in 8 groups, each command the next request of one
// of 16 clients, so that it replaces that client's exactly-once session.
//
//	go test -run '^$' -bench 'Insert/'  -benchtime 100000x -count 6 ./fsm/
func BenchmarkInsert(b *testing.B) {
	const perBatch, clients, queues = 5, 16, 8
	const chunk = 1024 // batches built at a time, outside the timer
	value := bytes.Repeat([]byte("v"), 64)
	for _, store := range []string{"memory", "disk"} {
		b.Run(store, func(b *testing.B) {
			m := storeMachine(b, store)
			m.ApplyCommand(1, SetFormatCommand(MaxFormat))
			rnd := rand.New(rand.NewPCG(1, 2))
			seqs := make([]uint64, clients)
			index := uint64(1)
			build := func(from, to int) [][]*raft.Log {
				batches := make([][]*raft.Log, 0, to-from)
				for i := from; i < to; i++ {
					logs := make([]*raft.Log, perBatch)
					for j := range logs {
						n := i*perBatch + j
						c := n % clients
						seqs[c]++
						mod := &fsmpb.Modify{Group: fmt.Sprintf("g%d", n%queues), Inserts: []*fsmpb.Insert{{
							Id: leaderID(int64(n+1), rnd), IdChosenByLeader: true, Queue: fmt.Sprintf("g%d/q", n%queues), Value: value}}}
						data, err := EncodeCommand(&fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: int64(n + 1), Modify: mod,
							ClientId: fmt.Sprintf("c%d", c), Seq: seqs[c]})
						if err != nil {
							b.Fatal(err)
						}
						index++
						logs[j] = &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
					}
					batches = append(batches, logs)
				}
				return batches
			}
			batches := build(0, min(chunk, b.N))
			mt := startMeter(b, m)
			for i := range b.N {
				if i%chunk == 0 && i > 0 {
					b.StopTimer() // building the entries is the proposer's cost
					mt.cpu.pause()
					batches = build(i, min(i+chunk, b.N))
					mt.cpu.resume()
					b.StartTimer()
				}
				for j, res := range m.ApplyBatch(batches[i%chunk]) {
					if r := res.(*fsmpb.Result); r.Failure != nil {
						b.Fatalf("modify %d: %v", i*perBatch+j, r.Failure)
					}
				}
			}
			b.StopTimer()
			tasks := float64(b.N * perBatch)
			mt.report(b, m, tasks)
		})
	}
}

// leaderID is an id as rpc's leader chooses one: the clock in
// milliseconds (here the command's clock), then 80 random bits, in hex.
func leaderID(clockMs int64, rnd *rand.Rand) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(clockMs)<<16)
	binary.BigEndian.PutUint16(b[6:], uint16(rnd.Uint32()))
	binary.BigEndian.PutUint64(b[8:], rnd.Uint64())
	return hex.EncodeToString(b[:])
}

// meter measures a state machine benchmark from its start: the process's
// CPU (cpu, which a benchmark pauses while it builds entries) and what
// the engine took in (on disk).
type meter struct {
	cpu                   *cpuClock
	keys0, bytes0, files0 uint64
}

// startMeter settles the setup's garbage, then starts the timer and the
// meter.
func startMeter(b *testing.B, m *Machine) *meter {
	runtime.GC()
	b.ReportAllocs()
	mt := &meter{}
	mt.keys0, mt.bytes0 = engineWrites(m)
	mt.files0 = engineFileBytes(m)
	mt.cpu = startCPU()
	b.ResetTimer()
	return mt
}

// report reports the rate of tasks and the costs per task: CPU, and on
// disk the keys and bytes the engine took in and the bytes its files grew.
func (mt *meter) report(b *testing.B, m *Machine, tasks float64) {
	b.ReportMetric(tasks/b.Elapsed().Seconds(), "tasks/s")
	b.ReportMetric(mt.cpu.since()/tasks, "cpu-ns/task")
	if keys, bytes := engineWrites(m); keys > 0 {
		b.ReportMetric(float64(keys-mt.keys0)/tasks, "keys/task")
		b.ReportMetric(float64(bytes-mt.bytes0)/tasks, "bytes/task")
		b.ReportMetric((float64(engineFileBytes(m))-float64(mt.files0))/tasks, "file-B/task")
	}
}

// cpuClock measures the process's CPU time (user and system, every
// thread: the engine's flushes and compactions too) outside its pauses.
type cpuClock struct{ start, paused, excluded time.Duration }

func startCPU() *cpuClock { return &cpuClock{start: processCPU()} }

func (c *cpuClock) pause()  { c.paused = processCPU() }
func (c *cpuClock) resume() { c.excluded += processCPU() - c.paused }

// since is the CPU time used since the clock started, pauses excluded, in
// nanoseconds.
func (c *cpuClock) since() float64 { return float64(processCPU() - c.start - c.excluded) }

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkClaimDelete is taskbench's claim-delete at the state machine:
// raft batches of eight entries, four claims of one task each and four
// Modifies deleting what the previous batch's claims returned, over 100
// queues of 1,000 tasks (64-byte values; more when b.N would claim them
// all), in memory and on disk. Each command is a client's next request, so
// that it replaces the client's exactly-once session, as in a cluster.
//
//	go test -run '^$' -bench ClaimDelete -benchtime 20000x -count 6 ./fsm/
func BenchmarkClaimDelete(b *testing.B) {
	const queues, claims = 100, 4
	value := bytes.Repeat([]byte("v"), 64)
	for _, store := range []string{"memory", "disk"} {
		b.Run(store, func(b *testing.B) {
			perQueue := max(1000, b.N*claims/queues+1)
			m := storeMachine(b, store)
			index := uint64(1)
			m.ApplyCommand(index, SetFormatCommand(MaxFormat))
			apply := func(cmds []*fsmpb.Command) []interface{} {
				logs := make([]*raft.Log, len(cmds))
				for i, cmd := range cmds {
					data, err := EncodeCommand(cmd)
					if err != nil {
						b.Fatal(err)
					}
					index++
					logs[i] = &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
				}
				return m.ApplyBatch(logs)
			}
			now := int64(1)
			for q := range queues {
				mod := &fsmpb.Modify{Group: fmt.Sprintf("g%d", q)}
				for k := range perQueue {
					mod.Inserts = append(mod.Inserts, &fsmpb.Insert{Id: fmt.Sprintf("t%d-%d", q, k), Queue: fmt.Sprintf("g%d/q", q), Value: value})
				}
				apply([]*fsmpb.Command{{Op: fsmpb.Op_OP_MODIFY, Now: now, Modify: mod}})
			}
			var claimed []*fsmpb.Task
			mt := startMeter(b, m)
			for i := range b.N {
				now++
				cmds := make([]*fsmpb.Command, 0, 2*claims)
				for j := range claims {
					q := (i*claims + j) % queues
					cmds = append(cmds, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: now, ClientId: fmt.Sprintf("c%d", j), Seq: uint64(i + 1),
						Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{fmt.Sprintf("g%d/q", q)}, Lease: 1 << 40, Limit: 1}})
				}
				for k, t := range claimed {
					cmds = append(cmds, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: now, ClientId: fmt.Sprintf("d%d", k), Seq: uint64(i + 1),
						Modify: &fsmpb.Modify{Group: strings.Split(t.Queue, "/")[0], Claimant: "w", Deletes: []*fsmpb.Ref{{Id: t.Id, Version: t.Version}}}})
				}
				claimed = claimed[:0]
				for k, res := range apply(cmds) {
					r := res.(*fsmpb.Result)
					if r.Failure != nil {
						b.Fatalf("command %d of batch %d: %v", k, i, r.Failure)
					}
					if k < claims {
						if len(r.GetClaim().GetTasks()) != 1 {
							b.Fatalf("claim %d of batch %d: %v", k, i, r)
						}
						claimed = append(claimed, r.GetClaim().GetTasks()[0])
					}
				}
			}
			b.StopTimer()
			mt.report(b, m, float64(b.N*claims))
		})
	}
}

// engineWrites is what an on-disk machine's state has written into its
// engine (ondisk.State.Written); zero for a machine in memory.
func engineWrites(m *Machine) (keys, bytes uint64) {
	if d, ok := m.st.store.(*diskStore); ok {
		return d.st.Written()
	}
	return 0, 0
}

// engineFileBytes is what an on-disk machine's engine has written into
// its files (flushes and compactions); zero for a machine in memory.
func engineFileBytes(m *Machine) uint64 {
	d, ok := m.st.store.(*diskStore)
	if !ok {
		return 0
	}
	var n uint64
	for _, l := range d.db.Metrics().Levels {
		n += l.TableBytesFlushed + l.TableBytesCompacted + l.BlobBytesFlushed + l.BlobBytesCompacted
	}
	return n
}
