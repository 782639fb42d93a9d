// Package client is the Go client of Taskstore.
//
// A Client is made by Dial with one or more node addresses. It reads the
// routing table (hash slot -> shard -> replicas and leader) from any node and
// sends each request straight to the leader of the shard that owns the
// request's consistency group. With WithProxyOnly it sends everything to the
// given addresses (taskproxy instances) instead, and they route.
//
// Rules the Client keeps, so that callers need not:
//
//  1. Every Modify and Claim carries a request id (a session of this Client
//     and a sequence number). Every retry of one call repeats the same id, so
//     a retry after an unknown outcome returns the first result instead of
//     applying twice. Concurrent calls use different sessions, because the
//     cluster refuses a sequence number lower than the last one it saw for a
//     client id.
//  2. A node that does not lead the shard answers Unavailable with the
//     leader's address; the Client goes there at once and remembers it.
//  3. Unavailable without a hint (election, no quorum, unknown outcome), a
//     server-side deadline, a broken connection or a hung node (each attempt
//     has its own timeout) make the Client refresh the routing table and
//     retry after a pause that grows exponentially, with full jitter, until
//     the context ends. The context is the only overall deadline.
//  4. Everything else (refused transactions, bad input, limits) is returned
//     at once.
//
// Errors: a refused transaction is a *DependencyError listing every
// offending reference; errors.Is matches the sentinels ErrRefused,
// ErrInvalid, ErrTooLarge, ErrFull (a shard's memory budget is full: retry
// later), ErrNotFound, ErrUnavailable, ErrUnsupported and ErrClosed; status.Code still gives the gRPC code the cluster answered with.
//
// Reads that name no shard, Get by id and queue listings, are asked of every
// shard's leader and merged.
//
// A Client is safe for concurrent use.
package client
