package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// MoveOptions shape MoveQueue.
type MoveOptions struct {
	// Filter selects the tasks to move: its state, claimant, key_prefix,
	// min_attempt, err_contains and headers fields (queue, ids and paging are
	// MoveQueue's). Tasks with a live lease are never moved (their holder
	// would lose them), so a filter for claimed tasks is refused.
	Filter *taskstorepb.TasksRequest
	// ResetAttempts sets each moved task's attempt to 0 and clears its err
	// (a dead-letter queue sent back to work); otherwise both are kept.
	ResetAttempts bool
	// Batch is how many tasks one transaction moves (default 500, 1-1000):
	// a queue of a million tasks moves in many small log entries, never one
	// giant one. A batch whose answer (which echoes the moved tasks with
	// their values) would be over the answer limit is split in halves.
	Batch int
	// RequestTimeout, when positive, bounds each request; ctx bounds the
	// whole move.
	RequestTimeout time.Duration
	// Progress, if set, is called after each batch with the totals so far.
	Progress func(MoveResult)
}

// MoveResult counts what MoveQueue did.
type MoveResult struct {
	Moved int // moved to the destination
	// Skipped tasks matched but changed while being moved (claimed,
	// changed, deleted) or arrived in the source after the move started
	// (so that tasks coming back into it do not keep it going): left alone.
	Skipped int
	// Conflicts are tasks that cannot move, e.g. their key is taken in the
	// destination; they stay in the source. ConflictIDs names up to 100.
	Conflicts   int
	ConflictIDs []string
	// Claimed tasks match but a worker holds them (a live lease) when the
	// move ends: never moved, they stay in the source (move again after
	// their leases end). One skipped while being moved and held at the end
	// is counted here, not in Skipped. Not counted with a Filter.State,
	// which selects no claimed task.
	Claimed int
}

// MoveCalls are the calls a queue move makes. A *Client is one; a node's
// status page gives its own service (reading its own replica), so that
// both move with this one loop.
type MoveCalls interface {
	Time(ctx context.Context) (time.Time, error)
	Tasks(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error)
	Modify(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error)
}

// MoveQueueWith is MoveQueue over calls that answer as a gRPC server does
// (status errors with their details): their errors are read as the Client
// reads the cluster's, so a refused change is left out and a batch whose
// answer would be too large is split, exactly as for MoveQueue.
func MoveQueueWith(ctx context.Context, calls MoveCalls, src, dst string, opts MoveOptions) (MoveResult, error) {
	return moveQueue(ctx, decodingCalls{calls}, src, dst, opts)
}

// decodingCalls turns a server's status errors into the Client's errors.
type decodingCalls struct{ calls MoveCalls }

func (d decodingCalls) Time(ctx context.Context) (time.Time, error) {
	t, err := d.calls.Time(ctx)
	return t, decode("Time", "", err)
}

func (d decodingCalls) Tasks(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error) {
	resp, err := d.calls.Tasks(ctx, req)
	return resp, decode("Tasks", "", err)
}

func (d decodingCalls) Modify(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error) {
	resp, err := d.calls.Modify(ctx, req)
	return resp, decode("Modify", "", err)
}

// MoveQueue moves the tasks of src that match opts.Filter to dst, a queue
// of the same consistency group, in transactions of opts.Batch tasks. Each
// transaction names the versions it read, so a task changed meanwhile is
// left alone and counted as skipped, and the rest of its batch moves; a
// task that cannot move (its key is taken in dst) is counted as a conflict.
// Tasks modified after the move started (by the cluster's clock) are not
// moved. Tasks under a live lease are never moved: when done, it counts
// those left in src (MoveResult.Claimed). It stops at ctx's end or the
// first other error, with what it moved so far.
func (c *Client) MoveQueue(ctx context.Context, src, dst string, opts MoveOptions) (MoveResult, error) {
	return moveQueue(ctx, c, src, dst, opts)
}

func moveQueue(ctx context.Context, c MoveCalls, src, dst string, opts MoveOptions) (MoveResult, error) {
	var res MoveResult
	if src == dst {
		return res, fmt.Errorf("move %s to itself: %w", src, ErrInvalid)
	}
	if taskstorepb.GroupOf(src) != taskstorepb.GroupOf(dst) {
		return res, fmt.Errorf("move %s to %s: a move stays within one consistency group (%q, %q): %w",
			src, dst, taskstorepb.GroupOf(src), taskstorepb.GroupOf(dst), ErrInvalid)
	}
	batch := opts.Batch
	if batch == 0 {
		batch = 500
	}
	if batch < 1 || batch > 1000 {
		return res, fmt.Errorf("move: a batch of %d tasks: want 1 to 1000: %w", batch, ErrInvalid)
	}
	list := &taskstorepb.TasksRequest{}
	if f := opts.Filter; f != nil {
		if f.State == taskstorepb.TaskState_TASK_STATE_CLAIMED || f.GetClaimed() {
			return res, fmt.Errorf("move %s: claimed tasks are never moved (their holders would lose them): %w", src, ErrInvalid)
		}
		list = &taskstorepb.TasksRequest{State: f.State, Claimant: f.Claimant, KeyPrefix: f.KeyPrefix, MinAttempt: f.MinAttempt, ErrContains: f.ErrContains, Headers: f.Headers}
	}
	unclaimed := false
	list.Queue, list.Limit, list.OmitValues, list.Claimed = src, uint32(batch), true, &unclaimed
	call := func(fn func(ctx context.Context) error) error {
		if opts.RequestTimeout <= 0 {
			return fn(ctx)
		}
		rctx, cancel := context.WithTimeout(ctx, opts.RequestTimeout)
		defer cancel()
		return fn(rctx)
	}
	var start time.Time
	if err := call(func(ctx context.Context) (err error) { start, err = c.Time(ctx); return err }); err != nil {
		return res, err
	}
	zero, empty := uint32(0), ""
	skipped := map[string]bool{} // ids counted in res.Skipped
	for {
		var page *taskstorepb.TasksResponse
		if err := call(func(ctx context.Context) (err error) { page, err = c.Tasks(ctx, list); return err }); err != nil {
			return res, err
		}
		var changes []*taskstorepb.TaskChange
		for _, t := range page.GetTasks() {
			if !matches(t, list) {
				// A node of an older version ignores the filters it does
				// not know: refuse rather than move what was not asked for.
				return res, fmt.Errorf("move %s: the cluster returned task %s, which the filter does not select: upgrade every node before moving with filters: %w", src, t.Id, ErrUnsupported)
			}
			if t.Modified.AsTime().After(start) {
				res.Skipped++ // arrived (or came back) after the move started
				skipped[t.Id] = true
				continue
			}
			ch := &taskstorepb.TaskChange{Id: t.Id, Version: t.Version, Queue: src, NewQueue: dst}
			if opts.ResetAttempts {
				ch.Attempt, ch.Err = &zero, &empty
			}
			changes = append(changes, ch)
		}
		if err := moveBatch(c, call, changes, &res, skipped); err != nil {
			return res, err
		}
		if opts.Progress != nil && len(page.GetTasks()) > 0 {
			opts.Progress(res)
		}
		if page.GetNextPageToken() == "" {
			break
		}
		list.PageToken = page.GetNextPageToken()
	}
	if list.State != taskstorepb.TaskState_TASK_STATE_UNSPECIFIED {
		return res, nil // the filter selects no claimed task
	}
	// Count the tasks the filter selects that a worker holds: left in src.
	claimed := true
	list.Claimed, list.PageToken, list.Limit = &claimed, "", 1000
	for {
		var page *taskstorepb.TasksResponse
		if err := call(func(ctx context.Context) (err error) { page, err = c.Tasks(ctx, list); return err }); err != nil {
			return res, err
		}
		for _, t := range page.GetTasks() {
			if !matches(t, list) {
				continue
			}
			res.Claimed++
			if skipped[t.Id] {
				res.Skipped-- // held now: counted as claimed instead
			}
		}
		if page.GetNextPageToken() == "" {
			return res, nil
		}
		list.PageToken = page.GetNextPageToken()
	}
}

// moveBatch applies changes in one transaction, leaving out those the
// cluster refuses and splitting a batch whose answer would be too large.
func moveBatch(c MoveCalls, call func(func(context.Context) error) error, changes []*taskstorepb.TaskChange, res *MoveResult, skipped map[string]bool) error {
	for len(changes) > 0 {
		err := call(func(ctx context.Context) error {
			_, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Changes: changes})
			return err
		})
		var dep *DependencyError
		switch {
		case err == nil:
			res.Moved += len(changes)
			return nil
		case errors.Is(err, ErrTooLarge) && len(changes) > 1:
			half := len(changes) / 2
			if err := moveBatch(c, call, changes[:half], res, skipped); err != nil {
				return err
			}
			changes = changes[half:]
			continue
		case errors.As(err, &dep) && len(dep.Errors) > 0:
		default:
			return err
		}
		// Leave out what was refused and move the rest.
		// A task may be named more than once (stale and claimed): it is a
		// conflict if any reason is one, else skipped.
		refused := map[string]bool{} // id -> a conflict
		for _, r := range dep.Errors {
			switch r.Category {
			case taskstorepb.RefError_CHANGE_STALE, taskstorepb.RefError_CHANGE_MISSING, taskstorepb.RefError_CLAIMED:
				if _, seen := refused[r.Id]; !seen {
					refused[r.Id] = false // changed, deleted or claimed since it was read
				}
			default:
				refused[r.Id] = true // cannot move: its key is taken in the destination
			}
		}
		for id, conflict := range refused {
			if !conflict {
				res.Skipped++
				skipped[id] = true
				continue
			}
			res.Conflicts++
			if len(res.ConflictIDs) < 100 {
				res.ConflictIDs = append(res.ConflictIDs, id)
			}
		}
		kept := changes[:0]
		for _, ch := range changes {
			if _, out := refused[ch.Id]; !out {
				kept = append(kept, ch)
			}
		}
		if len(kept) == len(changes) {
			return err // refused for none of its own changes
		}
		changes = kept
	}
	return nil
}

// matches checks a listed task against the filters the client can check
// itself (state needs the leader's clock: not checked).
func matches(t *taskstorepb.Task, f *taskstorepb.TasksRequest) bool {
	return (f.Claimant == "" || t.Claimant == f.Claimant) &&
		(f.KeyPrefix == "" || strings.HasPrefix(t.Key, f.KeyPrefix)) &&
		t.Attempt >= f.MinAttempt &&
		(f.ErrContains == "" || strings.Contains(t.Err, f.ErrContains)) &&
		hasHeaders(t.Headers, f.Headers)
}

// hasHeaders reports whether h holds every pair of want.
func hasHeaders(h, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := h[k]; !ok || hv != v {
			return false
		}
	}
	return true
}
