package cluster

import (
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// diskGuard is what this node knows of its data disk, and what it does
// about it.
//
// A follower whose disk fills cannot append: the leader retries it forever,
// which costs nothing while a quorum of others acknowledges. A leader whose
// disk fills cannot append either, and every write of the shards it leads
// stops; worse, a leadership handed to such a node (by the leaderBalancer, on
// gossip health alone) takes the shard down with it. So the node watches the
// free space of its data directory, and below Tuning.MinFreeDisk it:
//   - refuses to lead, as a node with a far clock does: its proposals answer
//     "not leader" and it hands every leadership it holds away;
//   - gossips disk_low, so peers do not hand it leadership (leaderBalancer.preferred);
//   - says so: ERROR once, taskstore_disk_free_bytes and taskstore_disk_low,
//     and the node's row in `taskctl status`.
//
// It keeps following: a follower needs no more space than the log it is sent,
// and it catches up as soon as space is freed. The reserve (256 MiB by
// default) covers the node log's next pre-allocated segments (64 MiB each)
// and a snapshot or two, so the node notices before a write fails.
type diskGuard struct {
	dir string
	// measure measures the free bytes of dir's file system
	// (Config.DiskFree, else statfs).
	measure func(dir string) (uint64, error)
	// reserve is Tuning.MinFreeDisk; every is Tuning.DiskCheckEvery.
	reserve int64
	every   time.Duration
	log     *slog.Logger
	// freeGauge and lowGauge are taskstore_disk_free_bytes and
	// taskstore_disk_low.
	freeGauge, lowGauge prometheus.Gauge
	// changed is told when the disk goes low or has space again (the
	// node gossips it).
	changed func(low bool)
	// local lists the replicas hosted here, whose leaderships a low disk
	// hands away.
	local func() []*Shard

	mu   sync.Mutex
	free uint64
	low  bool
	seen bool // free was measured at least once
}

func newDiskGuard(cfg Config, log *slog.Logger, m *nodeMetrics, local func() []*Shard, changed func(low bool)) *diskGuard {
	measure := cfg.DiskFree
	if measure == nil {
		measure = diskFree
	}
	return &diskGuard{dir: cfg.DataDir, measure: measure, reserve: cfg.Tuning.MinFreeDisk, every: cfg.Tuning.DiskCheckEvery,
		log: log, freeGauge: m.diskFree, lowGauge: m.diskLow, changed: changed, local: local}
}

// diskFree measures the bytes an unprivileged writer may still use in dir.
func diskFree(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// DiskLow reports whether this node's data disk is below its reserve.
func (n *Node) DiskLow() bool { return n.disk.isLow() }

func (d *diskGuard) isLow() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.low
}

// freeBytes is the free space last measured, and whether any was.
func (d *diskGuard) freeBytes() (uint64, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.free, d.seen
}

// check measures the data disk once and acts on a change (watch runs it).
func (d *diskGuard) check() {
	free, err := d.measure(d.dir)
	if err != nil {
		d.log.Warn("cannot measure the data disk's free space", "err", err)
		return
	}
	reserve := uint64(max(d.reserve, 0))
	d.mu.Lock()
	was := d.low
	d.free, d.seen = free, true
	d.low = free < reserve
	low := d.low
	d.mu.Unlock()
	d.freeGauge.Set(float64(free))
	if low {
		d.lowGauge.Set(1)
	} else {
		d.lowGauge.Set(0)
	}
	if low != was {
		switch {
		case low:
			d.log.Error("the data disk is nearly full: this node hands away its shard leaderships and takes none until space is freed (free space, or grow the volume)",
				"dir", d.dir, "free_bytes", free, "min_free_bytes", reserve)
		default:
			d.log.Info("the data disk has space again; this node may lead", "dir", d.dir, "free_bytes", free)
		}
		d.changed(low)
	}
	if low {
		handAwayLeaderships(d.local()) // best effort; the next check retries
	}
}

// watch checks the data disk every Tuning.DiskCheckEvery until stop closes.
func (d *diskGuard) watch(stop <-chan struct{}) {
	if d.every <= 0 || d.reserve <= 0 {
		return
	}
	for first := true; first || sleepUntil(stop, d.every); first = false {
		d.check()
	}
}

// handAwayLeaderships asks every replica of shards that leads to hand its
// leadership away (best effort).
func handAwayLeaderships(shards []*Shard) {
	for _, s := range shards {
		if s.g.raft.State() == raft.Leader {
			s.g.raft.LeadershipTransfer()
		}
	}
}

// mayNotLead says why a node with these guards must not lead a shard now,
// or "".
func mayNotLead(clock *clockGuard, disk *diskGuard) string {
	switch {
	case clock.isBad():
		return "clock too far from its peers'"
	case disk.isLow():
		return "data disk nearly full"
	}
	return ""
}
