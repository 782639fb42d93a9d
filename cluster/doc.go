// Package cluster is a Taskstore node: it hosts many Raft groups in one
// process and keeps the cluster map.
//
//   - The meta group (Raft group 0, every member node a voter) holds the
//     cluster map: nodes and their addresses, shards and their replicas, and
//     the hash-slot table (consistency group -> slot -> shard). It is the
//     single source of truth for routing.
//   - Each shard is a Raft group (hashicorp/raft) running an fsm.Machine,
//     with file snapshots. Its entries live in the node's one shared log
//     (nodelog: group commit, one fdatasync for every shard's queued
//     appends); its term and vote, and the meta group's log, in
//     raft-boltdb/v2 files with fsync on.
//   - All groups share the node's one listener with gRPC (see Mux).
//   - Gossip (memberlist) carries addresses and health, never Raft
//     membership.
//
// The meta leader's control plane decides in package control (cluster/
// control): where replicas go, which replica a shard prefers as leader,
// where slots move, when a drained node or an emptied shard leaves. Its
// planners are pure functions of the cluster map; this package carries
// their steps out (placement.go, reshard.go, slotmove.go) and keeps the
// runtime: the groups, the meta state machine, gossip, and each shard
// leader's reconciliation of its Raft configuration with the map.
//
// Node assembles the runtime and is the contract with rpc and the test
// harness; each concern with its own state or loop (the state store, the
// meta leadership and its loops, leader balancing, the removal watcher,
// the guards of memory, disk and clock, ...) is a small type holding only
// what it reads (DESIGN.md, "The node's parts").
//
// Rules for callers (the rpc package):
//  1. Write through Shard.Propose on the shard's leader. ErrNotLeader
//     (*NotLeaderError) means nothing was applied; ErrUnknownOutcome means it
//     may have been: answer Unavailable so the client retries with the same
//     request id.
//  2. Read through Shard.Read: linearizable unless the caller asked for a
//     stale read (the fence belongs to the leader's term: IsLeader).
//  3. Shard.Now is the only clock a command may carry.
//
// See DESIGN.md in this directory for the choices behind it.
package cluster
