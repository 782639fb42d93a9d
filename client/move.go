package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// MoveOptions shape MoveQueue.
type MoveOptions struct {
	// Filter selects the tasks to move: its state, claimant, key_prefix,
	// min_attempt and err_contains fields (queue, ids and paging are
	// MoveQueue's). Tasks with a live lease are never moved (their holder
	// would lose them), so a filter for claimed tasks is refused.
	Filter *taskstorepb.TasksRequest
	// ResetAttempts sets each moved task's attempt to 0 and clears its err
	// (a dead-letter queue sent back to work); otherwise both are kept.
	ResetAttempts bool
	// Batch is how many tasks one transaction moves (default 500, at most
	// 1000): a queue of a million tasks moves in many small log entries,
	// never one giant one.
	Batch int
	// Progress, if set, is called after each batch with the totals so far.
	Progress func(MoveResult)
}

// MoveResult counts what MoveQueue did.
type MoveResult struct {
	Moved   int // moved to the destination
	Skipped int // matched but changed while being moved (claimed, say): left alone
}

// MoveQueue moves the tasks of src that match opts.Filter to dst, a queue
// of the same consistency group, in transactions of opts.Batch tasks. Each
// transaction names the versions it read, so a task changed meanwhile (a
// worker claimed it, a producer changed it) is left alone and counted as
// skipped, and the rest of its batch moves. It stops at ctx's end or the
// first other error, with what it moved so far. Tasks inserted into src
// while it runs may or may not be moved.
func (c *Client) MoveQueue(ctx context.Context, src, dst string, opts MoveOptions) (MoveResult, error) {
	var res MoveResult
	if src == dst {
		return res, fmt.Errorf("move %s to itself: %w", src, ErrInvalid)
	}
	if taskstorepb.GroupOf(src) != taskstorepb.GroupOf(dst) {
		return res, fmt.Errorf("move %s to %s: a move stays within one consistency group (%q, %q): %w",
			src, dst, taskstorepb.GroupOf(src), taskstorepb.GroupOf(dst), ErrInvalid)
	}
	batch := opts.Batch
	if batch <= 0 {
		batch = 500
	}
	batch = min(batch, 1000)
	list := &taskstorepb.TasksRequest{}
	if f := opts.Filter; f != nil {
		if f.State == taskstorepb.TaskState_TASK_STATE_CLAIMED || f.GetClaimed() {
			return res, fmt.Errorf("move %s: claimed tasks are never moved (their holders would lose them): %w", src, ErrInvalid)
		}
		list = &taskstorepb.TasksRequest{State: f.State, Claimant: f.Claimant, KeyPrefix: f.KeyPrefix, MinAttempt: f.MinAttempt, ErrContains: f.ErrContains}
	}
	unclaimed := false
	list.Queue, list.Limit, list.OmitValues, list.Claimed = src, uint32(batch), true, &unclaimed
	zero, empty := uint32(0), ""
	for {
		page, err := c.Tasks(ctx, list)
		if err != nil {
			return res, err
		}
		var changes []*taskstorepb.TaskChange
		now := page.GetTasks()
		for _, t := range now {
			ch := &taskstorepb.TaskChange{Id: t.Id, Version: t.Version, Queue: src, NewQueue: dst}
			if opts.ResetAttempts {
				ch.Attempt, ch.Err = &zero, &empty
			}
			changes = append(changes, ch)
		}
		for len(changes) > 0 {
			_, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Changes: changes})
			var dep *DependencyError
			if errors.As(err, &dep) && len(dep.Errors) > 0 {
				// Leave out what changed since it was read; move the rest.
				gone := map[string]bool{}
				for _, r := range dep.Errors {
					gone[r.Id] = true
				}
				kept := changes[:0]
				for _, ch := range changes {
					if !gone[ch.Id] {
						kept = append(kept, ch)
					}
				}
				if len(kept) == len(changes) {
					return res, err // refused for none of its own changes
				}
				res.Skipped += len(changes) - len(kept)
				changes = kept
				continue
			}
			if err != nil {
				return res, err
			}
			res.Moved += len(changes)
			break
		}
		if opts.Progress != nil && len(now) > 0 {
			opts.Progress(res)
		}
		if page.GetNextPageToken() == "" {
			return res, nil
		}
		list.PageToken = page.GetNextPageToken()
	}
}
