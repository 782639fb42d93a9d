package client

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// Purge deletes every task of a queue in one command and returns how many
// it deleted. Retries are exactly-once like Modify's.
func (c *Client) Purge(ctx context.Context, queue string) (uint64, error) {
	if queue == "" {
		return 0, fmt.Errorf("purge: queue is required: %w", ErrInvalid)
	}
	rid, release := c.nextRequestID()
	defer release()
	req := &taskstorepb.PurgeRequest{Queue: queue, Request: rid}
	var resp *taskstorepb.PurgeResponse
	err := c.call(ctx, "Purge", target{group: taskstorepb.GroupOf(queue)}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).Purge(ctx, req)
		return err
	})
	return resp.GetDeleted(), err
}
