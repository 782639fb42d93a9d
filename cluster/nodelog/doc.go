// Package nodelog is one write-ahead log per node shared by all the node's
// data-shard Raft groups, each of which sees it as its own raft.LogStore
// (Log.Group).
//
// Why: with a store per group, each group's leader and followers pay their
// own fsync for whatever that group alone has queued, so a node hosting
// eight groups with two requests in flight each does eight small fsyncs
// where one would do, and adding shards makes a cluster slower. Here every
// append of every group goes to one writer goroutine, which writes whatever
// is queued from all groups as one batch with one fdatasync (group commit),
// as dragonboat, TiKV's raft-engine and CockroachDB do with one log per
// node.
//
// Layout: numbered segment files (<seq>.wal, 64 MiB by default) of
// records, each [crc32c(body) u32][len(body) u32][body]. A body is an entry
// of one group (index, term, type, time, data, extensions) or an instruction
// that removes a group's entries (below an index, from an index, or all).
// Memory holds, per group, the file position of every live entry; reading an
// entry is one pread. On open the segments are replayed in order. A segment
// whose entries are all removed is deleted once every older one is (only a
// prefix of the segments is ever deleted, so no removal instruction is lost
// while an entry it removes is still on disk).
//
// Crash safety: an append returns only after its bytes are fdatasynced. A
// crash can leave a torn record at the end of the newest segment; opening
// detects it (short header, length beyond the file, or checksum mismatch),
// cuts the file there and never replays it. A bad record anywhere else is
// damage, not a torn write. When it can be tied to one group (its length is
// proven by a good record after it, and its group and index continue that
// group's entries or are confirmed by the group's next entry), or a group's
// indexes have a gap, that group is damaged (Group.Damaged) and the log
// opens for the others; a reset of the group (its replica rebuilt) clears
// it. Other damage makes Open refuse.
package nodelog
