// Package control is the meta leader's control plane: it decides how the
// cluster map should change next (where replicas go, which replica a
// shard prefers as leader, where slots move, when a drained node or an
// emptied shard leaves) and drives those decisions through a narrow
// Runtime that the node implements.
//
// The planners (NextPlacement, PlanPlacement, PlanNewShard, PlanSlots,
// PlanMoveOffRetiring, NextRetiring, and for the runtime NextConfigChange,
// a shard leader's next Raft configuration change, MoveSteps, a slot
// move's steps, and PreferredLeader, the replica a shard's leadership is
// handed to) are pure functions of the cluster
// map, deterministic in it, so they are tested from a map alone, without
// Raft: given this map, what is the next command. The node (package cluster) keeps everything with I/O:
// the Raft groups, the meta state machine that applies the commands, gossip,
// and the shard leaders that bring each group's Raft configuration to the
// replica set the map records. Controller carries the planned steps out,
// one a call, through Runtime, and answers the operator's requests (add
// or remove a node or shards, rebalance or move slots): validate against
// the map, record, answer from the map. Its errors (ErrInvalidRequest,
// ErrRefused, NotFoundError) are re-exported by package cluster.
//
// The split follows two models: a store that decides and a layer that
// talks to the cluster, kept apart; and a consensus core that does no I/O
// and hands its caller the steps to carry out.
//
// Nothing here imports package cluster: cluster imports control.
package control
