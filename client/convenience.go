package client

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// InsertOption sets a field of an insert.
type InsertOption func(*taskstorepb.TaskInsert)

// WithID chooses the task's id. With an id a retried insert can never create
// a second task: the cluster refuses the duplicate id.
func WithID(id string) InsertOption { return func(in *taskstorepb.TaskInsert) { in.Id = id } }

// WithKey sets the task's key, unique within its queue.
func WithKey(key string) InsertOption { return func(in *taskstorepb.TaskInsert) { in.Key = key } }

// WithPriority sets the priority (higher first).
func WithPriority(p int32) InsertOption { return func(in *taskstorepb.TaskInsert) { in.Priority = p } }

// WithDelay makes the task available d after the leader's now.
func WithDelay(d time.Duration) InsertOption {
	return func(in *taskstorepb.TaskInsert) { in.Delay, in.At = durationpb.New(d), nil }
}

// WithAt makes the task available at t.
func WithAt(t time.Time) InsertOption {
	return func(in *taskstorepb.TaskInsert) { in.At, in.Delay = timestamppb.New(t), nil }
}

// Held, with a delay or a time in the future, inserts the task held by the
// Client's claimant until then, as if claimed: nobody else may change or
// delete it before its time (the producer may revise it, acting as that
// claimant); then it is available to every worker.
func Held() InsertOption { return func(in *taskstorepb.TaskInsert) { in.Held = true } }

// WithDedupWindow, with a key, keeps the key reserved in its queue for d
// after the task is deleted or purged: an insert of the key within it fails
// as a duplicate (or, with IfAbsent, returns the task as it was deleted), so
// a producer that retries after the work is done does not create it again.
func WithDedupWindow(d time.Duration) InsertOption {
	return func(in *taskstorepb.TaskInsert) { in.DedupWindow = durationpb.New(d) }
}

// WithHeaders sets the task's headers: string pairs kept with it (trace
// context such as a W3C traceparent, user tags), shown in listings and
// filterable (TasksRequest.headers). At most 32 pairs and 4 KiB; keys and
// values non-empty. TaskInsert.Headers and TaskChange.Headers are the same
// field for callers that build requests themselves.
func WithHeaders(h map[string]string) InsertOption {
	return func(in *taskstorepb.TaskInsert) { in.Headers = h }
}

// IfAbsent, with a key, returns the task that already holds the key instead
// of failing.
func IfAbsent() InsertOption { return func(in *taskstorepb.TaskInsert) { in.IfAbsent = true } }

// Insert adds one task to queue and returns it (for IfAbsent with a key
// already present, the existing task).
func (c *Client) Insert(ctx context.Context, queue string, value []byte, opts ...InsertOption) (*Task, error) {
	in := &taskstorepb.TaskInsert{Queue: queue, Value: value}
	for _, o := range opts {
		o(in)
	}
	resp, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{in}})
	if err != nil {
		return nil, err
	}
	if len(resp.Inserted) != 1 {
		return nil, fmt.Errorf("insert: the cluster returned %d tasks for one insert", len(resp.Inserted))
	}
	return resp.Inserted[0], nil
}

// Get returns the task with id, looked up on every shard (each at its
// leader). It returns an error matching ErrNotFound when no shard has it.
// An id is unique within a consistency group only: when tasks of several
// groups have it, Get returns an *AmbiguousIDError listing them (and
// matching ErrAmbiguous) rather than pick one; GetIn or Find then.
func (c *Client) Get(ctx context.Context, id string) (*Task, error) {
	found, err := c.Find(ctx, id)
	if err != nil {
		return nil, err
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("task %q: %w", id, ErrNotFound)
	case 1:
		return found[0], nil
	}
	return nil, &AmbiguousIDError{ID: id, Tasks: found}
}

// GetIn returns the task with id in queue's consistency group, if it is in
// queue. It returns an error matching ErrNotFound otherwise.
func (c *Client) GetIn(ctx context.Context, queue, id string) (*Task, error) {
	resp, err := c.Tasks(ctx, &taskstorepb.TasksRequest{Queue: queue, Ids: []string{id}})
	if err != nil {
		return nil, err
	}
	for _, t := range resp.Tasks {
		if t.Id == id && t.Queue == queue {
			return t, nil
		}
	}
	return nil, fmt.Errorf("task %q in queue %q: %w", id, queue, ErrNotFound)
}

// Find returns every task with id, one per consistency group that has one,
// looked up on every shard and sorted by queue. None is not an error.
func (c *Client) Find(ctx context.Context, id string) ([]*Task, error) {
	resp, err := c.Tasks(ctx, &taskstorepb.TasksRequest{Ids: []string{id}})
	if err != nil {
		return nil, err
	}
	var out []*Task
	for _, t := range resp.Tasks {
		if t.Id == id {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b *Task) int { return cmp.Compare(a.Queue, b.Queue) })
	return out, nil
}

// ListQueues returns the queues whose names start with prefix, from every
// shard, sorted by name.
func (c *Client) ListQueues(ctx context.Context, prefix string) ([]*QueueStats, error) {
	resp, err := c.Queues(ctx, &taskstorepb.QueuesRequest{Prefix: prefix})
	if err != nil {
		return nil, err
	}
	return resp.Queues, nil
}

// RefOption qualifies a reference to a task version in Delete and Release.
type RefOption func(*refOptions)

type refOptions struct {
	queue    string
	claimant string
}

// InQueue gives the task's current queue, which routes the request. Without
// it the Client looks the task up first (Get), and refuses an id that
// tasks of several consistency groups have (ErrAmbiguous) rather than pick
// one of them.
func InQueue(queue string) RefOption { return func(o *refOptions) { o.queue = queue } }

// AsClaimant acts as claimant, which may change or delete a task it holds.
// The default is the Client's claimant.
func AsClaimant(name string) RefOption { return func(o *refOptions) { o.claimant = name } }

// taskGetter finds a task by id alone (Client.Get).
type taskGetter interface {
	Get(ctx context.Context, id string) (*Task, error)
}

// applyRefOptions applies opts and, unless they name the queue, finds the
// task's queue with g.
func applyRefOptions(ctx context.Context, g taskGetter, id string, opts []RefOption) (refOptions, error) {
	var o refOptions
	for _, f := range opts {
		f(&o)
	}
	if o.queue != "" {
		return o, nil
	}
	t, err := g.Get(ctx, id)
	if err != nil {
		return o, err
	}
	o.queue = t.Queue
	return o, nil
}

// Delete deletes version of task id. A missing task or another version is
// refused with a *DependencyError.
func (c *Client) Delete(ctx context.Context, id string, version uint64, opts ...RefOption) error {
	o, err := applyRefOptions(ctx, c, id, opts)
	if err != nil {
		return err
	}
	_, err = c.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: o.claimant,
		Deletes: []*taskstorepb.TaskRef{{Id: id, Version: version, Queue: o.queue}}})
	return err
}

// ClaimNext is the claim part of a commit (see Modify): up to limit tasks of
// queues, which must be in the committed task's consistency group, under a
// lease (0 means the cluster's default of 30s).
func ClaimNext(lease time.Duration, limit uint32, queues ...string) *taskstorepb.ModifyClaim {
	cl := &taskstorepb.ModifyClaim{Queues: queues, Limit: limit}
	if lease > 0 {
		cl.Lease = durationpb.New(lease)
	}
	return cl
}

// DeleteAndClaim deletes version of task id and, in the same request and
// log entry, claims up to next.Limit tasks of next.Queues (see ClaimNext).
// It returns the claimed tasks, none when nothing was available; a refused
// delete claims nothing and returns a *DependencyError.
func (c *Client) DeleteAndClaim(ctx context.Context, id string, version uint64, next *taskstorepb.ModifyClaim, opts ...RefOption) ([]*Task, error) {
	o, err := applyRefOptions(ctx, c, id, opts)
	if err != nil {
		return nil, err
	}
	resp, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: o.claimant,
		Deletes: []*taskstorepb.TaskRef{{Id: id, Version: version, Queue: o.queue}}, Claim: next})
	if err != nil {
		return nil, err
	}
	return resp.Claimed, nil
}

// Release ends the claim on version of task id and makes it available at
// once: a change with a zero delay, so "now" is the shard leader's clock,
// not this machine's. It returns the new version.
func (c *Client) Release(ctx context.Context, id string, version uint64, opts ...RefOption) (*Task, error) {
	o, err := applyRefOptions(ctx, c, id, opts)
	if err != nil {
		return nil, err
	}
	resp, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: o.claimant,
		Changes: []*taskstorepb.TaskChange{{Id: id, Version: version, Queue: o.queue, Delay: durationpb.New(0)}}})
	if err != nil {
		return nil, err
	}
	if len(resp.Changed) != 1 {
		return nil, fmt.Errorf("release: the cluster returned %d tasks for one change", len(resp.Changed))
	}
	return resp.Changed[0], nil
}
