package rpc

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

func timeFromNanos(ns int64) time.Time { return time.Unix(0, ns).UTC() }

func taskToAPI(t *fsmpb.Task) *taskstorepb.Task {
	return &taskstorepb.Task{
		Id:          t.Id,
		Version:     t.Version,
		Queue:       t.Queue,
		At:          nanosToTimestamp(t.At),
		Claimant:    t.Claimant,
		Priority:    t.Priority,
		Key:         t.Key,
		Value:       t.Value,
		Created:     nanosToTimestamp(t.Created),
		Modified:    nanosToTimestamp(t.Modified),
		Claims:      t.Claims,
		Attempt:     t.Attempt,
		Err:         t.Err,
		DedupWindow: nanosToDuration(t.DedupWindow),
		Headers:     t.Headers,
	}
}

// nanosToDuration converts a duration the state machine keeps, nil for 0.
func nanosToDuration(n int64) *durationpb.Duration {
	if n == 0 {
		return nil
	}
	return durationpb.New(time.Duration(n))
}

func tasksToAPI(ts []*fsmpb.Task) []*taskstorepb.Task {
	out := make([]*taskstorepb.Task, len(ts))
	for i, t := range ts {
		out[i] = taskToAPI(t)
	}
	return out
}

// TaskToAPI converts a task of the state machine into the API's, as every
// answer does (client/clienttest reads its machines through it).
func TaskToAPI(t *fsmpb.Task) *taskstorepb.Task { return taskToAPI(t) }
