package harness

import (
	"fmt"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/testing/checker"
)

// This file holds the fault and observation helpers the chaos tests use
// (testing/chaos): pausing processes, isolating nodes, leadership transfer,
// forced snapshots with a short log, clock offsets, counting leader
// changes, and sampling every voter's state at a barrier. Like the rest of
// Cluster they must be called from the test goroutine (they read the
// cluster's node list, which Kill and Restart change).

// Pause stops the process with SIGSTOP, as a long GC pause, a frozen VM or
// a stopped container would: its sockets stay open, it answers nothing.
func (p *Process) Pause() error { return p.raw(syscall.SIGSTOP) }

// Resume continues a paused process with SIGCONT.
func (p *Process) Resume() error { return p.raw(syscall.SIGCONT) }

func (p *Process) raw(sig syscall.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return fmt.Errorf("%s is not running", p.ID)
	}
	return cmd.Process.Signal(sig)
}

// NodeIDs returns the ids of every node, running or not.
func (c *Cluster) NodeIDs() []string {
	ids := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		ids[i] = n.ID
	}
	return ids
}

// Running reports whether node i runs.
func (c *Cluster) Running(i int) bool { return c.Nodes[i].srv != nil }

// Isolate cuts node i off from every other node, both ways (Raft and
// node-to-node gRPC; clients still reach it).
func (c *Cluster) Isolate(i int) {
	c.net.Partition([]string{c.Nodes[i].ID}, c.NodeIDs())
}

// Shards returns the shard ids of the cluster map.
func (c *Cluster) Shards() []uint32 {
	for _, n := range c.Nodes {
		if n.srv != nil {
			var out []uint32
			for _, s := range n.srv.Node.Map().Shards {
				out = append(out, s.Id)
			}
			return out
		}
	}
	return nil
}

// raftOf returns node i's Raft instance for shard, or nil.
func (c *Cluster) raftOf(i int, shard uint32) *raft.Raft {
	n := c.Nodes[i]
	if n.srv == nil {
		return nil
	}
	s := n.srv.Node.Shard(shard)
	if s == nil {
		return nil
	}
	return s.Raft()
}

// TransferLeader moves the leadership of shard to node to (or, with to <
// 0, to any other voter), from its current leader.
func (c *Cluster) TransferLeader(shard uint32, to int) error {
	l := c.Leader(shard)
	if l < 0 {
		return fmt.Errorf("shard %d has no leader", shard)
	}
	r := c.raftOf(l, shard)
	var f raft.Future
	if to < 0 {
		f = r.LeadershipTransfer()
	} else {
		f = r.LeadershipTransferToServer(raft.ServerID(c.Nodes[to].ID), raft.ServerAddress(c.Nodes[to].Addr))
	}
	return f.Error()
}

// Snapshot makes node i take a snapshot of shard now (and compact its log
// down to TrailingLogs entries).
func (c *Cluster) Snapshot(shard uint32, i int) error {
	r := c.raftOf(i, shard)
	if r == nil {
		return fmt.Errorf("%s does not run shard %d", c.Nodes[i].ID, shard)
	}
	return r.Snapshot().Error()
}

// ReloadRaft changes the reloadable Raft settings (TrailingLogs,
// SnapshotThreshold, SnapshotInterval, timeouts) of shard on every running
// node, e.g. a short log so that a lagging follower needs a snapshot. A
// restarted node gets its configured settings back.
func (c *Cluster) ReloadRaft(shard uint32, f func(*raft.ReloadableConfig)) error {
	for i := range c.Nodes {
		r := c.raftOf(i, shard)
		if r == nil {
			continue
		}
		rc := r.ReloadableConfig()
		f(&rc)
		if err := r.ReloadConfig(rc); err != nil {
			return fmt.Errorf("%s: %w", c.Nodes[i].ID, err)
		}
	}
	return nil
}

// RaftConfig reads node i's reloadable Raft settings for shard; false when
// the node does not run it.
func (c *Cluster) RaftConfig(i int, shard uint32) (raft.ReloadableConfig, bool) {
	r := c.raftOf(i, shard)
	if r == nil {
		return raft.ReloadableConfig{}, false
	}
	return r.ReloadableConfig(), true
}

// RaftStat reads a numeric field of node i's Raft stats for shard
// ("last_log_index", "last_snapshot_index", "term", "applied_index"...),
// 0 when unknown.
func (c *Cluster) RaftStat(i int, shard uint32, key string) uint64 {
	r := c.raftOf(i, shard)
	if r == nil {
		return 0
	}
	v, _ := strconv.ParseUint(r.Stats()[key], 10, 64)
	return v
}

// SetClockOffset makes node i's clock run d ahead (or behind, d < 0) of
// the wall clock from its next start: stop it first, then Restart.
func (c *Cluster) SetClockOffset(i int, d time.Duration) {
	c.t.Helper()
	if c.Nodes[i].srv != nil {
		c.t.Fatalf("%s must be stopped to change its clock", c.Nodes[i].ID)
	}
	c.Nodes[i].cfg.Clock = func() time.Time { return time.Now().Add(d) }
}

// FillDisk makes node i measure free bytes of free space on its data disk,
// as if the disk had filled, from its next check on; 0 goes back to the
// real free space. Writes still succeed: this tests what the node does when
// it sees the disk fill, not the write errors.
func (c *Cluster) FillDisk(i int, free uint64) {
	c.Nodes[i].diskFree.Store(free)
}

// LeaderTracker counts leader changes by polling every shard's leader. The
// test goroutine polls it (Sleep polls while it waits), so changes shorter
// than the polling interval may be missed; Terms counts every election.
type LeaderTracker struct {
	c       *Cluster
	last    map[uint32]string
	terms   map[uint32]uint64
	start   map[uint32]uint64
	changes int
}

// TrackLeaders starts counting from the current leaders and terms.
func (c *Cluster) TrackLeaders() *LeaderTracker {
	lt := &LeaderTracker{c: c, last: map[uint32]string{}, terms: map[uint32]uint64{}, start: map[uint32]uint64{}}
	lt.Poll()
	for s, t := range lt.terms {
		lt.start[s] = t
	}
	return lt
}

// Poll looks at every shard's leader once.
func (lt *LeaderTracker) Poll() {
	for _, s := range lt.c.Shards() {
		if l := lt.c.Leader(s); l >= 0 {
			id := lt.c.Nodes[l].ID
			if prev, ok := lt.last[s]; ok && prev != id {
				lt.changes++
			}
			lt.last[s] = id
		}
		for i := range lt.c.Nodes {
			lt.terms[s] = max(lt.terms[s], lt.c.RaftStat(i, s, "term"))
		}
	}
}

// Sleep waits d, polling every 20ms.
func (lt *LeaderTracker) Sleep(d time.Duration) {
	end := time.Now().Add(d)
	for {
		lt.Poll()
		left := time.Until(end)
		if left <= 0 {
			return
		}
		time.Sleep(min(left, 20*time.Millisecond))
	}
}

// Changes is the number of leader changes seen.
func (lt *LeaderTracker) Changes() int { return lt.changes }

// Terms is the number of terms started (elections, including transfers)
// across shards since tracking began.
func (lt *LeaderTracker) Terms() int {
	n := 0
	for s, t := range lt.terms {
		n += int(t - lt.start[s])
	}
	return n
}

// ReplicaState is one voter of a shard sampled at a barrier.
type ReplicaState struct {
	Shard   uint32
	Node    string
	Applied uint64
	Digest  [32]byte
}

// ReplicaStates waits until, for every shard, each voter in the leader's
// configuration runs and all of them applied the same index with nothing
// pending on the leader, stable over two polls; then it samples every
// voter's applied index and digest. Stop the workload first.
func (c *Cluster) ReplicaStates(timeout time.Duration) ([]ReplicaState, error) {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		var out []ReplicaState
		if out, last = c.sampleReplicas(); last == nil {
			time.Sleep(100 * time.Millisecond)
			again, err := c.sampleReplicas()
			if err == nil && sameSamples(out, again) {
				return again, nil
			}
			if err != nil {
				last = err
			} else {
				last = fmt.Errorf("replicas still applying")
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, fmt.Errorf("replicas did not converge in %v: %w", timeout, last)
}

func sameSamples(a, b []ReplicaState) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (c *Cluster) sampleReplicas() ([]ReplicaState, error) {
	index := map[string]int{}
	for i, n := range c.Nodes {
		index[n.ID] = i
	}
	var out []ReplicaState
	for _, shard := range c.Shards() {
		l := c.Leader(shard)
		if l < 0 {
			return nil, fmt.Errorf("shard %d has no leader", shard)
		}
		lr := c.raftOf(l, shard)
		if lr.LastIndex() != lr.AppliedIndex() {
			return nil, fmt.Errorf("shard %d: leader has entries to apply", shard)
		}
		f := lr.GetConfiguration()
		if err := f.Error(); err != nil {
			return nil, fmt.Errorf("shard %d: configuration: %w", shard, err)
		}
		var applied uint64
		first := true
		for _, srv := range f.Configuration().Servers {
			if srv.Suffrage != raft.Voter {
				continue
			}
			i, ok := index[string(srv.ID)]
			if !ok || c.Nodes[i].srv == nil {
				return nil, fmt.Errorf("shard %d: voter %s is not running", shard, srv.ID)
			}
			sh := c.Nodes[i].srv.Node.Shard(shard)
			if sh == nil {
				return nil, fmt.Errorf("shard %d: voter %s does not host it (yet)", shard, srv.ID)
			}
			m := sh.Machine()
			a := m.AppliedIndex()
			if !first && a != applied {
				return nil, fmt.Errorf("shard %d: voters at different applied indexes (%d, %d)", shard, applied, a)
			}
			applied, first = a, false
			out = append(out, ReplicaState{Shard: shard, Node: string(srv.ID), Applied: a, Digest: m.Digest()})
		}
	}
	return out, nil
}

// ReplicaLogs reads, for each sampled replica (ReplicaStates), that replica's
// Raft log of the shard up to the applied index all voters reached: every
// entry compared is committed, so any difference is a divergence.
func (c *Cluster) ReplicaLogs(states []ReplicaState) ([]checker.ReplicaLog, error) {
	index := map[string]int{}
	for i, n := range c.Nodes {
		index[n.ID] = i
	}
	var out []checker.ReplicaLog
	for _, st := range states {
		i, ok := index[st.Node]
		if !ok || c.Nodes[i].srv == nil {
			return nil, fmt.Errorf("shard %d: %s is not running", st.Shard, st.Node)
		}
		sh := c.Nodes[i].srv.Node.Shard(st.Shard)
		if sh == nil {
			return nil, fmt.Errorf("shard %d: %s does not host it", st.Shard, st.Node)
		}
		l, err := checker.ReadLog(st.Shard, st.Node, sh.Log(), st.Applied)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// MetaVoters lists the servers of the meta group's Raft configuration as
// node i sees it.
func (c *Cluster) MetaVoters(i int) []raft.Server {
	cfg, err := c.Nodes[i].srv.Node.MetaConfiguration()
	if err != nil {
		c.t.Fatal(err)
	}
	return cfg.Servers
}
