package cluster

import (
	"context"
	"time"

	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/schedule"
)

// FireSchedules proposes one OP_FIRE for each schedule of the shard whose
// next tick is due by the leader's clock, when this replica leads, and
// returns how many it proposed. The state machine applies a fire only for
// the tick it expects, so a tick fired by two leaders (one deposed while
// its proposal was in flight) inserts once; a tick found late (no leader at
// its time) inserts once or not, by the schedule's catch_up.
func (s *Shard) FireSchedules(ctx context.Context) (int, error) {
	if !s.IsLeader() {
		return 0, nil
	}
	now := s.Now()
	fired := 0
	for _, sc := range s.machine.DueSchedules(now) {
		spec, err := schedule.Parse(sc.Cron, time.Duration(sc.Every), sc.TimeZone)
		if err != nil {
			// Validated when put; a zone this binary does not know (an
			// older zone database) leaves the schedule waiting: said once
			// per tick, not every look.
			if s.unevaluable != sc.Next {
				s.unevaluable = sc.Next
				s.log.Warn("schedule cannot be evaluated: its ticks wait", "schedule", sc.Name, "queue", sc.Queue, "err", err)
			}
			continue
		}
		next, insert := spec.Fire(sc.Next, now, sc.CatchUp)
		res, err := s.Propose(ctx, &fsmpb.Command{Op: fsmpb.Op_OP_FIRE, Fire: &fsmpb.Fire{
			Queue: sc.Queue, Name: sc.Name, Tick: sc.Next, Next: next, Insert: insert}})
		if err != nil {
			s.countTick("failed")
			return fired, err
		}
		fired++
		switch {
		case res.GetModify() != nil:
			s.countTick("inserted")
		case insert:
			s.countTick("duplicate") // fired already (a proposal of an earlier leader, or the schedule changed)
		default:
			s.countTick("skipped")
		}
		if !insert {
			s.log.Info("schedule tick missed while the shard had no leader: skipped", "schedule", sc.Name, "queue", sc.Queue,
				"tick", time.Unix(0, sc.Next).UTC(), "task", fsm.ScheduleTaskID(sc.Name, sc.Next))
		}
	}
	return fired, nil
}

func (s *Shard) countTick(result string) {
	if s.scheduleTicks != nil {
		s.scheduleTicks.WithLabelValues(result).Inc()
	}
}
