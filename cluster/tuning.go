package cluster

import (
	"time"

	"github.com/hashicorp/raft"
)

// Tuning holds the Raft settings of every group a node hosts.
type Tuning struct {
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	SnapshotInterval   time.Duration
	SnapshotThreshold  uint64
	// TrailingLogs is well above raft's default 10,240 so that a follower can
	// catch up from the log after a snapshot install under load.
	TrailingLogs     uint64
	MaxAppendEntries int
	// ApplyTimeout bounds how long a proposal may wait to be enqueued.
	ApplyTimeout time.Duration
	// MaxLogBytes bounds each shard replica's retained Raft log by bytes as
	// well as by entries (logbound.go): with large values, 65,536 trailing
	// entries can be gigabytes. LogBoundEvery is how often it is checked.
	MaxLogBytes   int64
	LogBoundEvery time.Duration
	// MaxClockOffset is how far this node's clock may be from most of its
	// peers' before it refuses to lead (clock.go); ClockCheckEvery is how
	// often it measures.
	MaxClockOffset  time.Duration
	ClockCheckEvery time.Duration
	// MinFreeDisk is the free space of the data directory below which the
	// node refuses to lead (disk.go); DiskCheckEvery is how often it looks.
	MinFreeDisk    int64
	DiskCheckEvery time.Duration
	// FormatEvery is how often a leader looks for a shard whose state
	// format it can raise (format.go); 0 is the default, and < 0 raises
	// none by itself (nor a new shard's on election): tests raise by hand.
	FormatEvery time.Duration
	// CoalesceBytes and CoalesceRequests bound the client writes one log
	// entry of a shard carries when they queued behind the entries in
	// flight, of which a leader keeps at most CoalesceInflight per shard
	// (coalesce.go); 0 means the defaults. CoalesceRequests 1 proposes
	// every write as its own entry, as many in flight as there are.
	CoalesceBytes    int
	CoalesceRequests int
	CoalesceInflight int
}

// DefaultTuning suits a node hosting a few dozen groups.
//
// The heartbeat timeout sets how long writes stop after a leader dies: a
// follower calls an election between one and two heartbeat timeouts after
// it last heard from the leader, and a surviving replica refuses to vote
// while it still believes in the dead leader, so the election waits for
// the later of the two followers (1.0-2.0 s here, 1.67 s on average).
// 1.5 s made that 1.5-3 s (writes back after 3.9 s at the median, 5.3 s at
// worst); the leader sends heartbeats every tenth of it, so a follower
// still misses ten in a row before it calls an election.
func DefaultTuning() Tuning {
	return Tuning{
		HeartbeatTimeout:   1000 * time.Millisecond,
		ElectionTimeout:    1000 * time.Millisecond,
		LeaderLeaseTimeout: 500 * time.Millisecond,
		CommitTimeout:      50 * time.Millisecond,
		SnapshotInterval:   2 * time.Minute,
		SnapshotThreshold:  16384,
		TrailingLogs:       65536,
		MaxAppendEntries:   512,
		ApplyTimeout:       10 * time.Second,
		MaxLogBytes:        64 << 20,
		LogBoundEvery:      5 * time.Second,
		MaxClockOffset:     500 * time.Millisecond,
		ClockCheckEvery:    5 * time.Second,
		MinFreeDisk:        256 << 20,
		DiskCheckEvery:     time.Second,
		FormatEvery:        time.Second,
		CoalesceBytes:      DefaultCoalesceBytes,
		CoalesceRequests:   DefaultCoalesceRequests,
		CoalesceInflight:   DefaultCoalesceInflight,
	}
}

// Scaled multiplies every timeout by f (tests on a loaded 2-core machine use
// f > 1 so CPU starvation does not cause spurious elections).
func (t Tuning) Scaled(f float64) Tuning {
	s := func(d time.Duration) time.Duration { return time.Duration(float64(d) * f) }
	t.HeartbeatTimeout = s(t.HeartbeatTimeout)
	t.ElectionTimeout = s(t.ElectionTimeout)
	t.LeaderLeaseTimeout = s(t.LeaderLeaseTimeout)
	t.CommitTimeout = s(t.CommitTimeout)
	return t
}

func (t Tuning) raftConfig(localID string) *raft.Config {
	c := raft.DefaultConfig()
	c.LocalID = raft.ServerID(localID)
	c.HeartbeatTimeout = t.HeartbeatTimeout
	c.ElectionTimeout = t.ElectionTimeout
	c.LeaderLeaseTimeout = t.LeaderLeaseTimeout
	c.CommitTimeout = t.CommitTimeout
	c.SnapshotInterval = t.SnapshotInterval
	c.SnapshotThreshold = t.SnapshotThreshold
	c.TrailingLogs = t.TrailingLogs
	c.MaxAppendEntries = t.MaxAppendEntries
	c.BatchApplyCh = true
	return c
}
