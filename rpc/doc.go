// Package rpc serves the public API (api/proto/taskstore/v1/taskstore.proto)
// on a node.
//
// Wire protocol, in prose: every node serves TaskStore (Modify, Claim,
// Tasks, Queues, Time, Purge, PauseQueue, ResumeQueue, SetQueueLimit,
// PutSchedule, DeleteSchedule, Schedules, and the Produce stream), Admin
// (Status, Routing, TransferLeader, AddNode, RemoveNode, RebuildReplica,
// MoveSlots, AddShards, RemoveShard, RebalanceSlots, and the Backup
// stream), grpc.health.v1 and reflection on its one --listen port; Raft
// traffic shares that port (see cluster/DESIGN.md). The HTTP/JSON mapping
// (taskstore_http.yaml) is served by the proxy, not by nodes. A request is routed by its consistency group: the text
// of a queue name before the first '/'. slot = FNV-1a(group) mod len(slots),
// and Routing's slots[slot] names the shard. Only the shard's leader accepts
// writes and non-stale reads; any other node answers Unavailable with a
// NotLeader detail (shard, leader id and address) so the caller can go
// straight there.
//
// Codes (chosen in one place, errors.go; a refusal of the state machine by
// its Failure.kind, never by its message):
//   - FailedPrecondition: the transaction was refused; a ModifyError detail
//     lists every offending reference by category. Nothing changed.
//   - Unavailable: not the leader (NotLeader detail), no quorum, a slot
//     being moved, or an outcome that is unknown. Retry; Modify and Claim
//     carry a RequestID so a retry never applies twice.
//   - InvalidArgument: a bad field, a request spanning consistency groups.
//   - ResourceExhausted: a value or request over a limit, an answer that
//     would be over the send limit, or a shard at its memory budget.
//   - PermissionDenied: a caller outside its queue prefixes.
//
// Produce items in flight are bounded per stream and per node
// (Server.SetProduceInflight, defaults 1024 and 8192): at a bound the stream
// is read no further until an item is answered, so a fast client is held
// back by gRPC flow control, never queued without bound; nothing sent is
// dropped.
//
// Validation happens here, before proposing, so nothing invalid reaches the
// log.
package rpc
