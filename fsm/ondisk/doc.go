// Package ondisk is the on-disk layout of the shards' state:
// how tasks, their claim and due-time indexes, unique keys and the
// state's incremental digest map onto one ordered key-value engine per
// node, and the record codec. fsm's on-disk store (fsm/diskstore.go, a
// node's --state disk) keeps a shard's state through it. DESIGN.md beside
// this file has the layout and the numbers that chose the engine.
//
// Every key starts with the shard (4 bytes, big-endian) and a table byte,
// so one engine holds every shard a node replicates and a shard's state is
// one contiguous range (a snapshot is one range read, removing a replica
// one range delete).
package ondisk
