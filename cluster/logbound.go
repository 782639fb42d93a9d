package cluster

import (
	"context"
	"errors"

	"github.com/hashicorp/raft"
)

// minTrailing is the fewest entries a replica keeps after a snapshot, so a
// follower a moment behind still catches up from the log.
const minTrailing = 16

// boundLogs keeps each local replica's Raft log near Tuning.MaxLogBytes:
// raft trims logs by entry counts (SnapshotThreshold, TrailingLogs), which
// with large values is gigabytes. From the replica's mean
// entry size it lowers both counts to fit half the bound each, and when the
// log is over the bound anyway (a burst between raft's own checks) it takes
// a snapshot, after which raft compacts the log and the node log deletes
// segments no group needs.
func (c *chores) boundLogs() {
	t := c.tuning
	if t.MaxLogBytes <= 0 || t.LogBoundEvery <= 0 {
		return
	}
	for sleepUntil(c.stop, t.LogBoundEvery) {
		for _, s := range c.local() {
			c.boundLog(s, t)
		}
	}
}

func (c *chores) boundLog(s *Shard, t Tuning) {
	g, ok := s.g.logs.(interface{ Bytes() int64 })
	if !ok {
		return
	}
	first, _ := s.g.logs.FirstIndex()
	last, _ := s.g.logs.LastIndex()
	bytes := g.Bytes()
	if first == 0 || bytes <= 0 {
		return
	}
	mean := max(1, uint64(bytes)/(last-first+1))
	fit := func(limit uint64) uint64 {
		return min(limit, max(minTrailing, uint64(t.MaxLogBytes)/2/mean))
	}
	// Only the two counts change, and only downward from their base: a
	// ReloadConfig by anyone else (timeouts, a shorter log) is kept, and its
	// counts become the new base.
	// Under reloadMu: the timeouts a dead leader's followers lower for a
	// moment (deadleader.go) must not be written back.
	s.g.reloadMu.Lock()
	rc := s.g.raft.ReloadableConfig()
	cur := [2]uint64{rc.TrailingLogs, rc.SnapshotThreshold}
	if s.logBase == ([2]uint64{}) {
		// Raft started with Tuning's counts: anything else was set by
		// someone else, before this first check as well as after.
		s.logBase = [2]uint64{t.TrailingLogs, t.SnapshotThreshold}
		s.logBound = s.logBase
	}
	if cur != s.logBound {
		s.logBase = cur
	}
	want := [2]uint64{fit(s.logBase[0]), fit(s.logBase[1])}
	if cur != want {
		rc.TrailingLogs, rc.SnapshotThreshold = want[0], want[1]
		if err := s.g.raft.ReloadConfig(rc); err != nil {
			s.g.reloadMu.Unlock()
			c.log.Warn("bound the Raft log by bytes", "shard", s.id, "err", err)
			return
		}
	}
	s.g.reloadMu.Unlock()
	s.logBound = want
	if bytes > t.MaxLogBytes {
		err, stopped := awaitFuture(context.Background(), s.stop, s.g.raft.Snapshot())
		if stopped != nil {
			return
		}
		if err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
			c.log.Warn("snapshot to bound the Raft log by bytes", "shard", s.id, "log_bytes", bytes, "err", err)
		}
	}
}
