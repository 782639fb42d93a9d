package client

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc"
)

// Hooks for servers that forward other callers' requests through a Client
// (taskproxy). Ordinary callers do not need them.

// DialPassthrough is Dial for a server that forwards requests on behalf of
// other callers. The Client routes, retries and follows leader hints exactly
// as one made by Dial, but sends requests as they were given: an empty
// claimant stays empty (the cluster refuses a claim without one) instead of
// becoming this process's claimant, which every caller of the server would
// otherwise share. WithClaimant is ignored.
func DialPassthrough(ctx context.Context, addrs string, opts ...Option) (*Client, error) {
	c, err := Dial(ctx, addrs, opts...)
	if err != nil {
		return nil, err
	}
	c.opts.claimant = "" // before any call: read without a lock later
	return c, nil
}

// CallAnyNode runs fn against any node that answers, with the Client's retry
// loop (rotation through the nodes, backoff on Unavailable and broken
// connections). Errors come back decoded, as from every other method. It is
// for requests that name no shard, such as a malformed one whose error only
// a node can phrase.
func (c *Client) CallAnyNode(ctx context.Context, op string, fn func(ctx context.Context, cc *grpc.ClientConn) error) error {
	return c.call(ctx, op, target{anyNode: true}, 0, fn)
}

// ShardIDs returns the ids of the shards of the routing table, ascending,
// reading the table first when it is unknown or stale. Proxy-only Clients
// have no table and return an error matching ErrUnavailable.
func (c *Client) ShardIDs(ctx context.Context) ([]uint32, error) {
	if c.opts.proxyOnly {
		return nil, errNoRoute
	}
	ids, err := c.rt.shardIDs(ctx)
	return slices.Clone(ids), err
}

// CallGroup runs fn against the leader of the shard that owns a
// consistency group, with the Client's retry loop, like Modify. fn must be
// safe to repeat: a mutating request must carry a request id. It is for
// forwarding a request as it is, with the caller's own request id.
func (c *Client) CallGroup(ctx context.Context, op, group string, fn func(ctx context.Context, cc *grpc.ClientConn) error) error {
	if group == "" {
		return fmt.Errorf("%s: no consistency group: %w", strings.ToLower(op), ErrInvalid)
	}
	return c.call(ctx, op, target{group: group}, 0, fn)
}
