package ondisk

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// BenchmarkStateClaimCommit loads -ondisk.tasks tasks over -ondisk.queues
// queues through State, then times the worker's steady step as one
// transaction (claim the first available task, commit it, insert one more
// so the queue keeps its size) on a queue of 1,000 beside them and on a
// big one. The capacity target: the big-state step at least 0.7x as fast as
// the small. For fsm/ondisk/DESIGN.md:
//
//	go test -run '^$' -bench StateClaimCommit -benchtime 20000x -timeout 2h ./fsm/ondisk/ -ondisk.tasks 10000000 -ondisk.queues 10000
func BenchmarkStateClaimCommit(b *testing.B) {
	dir := b.TempDir()
	if *benchDir != "" {
		dir = filepath.Join(*benchDir, "state")
		os.RemoveAll(dir)
		defer os.RemoveAll(dir)
	}
	opts := EngineOptions(128 << 20)
	defer opts.Cache.Unref()
	db, err := pebble.Open(dir, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	s, err := Open(db, 1)
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	value := make([]byte, 64)
	var version uint64
	var applied uint64
	put := func(tx *Txn, queue string, at int64) error {
		for i := 0; i < len(value); i += 8 {
			binary.LittleEndian.PutUint64(value[i:], r.Uint64())
		}
		version++
		return tx.Put(strconv.FormatUint(r.Uint64(), 36), queue, &Task{Version: version, At: at, Value: value, Created: at, Modified: at})
	}
	load := func(n, queues int, prefix string) {
		tx := s.Begin()
		// Loaded tasks are available: their at is behind the clock.
		if err := tx.Advance(int64(*benchTasks)+1000, func(string, string, int64) {}); err != nil {
			b.Fatal(err)
		}
		for i := range n {
			if err := put(tx, fmt.Sprintf("%s%d", prefix, i%queues), int64(i)); err != nil {
				b.Fatal(err)
			}
			if (i+1)%1000 == 0 || i == n-1 {
				applied++
				if err := tx.Commit(applied); err != nil {
					b.Fatal(err)
				}
				tx = s.Begin()
			}
		}
		tx.Discard()
	}
	start := time.Now()
	load(*benchTasks, *benchQueues, "big-")
	took := time.Since(start)
	load(1000, 1, "small-")
	if err := db.Flush(); err != nil {
		b.Fatal(err)
	}
	b.Logf("loaded %d tasks over %d queues in %v (%.0f tasks/s); %.0f bytes on disk per task; RSS %d MiB, Go heap %d MiB",
		*benchTasks, *benchQueues, took.Round(time.Millisecond), float64(*benchTasks)/took.Seconds(),
		float64(dirBytes(b, dir))/float64(*benchTasks+1000), rssBytes()>>20, heapBytes()>>20)

	clock := int64(*benchTasks) + 1000
	for _, q := range []struct{ name, queue string }{{"queued=1k", "small-0"}, {fmt.Sprintf("queued=%d", *benchTasks / *benchQueues), "big-0"}} {
		b.Run(q.name, func(b *testing.B) {
			for b.Loop() {
				clock++
				tx := s.Begin()
				if err := tx.Advance(clock, func(string, string, int64) {}); err != nil {
					b.Fatal(err)
				}
				var id string
				if err := tx.Claimable(q.queue, func(i string, _ *Task) bool { id = i; return false }); err != nil {
					b.Fatal(err)
				}
				if id == "" {
					b.Fatalf("queue %s is empty", q.queue)
				}
				if err := tx.Delete(GroupOf(q.queue), id); err != nil {
					b.Fatal(err)
				}
				if err := put(tx, q.queue, clock); err != nil {
					b.Fatal(err)
				}
				applied++
				if err := tx.Commit(applied); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(dirBytes(b, dir))/float64(*benchTasks+1000), "disk-B/task")
			b.ReportMetric(float64(rssBytes()>>20), "RSS-MiB")
		})
	}
}

// BenchmarkLoadIDOrder loads -ondisk.tasks tasks over -ondisk.queues queues
// through State, 500 per transaction with Txn.Add (as batched inserts of ids
// the leader chose apply), once with random ids and once with ids that
// start with the time, as rpc's newID makes them. It reports what the
// engine wrote per task (flushes and compactions, after the compactions the
// load started have finished) and the load rate: the task table is ordered
// by id, so random ids land among the old ones and every compaction
// rewrites the table, while ids in time order land past them. For
// DESIGN.md:
//
//	go test -run '^$' -bench LoadIDOrder -benchtime 1x -timeout 1h ./fsm/ondisk/ -ondisk.tasks 5000000 -ondisk.queues 100000
func BenchmarkLoadIDOrder(b *testing.B) {
	for _, order := range []string{"random", "time"} {
		b.Run("ids="+order, func(b *testing.B) {
			for range b.N {
				dir := b.TempDir()
				if *benchDir != "" {
					dir = filepath.Join(*benchDir, "ids-"+order)
					os.RemoveAll(dir)
					defer os.RemoveAll(dir)
				}
				opts := EngineOptions(128 << 20)
				db, err := pebble.Open(dir, opts)
				if err != nil {
					b.Fatal(err)
				}
				s, err := Open(db, 1)
				if err != nil {
					b.Fatal(err)
				}
				r := rand.New(rand.NewPCG(1, 2))
				value := make([]byte, 64)
				var id [16]byte
				n, queues := *benchTasks, *benchQueues
				start := time.Now()
				tx := s.Begin()
				for i := range n {
					for j := 0; j < len(value); j += 8 {
						binary.LittleEndian.PutUint64(value[j:], r.Uint64())
					}
					binary.BigEndian.PutUint64(id[:8], r.Uint64())
					binary.BigEndian.PutUint64(id[8:], r.Uint64())
					if order == "time" {
						// A thousand tasks a millisecond, as a fast load.
						binary.BigEndian.PutUint64(id[:8], uint64(i/1000)<<16|uint64(id[6])<<8|uint64(id[7]))
					}
					at := int64(i)
					if err := tx.Add(fmt.Sprintf("%x", id), fmt.Sprintf("q%d", i%queues), &Task{Version: uint64(i + 1), At: at, Value: value, Created: at, Modified: at}); err != nil {
						b.Fatal(err)
					}
					if (i+1)%500 == 0 || i == n-1 {
						if err := tx.Commit(uint64(i + 1)); err != nil {
							b.Fatal(err)
						}
						tx = s.Begin()
					}
				}
				tx.Discard()
				if err := db.Flush(); err != nil {
					b.Fatal(err)
				}
				for db.Metrics().Compact.NumInProgress > 0 {
					time.Sleep(10 * time.Millisecond)
				}
				took := time.Since(start)
				total := db.Metrics().Total()
				b.ReportMetric(float64(n)/took.Seconds(), "tasks/s")
				b.ReportMetric(float64(total.TableBytesFlushed+total.TableBytesCompacted)/float64(n), "written-bytes/task")
				b.ReportMetric(float64(db.Metrics().DiskSpaceUsage())/float64(n), "disk-bytes/task")
				if err := db.Close(); err != nil {
					b.Fatal(err)
				}
				opts.Cache.Unref()
			}
		})
	}
}
