package rpc

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/schedule"
)

// PutSchedule implements TaskStore.PutSchedule.
func (srv *Server) PutSchedule(ctx context.Context, req *taskstorepb.PutScheduleRequest) (*taskstorepb.PutScheduleResponse, error) {
	res, err := srv.putSchedule(ctx, req)
	return res, toStatus(err)
}

func (srv *Server) putSchedule(ctx context.Context, req *taskstorepb.PutScheduleRequest) (*taskstorepb.PutScheduleResponse, error) {
	in := req.GetSchedule()
	if in == nil {
		return nil, invalid("schedule", "required")
	}
	if in.Every != nil && in.Every.CheckValid() != nil {
		return nil, invalid("schedule.every", "not a valid duration")
	}
	spec, err := schedule.Parse(in.Cron, in.Every.AsDuration(), in.TimeZone)
	if err != nil {
		return nil, invalid("schedule", "%v", err)
	}
	sc := &fsmpb.Schedule{Name: in.Name, Queue: in.Queue, Cron: in.Cron, Every: int64(in.Every.AsDuration()), TimeZone: in.TimeZone,
		Value: in.Value, Priority: in.Priority, CatchUp: in.Missed == taskstorepb.MissedTicks_MISSED_TICKS_RUN_ONCE}
	cmd := &fsmpb.Command{Op: fsmpb.Op_OP_SCHEDULE, Schedule: sc}
	shard, err := srv.queueShard(ctx, in.Queue, cmd, req.Request, fsm.FormatQueueControls, "a schedule")
	if err != nil {
		return nil, err
	}
	// From the whole second: an interval's ticks fall on whole seconds
	// (ids NAME@12:47:08Z, not 12:47:08.940968072Z); a cron expression's
	// next tick is the same either way.
	now := shard.Now()
	sc.Next = spec.Next(now - now%int64(time.Second))
	res, err := proposeOn(ctx, shard, cmd)
	if err != nil {
		return nil, err
	}
	replaced := res.GetSchedule().GetExisted()
	if !res.Replayed {
		srv.log.Info("schedule put", "schedule", sc.Name, "queue", sc.Queue, "cron", sc.Cron, "every", time.Duration(sc.Every),
			"next", time.Unix(0, sc.Next).UTC(), "replaced", replaced)
	}
	// Answer with the schedule as stored: a retry's command was not applied
	// (its next tick, computed again just now, is not the one kept), and a
	// replaced schedule keeps its fired count and last tick.
	stored := sc
	shard.Read(ctx, true, func(m *fsm.Machine) error {
		for _, s := range m.Schedules(sc.Queue) {
			if s.Queue == sc.Queue && s.Name == sc.Name {
				stored = s
			}
		}
		return nil
	})
	return &taskstorepb.PutScheduleResponse{Schedule: scheduleToAPI(stored, shard.ID()), Replaced: replaced}, nil
}

// DeleteSchedule implements TaskStore.DeleteSchedule.
func (srv *Server) DeleteSchedule(ctx context.Context, req *taskstorepb.DeleteScheduleRequest) (*taskstorepb.DeleteScheduleResponse, error) {
	res, err := srv.deleteSchedule(ctx, req)
	return res, toStatus(err)
}

func (srv *Server) deleteSchedule(ctx context.Context, req *taskstorepb.DeleteScheduleRequest) (*taskstorepb.DeleteScheduleResponse, error) {
	if req.Queue == "" {
		return nil, invalid("queue", "required: a queue of the schedule's consistency group (taskctl schedule remove finds it)")
	}
	cmd := &fsmpb.Command{Op: fsmpb.Op_OP_SCHEDULE, Schedule: &fsmpb.Schedule{Name: req.Name, Queue: req.Queue, Remove: true}}
	shard, err := srv.queueShard(ctx, req.Queue, cmd, req.Request, 0, "")
	if err != nil {
		return nil, err
	}
	var upgrading *upgradingError
	if err := needFormat(ctx, shard, fsm.FormatQueueControls, "a schedule"); errors.As(err, &upgrading) {
		// No schedule exists below the format, and a binary older than
		// schedules stops at OP_SCHEDULE: during a rolling upgrade there is
		// nothing to remove, and nothing may be proposed.
		return &taskstorepb.DeleteScheduleResponse{}, nil
	} else if err != nil {
		return nil, err
	}
	res, err := proposeOn(ctx, shard, cmd)
	if err != nil {
		return nil, err
	}
	deleted := res.GetSchedule().GetExisted()
	if deleted && !res.Replayed {
		srv.log.Info("schedule removed", "schedule", req.Name, "group", taskstorepb.GroupOf(req.Queue))
	}
	return &taskstorepb.DeleteScheduleResponse{Deleted: deleted}, nil
}

// Schedules implements TaskStore.Schedules: the schedules of the shards this
// node leads (or of one shard).
func (srv *Server) Schedules(ctx context.Context, req *taskstorepb.SchedulesRequest) (*taskstorepb.SchedulesResponse, error) {
	res, err := srv.schedules(ctx, req)
	return res, toStatus(err)
}

func (srv *Server) schedules(ctx context.Context, req *taskstorepb.SchedulesRequest) (*taskstorepb.SchedulesResponse, error) {
	shards, err := srv.listedShards(req.Shard, req.Stale)
	if err != nil {
		return nil, err
	}
	out := &taskstorepb.SchedulesResponse{}
	for _, s := range shards {
		var ss []*fsmpb.Schedule
		if err := s.Read(ctx, req.Stale, func(m *fsm.Machine) error { ss = m.Schedules(req.Prefix); return nil }); err != nil {
			if req.Shard != 0 {
				return nil, err
			}
			continue // lost leadership since: another node answers for it
		}
		for _, sc := range ss {
			out.Schedules = append(out.Schedules, scheduleToAPI(sc, s.ID()))
		}
	}
	slices.SortFunc(out.Schedules, func(a, b *taskstorepb.Schedule) int {
		return cmp.Or(cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Name, b.Name))
	})
	return out, nil
}

func scheduleToAPI(sc *fsmpb.Schedule, shard uint32) *taskstorepb.Schedule {
	out := &taskstorepb.Schedule{Name: sc.Name, Queue: sc.Queue, Cron: sc.Cron, TimeZone: sc.TimeZone, Value: sc.Value,
		Priority: sc.Priority, Next: nanosToTimestamp(sc.Next), Last: nanosToTimestamp(sc.Last), Fired: sc.Fired, Shard: shard}
	if sc.Every > 0 {
		out.Every = durationpb.New(time.Duration(sc.Every))
	}
	if sc.CatchUp {
		out.Missed = taskstorepb.MissedTicks_MISSED_TICKS_RUN_ONCE
	}
	return out
}
