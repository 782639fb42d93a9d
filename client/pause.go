package client

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// PauseQueue stops queue from handing out claims until ResumeQueue:
// inserts and changes go on, claims find nothing in it, waiting claims stay
// parked, and tasks already claimed keep their leases. It reports whether
// the queue was already paused. Retries are exactly-once like Modify's.
func (c *Client) PauseQueue(ctx context.Context, queue string) (wasPaused bool, err error) {
	return c.setPaused(ctx, "PauseQueue", queue)
}

// ResumeQueue lets a paused queue hand out claims again; waiting claims
// wake at once. It reports whether the queue was paused.
func (c *Client) ResumeQueue(ctx context.Context, queue string) (wasPaused bool, err error) {
	return c.setPaused(ctx, "ResumeQueue", queue)
}

func (c *Client) setPaused(ctx context.Context, method, queue string) (bool, error) {
	if queue == "" {
		return false, fmt.Errorf("%s: queue is required: %w", method, ErrInvalid)
	}
	rid, release := c.nextRequestID()
	defer release()
	req := &taskstorepb.QueuePauseRequest{Queue: queue, Request: rid}
	var resp *taskstorepb.QueuePauseResponse
	err := c.call(ctx, method, target{group: taskstorepb.GroupOf(queue)}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		ts := taskstorepb.NewTaskStoreClient(cc)
		if method == "PauseQueue" {
			resp, err = ts.PauseQueue(ctx, req)
		} else {
			resp, err = ts.ResumeQueue(ctx, req)
		}
		return err
	})
	return resp.GetWasPaused(), err
}

// SetQueueLimit bounds how many of queue's tasks may be claimed at once,
// across all workers (0 removes the bound), and returns the limit it
// replaced. A claim that would exceed it takes fewer or none; waiting
// claims wake when a claim ends. Retries are exactly-once like Modify's.
func (c *Client) SetQueueLimit(ctx context.Context, queue string, maxClaimed uint32) (previous uint32, err error) {
	if queue == "" {
		return 0, fmt.Errorf("set queue limit: queue is required: %w", ErrInvalid)
	}
	rid, release := c.nextRequestID()
	defer release()
	req := &taskstorepb.QueueLimitRequest{Queue: queue, MaxClaimed: maxClaimed, Request: rid}
	var resp *taskstorepb.QueueLimitResponse
	err = c.call(ctx, "SetQueueLimit", target{group: taskstorepb.GroupOf(queue)}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).SetQueueLimit(ctx, req)
		return err
	})
	return resp.GetPrevious(), err
}

// SetQueuePolicy sets the rules the server enforces on queue's tasks
// (taskstorepb.QueuePolicy: a delivery limit and its dead-letter queue),
// replacing its policy (nil or all zero removes it), and returns the policy
// it replaced (nil: none). Retries are exactly-once like Modify's.
func (c *Client) SetQueuePolicy(ctx context.Context, queue string, policy *taskstorepb.QueuePolicy) (previous *taskstorepb.QueuePolicy, err error) {
	if queue == "" {
		return nil, fmt.Errorf("set queue policy: queue is required: %w", ErrInvalid)
	}
	rid, release := c.nextRequestID()
	defer release()
	req := &taskstorepb.QueuePolicyRequest{Queue: queue, Policy: policy, Request: rid}
	var resp *taskstorepb.QueuePolicyResponse
	err = c.call(ctx, "SetQueuePolicy", target{group: taskstorepb.GroupOf(queue)}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).SetQueuePolicy(ctx, req)
		return err
	})
	return resp.GetPrevious(), err
}

// QueuePolicy returns queue's policy, nil when it has none.
func (c *Client) QueuePolicy(ctx context.Context, queue string) (*taskstorepb.QueuePolicy, error) {
	if queue == "" {
		return nil, fmt.Errorf("queue policy: queue is required: %w", ErrInvalid)
	}
	resp, err := c.Queues(ctx, &taskstorepb.QueuesRequest{Prefix: queue})
	if err != nil {
		return nil, err
	}
	for _, q := range resp.Queues {
		if q.Name == queue {
			return q.Policy, nil
		}
	}
	return nil, nil
}
