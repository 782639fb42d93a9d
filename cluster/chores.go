package cluster

import (
	"context"
	"log/slog"
	"time"

	"github.com/e1158ecb/taskstore/fsm"
)

// chores is the housekeeping a node does on the replicas it hosts, each
// in its own loop until stop closes: ticks of idle shards and of shards
// with tasks come due, the schedules' fires (all three only where the
// replica leads), and the bound on each Raft log's bytes (logbound.go).
type chores struct {
	tuning Tuning
	log    *slog.Logger
	stop   <-chan struct{}
	// local lists the replicas hosted here.
	local func() []*Shard
}

// eachShard calls f on every local replica every period until stop
// closes, each call within Tuning.ApplyTimeout; what names a failure in
// the debug log.
func (c *chores) eachShard(every time.Duration, what string, f func(context.Context, *Shard) error) {
	for sleepUntil(c.stop, every) {
		for _, s := range c.local() {
			ctx, cancel := context.WithTimeout(context.Background(), c.tuning.ApplyTimeout)
			if err := f(ctx, s); err != nil {
				c.log.Debug(what, "shard", s.id, "err", err)
			}
			cancel()
		}
	}
}

// tickIdle proposes an OP_TICK on each shard this node leads whose clock
// stood still for half a checkpoint period, so that idle shards still
// checkpoint (at most about two entries per minute per idle shard).
func (c *chores) tickIdle() {
	c.eachShard(time.Duration(fsm.CheckpointEvery/8), "tick idle shard", func(ctx context.Context, s *Shard) error {
		_, err := s.TickIfIdle(ctx, time.Duration(fsm.CheckpointEvery/2))
		return err
	})
}

// tickDue ticks each shard this node leads once a delayed or claimed task
// has come due by the leader's clock and no command has moved the
// machine's clock past it: queue counts (stats, the status page, the
// taskstore_queue_tasks gauge, on every replica) then turn the task
// available within about dueEvery, without waiting for an unrelated write
// (they froze until one came). A busy shard needs no tick: every
// command moves the clock.
func (c *chores) tickDue() {
	c.eachShard(dueEvery, "tick shard with tasks due", func(ctx context.Context, s *Shard) error {
		_, err := s.TickIfDue(ctx)
		return err
	})
}

// expireRetained deletes, on each shard this node leads, the tasks its
// queues' retention policies no longer keep, in bounded steps
// (retention.go), every retainEvery.
func (c *chores) expireRetained() {
	c.eachShard(retainEvery, "expire retained tasks", func(ctx context.Context, s *Shard) error {
		_, err := s.ExpireRetained(ctx)
		return err
	})
}

// fireSchedules fires the due ticks of periodic schedules on each shard
// this node leads, every dueEvery.
func (c *chores) fireSchedules() {
	c.eachShard(dueEvery, "fire schedules", func(ctx context.Context, s *Shard) error {
		_, err := s.FireSchedules(ctx)
		return err
	})
}
