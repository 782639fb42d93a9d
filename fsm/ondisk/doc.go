// Package ondisk is the on-disk layout of the shards' state:
// how tasks, their claim and due-time indexes, unique keys and the
// state's incremental digest map onto one ordered key-value engine per
// node, and the record codec. It is the first part of moving the state
// machine out of memory; fsm does not use it yet. DESIGN.md beside this
// file has the plan and the numbers that chose the engine.
//
// Every key starts with the shard (4 bytes, big-endian) and a table byte,
// so one engine holds every shard a node replicates and a shard's state is
// one contiguous range (a snapshot is one range read, removing a replica
// one range delete).
package ondisk
