package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// PutSchedule creates or replaces the periodic schedule s (its name is
// unique within its queue's consistency group): at each tick of s.Cron (in
// s.TimeZone) or of s.Every, the cluster inserts one task into s.Queue with
// s.Value, exactly once whichever node leads. It returns the schedule as
// stored, with its next tick, and whether it replaced one. Retries are
// exactly-once like Modify's.
func (c *Client) PutSchedule(ctx context.Context, s *taskstorepb.Schedule) (stored *taskstorepb.Schedule, replaced bool, err error) {
	if s == nil || s.Queue == "" || s.Name == "" {
		return nil, false, fmt.Errorf("put schedule: name and queue are required: %w", ErrInvalid)
	}
	rid, release := c.nextRequestID()
	defer release()
	req := &taskstorepb.PutScheduleRequest{Schedule: s, Request: rid}
	var resp *taskstorepb.PutScheduleResponse
	err = c.call(ctx, "PutSchedule", target{group: taskstorepb.GroupOf(s.Queue)}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).PutSchedule(ctx, req)
		return err
	})
	return resp.GetSchedule(), resp.GetReplaced(), err
}

// DeleteSchedule removes the schedule name of queue's consistency group
// and reports whether there was one. With queue empty it looks the name up
// on every shard first, and refuses a name that schedules of several groups
// have (ErrAmbiguous).
func (c *Client) DeleteSchedule(ctx context.Context, name, queue string) (bool, error) {
	if name == "" {
		return false, fmt.Errorf("delete schedule: name is required: %w", ErrInvalid)
	}
	if queue == "" {
		all, err := c.Schedules(ctx, &taskstorepb.SchedulesRequest{})
		if err != nil {
			return false, err
		}
		var found []string
		for _, s := range all.Schedules {
			if s.Name == name {
				found = append(found, s.Queue)
			}
		}
		switch len(found) {
		case 0:
			return false, fmt.Errorf("schedule %q: %w", name, ErrNotFound)
		case 1:
			queue = found[0]
		default:
			return false, fmt.Errorf("schedule %q is in %d consistency groups (queues %s): name the queue: %w",
				name, len(found), strings.Join(found, ", "), ErrAmbiguous)
		}
	}
	rid, release := c.nextRequestID()
	defer release()
	req := &taskstorepb.DeleteScheduleRequest{Name: name, Queue: queue, Request: rid}
	var resp *taskstorepb.DeleteScheduleResponse
	err := c.call(ctx, "DeleteSchedule", target{group: taskstorepb.GroupOf(queue)}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).DeleteSchedule(ctx, req)
		return err
	})
	return resp.GetDeleted(), err
}

// Schedules lists the schedules whose queues start with req.Prefix, from
// every shard (or req.Shard), by queue and name.
func (c *Client) Schedules(ctx context.Context, req *taskstorepb.SchedulesRequest) (*taskstorepb.SchedulesResponse, error) {
	if req.Shard == 0 && !c.opts.proxyOnly {
		out := &taskstorepb.SchedulesResponse{}
		var mu sync.Mutex
		var errs []error
		c.rt.eachShard(ctx, func(ctx context.Context, shard uint32) {
			resp, err := c.Schedules(ctx, &taskstorepb.SchedulesRequest{Prefix: req.Prefix, Shard: shard, Stale: req.Stale})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("shard %d: %w", shard, err))
			} else {
				out.Schedules = append(out.Schedules, resp.Schedules...)
			}
		}, &errs)
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		slices.SortFunc(out.Schedules, func(a, b *taskstorepb.Schedule) int {
			return cmp.Or(cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Name, b.Name))
		})
		return out, nil
	}
	var resp *taskstorepb.SchedulesResponse
	err := c.call(ctx, "Schedules", target{shard: req.Shard}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).Schedules(ctx, req)
		return err
	})
	return resp, err
}
