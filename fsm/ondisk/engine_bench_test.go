package ondisk

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	bolt "go.etcd.io/bbolt"
)

// The engine experiment behind DESIGN.md: load the layout of this package
// into an engine, then time claim+commit on a small queue beside the big
// ones and on a big one. For the numbers in DESIGN.md:
//
//	go test -run '^$' -bench Capacity -benchtime 20000x -timeout 2h ./fsm/ondisk/ -ondisk.tasks 10000000 -ondisk.engines pebble
var (
	benchTasks   = flag.Int("ondisk.tasks", 200_000, "tasks BenchmarkCapacity loads before it measures")
	benchQueues  = flag.Int("ondisk.queues", 1000, "queues the loaded tasks are spread over")
	benchEngines = flag.String("ondisk.engines", "pebble,bbolt", "engines BenchmarkCapacity measures")
	benchHeads   = flag.Bool("ondisk.heads", true, "claims seek from the queue's remembered head (false: from the queue's first key)")
	benchDir     = flag.String("ondisk.dir", "", "directory for the engines' files (default: a temporary one)")
)

// kv is the little an engine must do for the state machine.
type kv interface {
	// write applies one batch without syncing: the Raft log is the
	// durable record.
	write(puts [][2][]byte, dels [][]byte) error
	get(k []byte, fn func(v []byte)) bool
	// first calls fn with the first key in [lo, hi).
	first(lo, hi []byte, fn func(k []byte)) bool
	flush() error
	close() error
}

type pebbleKV struct{ db *pebble.DB }

func openPebble(dir string) (kv, error) {
	db, err := pebble.Open(dir, &pebble.Options{
		DisableWAL:   true,
		Cache:        pebble.NewCache(128 << 20),
		MemTableSize: 32 << 20,
	})
	return &pebbleKV{db}, err
}

func (p *pebbleKV) write(puts [][2][]byte, dels [][]byte) error {
	b := p.db.NewBatch()
	for _, d := range dels {
		b.Delete(d, nil)
	}
	for _, kv := range puts {
		b.Set(kv[0], kv[1], nil)
	}
	return b.Commit(pebble.NoSync)
}

func (p *pebbleKV) get(k []byte, fn func([]byte)) bool {
	v, c, err := p.db.Get(k)
	if err != nil {
		return false
	}
	fn(v)
	c.Close()
	return true
}

func (p *pebbleKV) first(lo, hi []byte, fn func([]byte)) bool {
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return false
	}
	defer it.Close()
	if !it.First() {
		return false
	}
	fn(it.Key())
	return true
}

func (p *pebbleKV) flush() error { return p.db.Flush() }
func (p *pebbleKV) close() error { return p.db.Close() }

type boltKV struct{ db *bolt.DB }

var boltBucket = []byte("s")

func openBolt(dir string) (kv, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	db, err := bolt.Open(filepath.Join(dir, "state.db"), 0o600, &bolt.Options{NoSync: true, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists(boltBucket); return err })
	return &boltKV{db}, err
}

func (b *boltKV) write(puts [][2][]byte, dels [][]byte) error {
	return b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(boltBucket)
		for _, d := range dels {
			if err := bk.Delete(d); err != nil {
				return err
			}
		}
		for _, kv := range puts {
			if err := bk.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		return nil
	})
}

func (b *boltKV) get(k []byte, fn func([]byte)) bool {
	found := false
	b.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(boltBucket).Get(k); v != nil {
			found = true
			fn(v)
		}
		return nil
	})
	return found
}

func (b *boltKV) first(lo, hi []byte, fn func([]byte)) bool {
	found := false
	b.db.View(func(tx *bolt.Tx) error {
		k, _ := tx.Bucket(boltBucket).Cursor().Seek(lo)
		if k != nil && bytes.Compare(k, hi) < 0 {
			found = true
			fn(k)
		}
		return nil
	})
	return found
}

func (b *boltKV) flush() error { return b.db.Sync() }
func (b *boltKV) close() error { return b.db.Close() }

const benchShard = 1

// loader writes tasks the way inserts would: a record and a claim key each.
type loader struct {
	db    kv
	r     *rand.Rand
	next  uint64
	value []byte
	puts  [][2][]byte
	// heads holds, per queue, a key below which every claim key of the
	// queue is deleted: a claim seeks from there instead of from the
	// queue's start, where an LSM keeps the tombstones of every task
	// claimed since the last compaction (the queue pattern LSMs are
	// known to be slow at). DESIGN.md, "Queue heads".
	heads map[uint32][]byte
}

func (l *loader) task(queue uint32, at int64) (id string, puts [][2][]byte) {
	l.next++
	// Ids as clients make them: unordered (a random 64-bit number).
	id = strconv.FormatUint(l.r.Uint64(), 36)
	for i := 0; i < len(l.value); i += 8 { // incompressible, like real payloads
		binary.LittleEndian.PutUint64(l.value[i:], l.r.Uint64())
	}
	rec := AppendTask(nil, &Task{Queue: queue, Version: l.next, At: at, Value: l.value, Created: at, Modified: at})
	return id, [][2][]byte{{TaskKey(benchShard, "g", id), rec}, {ClaimKey(benchShard, queue, 0, at, id), nil}}
}

func (l *loader) load(n int, queues uint32, firstQueue uint32) error {
	const batch = 1000
	for i := 0; i < n; i++ {
		_, p := l.task(firstQueue+uint32(i)%queues, int64(i))
		l.puts = append(l.puts, p...)
		if len(l.puts) >= 2*batch || i == n-1 {
			if err := l.db.write(l.puts, nil); err != nil {
				return err
			}
			l.puts = l.puts[:0]
		}
	}
	return nil
}

// claimCommit claims the first task of queue and commits it, inserting
// one more so that the queue keeps its size (taskbench's claim-move): one
// range read, one point read, two deletes and two puts.
func (l *loader) claimCommit(queue uint32, at int64) error {
	var claimKey []byte
	from := l.heads[queue]
	if from == nil {
		from = ClaimPrefix(benchShard, queue)
	}
	if !l.db.first(from, ClaimPrefix(benchShard, queue+1), func(k []byte) { claimKey = bytes.Clone(k) }) {
		return fmt.Errorf("queue %d is empty", queue)
	}
	_, _, _, _, id, err := ParseClaimKey(claimKey)
	if err != nil {
		return err
	}
	var derr error
	if !l.db.get(TaskKey(benchShard, "g", id), func(v []byte) { _, derr = DecodeTask(v) }) {
		return fmt.Errorf("task %q of claim key %x is missing", id, claimKey)
	}
	if derr != nil {
		return derr
	}
	_, puts := l.task(queue, at)
	if *benchHeads {
		l.heads[queue] = claimKey // the new task's claim key sorts after it (a later at)
	}
	return l.db.write(puts, [][]byte{claimKey, TaskKey(benchShard, "g", id)})
}

// BenchmarkCapacity loads -ondisk.tasks tasks over -ondisk.queues queues
// into each engine, then reports claim+commit on a queue of 1,000 tasks
// beside them and on one of the big queues, with the engine's bytes on
// disk per task and the process's RSS.
func BenchmarkCapacity(b *testing.B) {
	for _, name := range strings.Split(*benchEngines, ",") {
		b.Run(name, func(b *testing.B) { benchEngine(b, name) })
	}
}

func benchEngine(b *testing.B, name string) {
	open := map[string]func(string) (kv, error){"pebble": openPebble, "bbolt": openBolt}[name]
	if open == nil {
		b.Fatalf("no engine %q", name)
	}
	dir := b.TempDir()
	if *benchDir != "" {
		dir = filepath.Join(*benchDir, name)
		os.RemoveAll(dir)
		defer os.RemoveAll(dir)
	}
	db, err := open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer db.close()
	l := &loader{db: db, r: rand.New(rand.NewPCG(1, 1)), value: make([]byte, 64), heads: map[uint32][]byte{}}
	queues := uint32(*benchQueues)
	start := time.Now()
	if err := l.load(*benchTasks, queues, 0); err != nil {
		b.Fatal(err)
	}
	loadTime := time.Since(start)
	small := queues // one more queue, of 1,000 tasks
	if err := l.load(1000, 1, small); err != nil {
		b.Fatal(err)
	}
	if err := db.flush(); err != nil {
		b.Fatal(err)
	}
	disk := dirBytes(b, dir)
	b.Logf("%s: loaded %d tasks over %d queues in %v (%.0f tasks/s); %.0f bytes on disk per task; RSS %d MiB, Go heap %d MiB",
		name, *benchTasks, queues, loadTime.Round(time.Millisecond), float64(*benchTasks)/loadTime.Seconds(),
		float64(disk)/float64(*benchTasks+1000), rssBytes()>>20, heapBytes()>>20)

	at := int64(*benchTasks) + 1000
	for _, q := range []struct {
		name  string
		queue uint32
	}{{"queued=1k", small}, {fmt.Sprintf("queued=%d", *benchTasks/int(queues)), 0}} {
		b.Run(q.name, func(b *testing.B) {
			for b.Loop() {
				at++
				if err := l.claimCommit(q.queue, at); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(dirBytes(b, dir))/float64(*benchTasks+1000), "disk-B/task")
			b.ReportMetric(float64(rssBytes()>>20), "RSS-MiB")
		})
	}
}

func dirBytes(tb testing.TB, dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			info, err := d.Info()
			if err != nil {
				return nil // removed by a compaction meanwhile
			}
			n += info.Size()
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

func rssBytes() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func heapBytes() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
