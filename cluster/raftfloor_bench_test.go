package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster/nodelog"
)

// BenchmarkRaftFloor is hashicorp/raft alone, as the nodes run it: three
// nodes in this process, each with one node log (cluster/nodelog,
// fdatasync on) shared by its replicas, raft-boltdb for term and vote, the
// log cache and serialTransport over loopback TCP, the default tuning;
// the state machine does nothing. With several groups their leaders are
// spread over the nodes, as a cluster balances them. Concurrent callers,
// spread evenly over the groups, each propose one 200-byte entry and wait
// for it to apply, as taskbench's clients each wait for their
// claim+commit. It reports entries/s, the process's CPU per entry (user
// and system, every replica together) and fdatasyncs per entry: what the
// nodes cannot spend less than per task on this stack, before gRPC, the
// state machine and the exactly-once table, and what more groups cost
// Raft itself. docs/performance.md sets it beside taskbench's cost
// columns.
//
//	go test -run '^$' -bench RaftFloor -benchtime 20000x ./cluster/
func BenchmarkRaftFloor(b *testing.B) {
	for _, callers := range []int{16, 64} {
		for _, groups := range []int{1, 8} {
			b.Run(fmt.Sprintf("callers=%d/groups=%d", callers, groups), func(b *testing.B) { raftFloor(b, callers, groups) })
		}
	}
}

func raftFloor(b *testing.B, callers, groups int) {
	const nodes = 3
	var syncs atomic.Int64
	hlog := newHCLog(slog.New(slog.NewTextHandler(io.Discard, nil)), slog.LevelError)
	logs := make([]*nodelog.Log, nodes)
	for i := range logs {
		l, err := nodelog.Open(filepath.Join(b.TempDir(), "raftlog"), nodelog.Options{OnSync: func(e, _ int) {
			if e > 0 {
				syncs.Add(1)
			}
		}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { l.Close() })
		logs[i] = l
	}
	leaders := make([]*raft.Raft, groups)
	for g := range groups {
		leaders[g] = startFloorGroup(b, logs, uint32(g+1), g%nodes, hlog)
	}
	data := make([]byte, 200)
	var next atomic.Int64
	cpu0, syncs0 := cpuTime(b), syncs.Load()
	b.ResetTimer()
	var wg sync.WaitGroup
	for c := range callers {
		leader := leaders[c%groups]
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := leader.Apply(data, 10*time.Second).Error(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	cpu, s := cpuTime(b)-cpu0, syncs.Load()-syncs0
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "entries/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/entry")
	b.ReportMetric(float64(s)/float64(b.N), "syncs/entry")
}

// startFloorGroup starts one group with a replica on every node and
// returns it once node lead leads it.
func startFloorGroup(b *testing.B, logs []*nodelog.Log, id uint32, lead int, hlog hclog.Logger) *raft.Raft {
	rafts := make([]*raft.Raft, len(logs))
	trans := make([]*raft.NetworkTransport, len(logs))
	var servers []raft.Server
	for i := range logs {
		t, err := raft.NewTCPTransport("127.0.0.1:0", nil, 3, 10*time.Second, io.Discard)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { t.Close() }) // after raft's Shutdown, registered later
		trans[i] = t
		servers = append(servers, raft.Server{ID: raft.ServerID(fmt.Sprint("n", i)), Address: t.LocalAddr()})
	}
	for i, l := range logs {
		store, err := openBolt(filepath.Join(b.TempDir(), "raft.db"))
		if err != nil {
			b.Fatal(err)
		}
		cached, err := raft.NewLogCache(logCacheEntries, l.Group(id))
		if err != nil {
			b.Fatal(err)
		}
		conf := DefaultTuning().raftConfig(string(servers[i].ID))
		conf.Logger = hlog
		r, err := raft.NewRaft(conf, nopFSM{}, cached, store, raft.NewInmemSnapshotStore(), serialTransport{NetworkTransport: trans[i], log: hlog})
		if err != nil {
			b.Fatal(err)
		}
		rafts[i] = r
		b.Cleanup(func() { r.Shutdown().Error(); store.Close() })
	}
	if err := rafts[lead].BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("group %d: node %d does not lead it after 30 s", id, lead)
		}
		for i, r := range rafts {
			if r.State() == raft.Leader && i != lead {
				r.LeadershipTransferToServer(servers[lead].ID, servers[lead].Address).Error()
			}
		}
		if rafts[lead].State() == raft.Leader && rafts[lead].Barrier(10*time.Second).Error() == nil {
			return rafts[lead]
		}
	}
}

// cpuTime is this process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// nopFSM applies nothing: the benchmark measures Raft and the log alone.
type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nopSnapshot{}, nil }
func (nopFSM) Restore(rc io.ReadCloser) error      { return rc.Close() }

type nopSnapshot struct{}

func (nopSnapshot) Persist(s raft.SnapshotSink) error { return s.Close() }
func (nopSnapshot) Release()                          {}
