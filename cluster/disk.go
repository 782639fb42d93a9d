package cluster

import (
	"fmt"
	"sync"
	"syscall"

	"github.com/hashicorp/raft"
)

// diskState is what this node knows of its data disk.
//
// A follower whose disk fills cannot append: the leader retries it forever,
// which costs nothing while a quorum of others acknowledges. A leader whose
// disk fills cannot append either, and every write of the shards it leads
// stops; worse, a leadership handed to such a node (by balanceLeaders, on
// gossip health alone) takes the shard down with it. So the node watches the
// free space of its data directory, and below Tuning.MinFreeDisk it:
//   - refuses to lead, as a node with a far clock does: its proposals answer
//     "not leader" and it hands every leadership it holds away;
//   - gossips disk_low, so peers do not hand it leadership (preferredLeader);
//   - says so: ERROR once, taskstore_disk_free_bytes and taskstore_disk_low,
//     and the node's row in `taskctl status`.
//
// It keeps following: a follower needs no more space than the log it is sent,
// and it catches up as soon as space is freed. The reserve (256 MiB by
// default) covers the node log's next pre-allocated segments (64 MiB each)
// and a snapshot or two, so the node notices before a write fails.
type diskState struct {
	mu   sync.Mutex
	free uint64
	low  bool
	seen bool // free was measured at least once
}

// diskFree measures the bytes an unprivileged writer may still use in dir.
func diskFree(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// diskFreeFunc measures the data disk: Config.DiskFree, else statfs.
func (n *Node) diskFreeFunc() func(string) (uint64, error) {
	if n.cfg.DiskFree != nil {
		return n.cfg.DiskFree
	}
	return diskFree
}

// DiskLow reports whether this node's data disk is below its reserve.
func (n *Node) DiskLow() bool {
	n.disk.mu.Lock()
	defer n.disk.mu.Unlock()
	return n.disk.low
}

// diskFreeBytes is the free space last measured, and whether any was.
func (n *Node) diskFreeBytes() (uint64, bool) {
	n.disk.mu.Lock()
	defer n.disk.mu.Unlock()
	return n.disk.free, n.disk.seen
}

// CheckDisk measures the data disk once and acts on a change (watchDisk runs
// it; tests call it).
func (n *Node) CheckDisk() {
	measure := n.diskFreeFunc()
	free, err := measure(n.cfg.DataDir)
	if err != nil {
		n.log.Warn("cannot measure the data disk's free space", "err", err)
		return
	}
	reserve := uint64(max(n.cfg.Tuning.MinFreeDisk, 0))
	d := &n.disk
	d.mu.Lock()
	was := d.low
	d.free, d.seen = free, true
	d.low = free < reserve
	low := d.low
	d.mu.Unlock()
	n.metrics.diskFree.Set(float64(free))
	if low {
		n.metrics.diskLow.Set(1)
	} else {
		n.metrics.diskLow.Set(0)
	}
	if low != was {
		switch {
		case low:
			n.log.Error("the data disk is nearly full: this node hands away its shard leaderships and takes none until space is freed (free space, or grow the volume)",
				"dir", n.cfg.DataDir, "free_bytes", free, "min_free_bytes", reserve)
		default:
			n.log.Info("the data disk has space again; this node may lead", "dir", n.cfg.DataDir, "free_bytes", free)
		}
		if n.gossip != nil {
			if err := n.gossip.setMeta(gossipMeta{Address: n.addr, HTTPAddress: n.cfg.HTTPAddr, DiskLow: low}); err != nil {
				n.log.Warn("gossip the disk state", "err", err)
			}
		}
	}
	if low {
		for _, s := range n.LocalShards() {
			if s.g.raft.State() == raft.Leader {
				s.g.raft.LeadershipTransfer() // best effort; the next check retries
			}
		}
	}
}

// watchDisk checks the data disk every Tuning.DiskCheckEvery.
func (n *Node) watchDisk() {
	every := n.cfg.Tuning.DiskCheckEvery
	if every <= 0 || n.cfg.Tuning.MinFreeDisk <= 0 {
		return
	}
	for first := true; first || n.sleep(every); first = false {
		n.CheckDisk()
	}
}

// mayNotLead says why this node must not lead a shard now, or "".
func (n *Node) mayNotLead() string {
	switch {
	case n.ClockBad():
		return "clock too far from its peers'"
	case n.DiskLow():
		return "data disk nearly full"
	}
	return ""
}
