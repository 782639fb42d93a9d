package cluster

import (
	"sync/atomic"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// The node's memory budget (Config.MemoryLimit). In memory, the tasks of
// every shard hosted here share 40% of it, split evenly between the
// shards: the leader of each stamps its share into the Modifies it
// proposes, and the state machine refuses those that would take the
// shard's tasks past it (fsm/budget.go). The other 60% is for what is not
// counted: the Raft log's entries in flight, gRPC buffers, sessions,
// snapshots and checkpoints, and the garbage collector's headroom. On disk,
// nothing is refused: the engine's block cache and memtables are sized from
// the limit instead (engineSizes).
const (
	// tasksMemoryShare is the part of the limit the tasks of all the
	// shards hosted here may take in memory, in percent. A task's counted
	// size (value, id, key, error and TaskOverheadBytes) is below what the
	// heap really holds for it once the collector's headroom is added
	// (about 1.5x at Go's soft limit): at 50% a node capped at 320 MiB
	// reached 290 MiB of RSS with every shard full, at 40% it keeps room
	// for a snapshot and bursts of Raft entries.
	tasksMemoryShare = 40
	// TaskOverheadBytes is what a task costs in memory beyond its id, key,
	// value and error: the task record (about 160 bytes), its id-map slot
	// and entry, the claim index's pointer, the result that echoes it to
	// its producer (kept in its session), with the allocator's rounding
	// (fsm BenchmarkBytesPerTask measures 260 bytes of heap per task of
	// the indexes alone). The leader stamps it beside the budget, so a
	// later binary may change it without replicas of one entry disagreeing.
	TaskOverheadBytes = 320
)

// memoryBudget is the node's memory budget for the tasks of the shards it
// hosts in memory. It reads the number of local replicas without the
// node's lock: Propose stamps the budget, and a caller may hold that
// lock's read side (a second RLock behind a waiting writer deadlocks).
type memoryBudget struct {
	limit int64 // Config.MemoryLimit; <= 0: no bound
	// onDisk: the shards keep their state on disk, where nothing is
	// refused (the engine's caches are sized from the limit instead).
	onDisk bool
	// replicas is the number of replicas hosted here (Node.localShards).
	replicas *atomic.Int32
}

// forShard is the budget this node's leader stamps into a shard's
// Modifies: nil (no bound) on disk or without a limit.
func (b *memoryBudget) forShard() *fsmpb.MemoryBudget {
	bytes := b.shardBytes()
	if bytes == 0 {
		return nil
	}
	return &fsmpb.MemoryBudget{Bytes: bytes, TaskOverhead: TaskOverheadBytes}
}

// shardBytes is one shard's share of the tasks' memory on this node, or 0
// (no bound). The share follows the number of replicas hosted here: a
// replica added to the node shrinks every shard's share, and a shard over
// its new share refuses inserts until claims and deletes bring it back.
func (b *memoryBudget) shardBytes() uint64 {
	if b.limit <= 0 || b.onDisk {
		return 0
	}
	shards := max(int(b.replicas.Load()), 1)
	return uint64(b.limit) * tasksMemoryShare / 100 / uint64(shards)
}

// engineSizes sizes the state engine's block cache and memtables from the
// node's memory limit (0: none): an eighth of it for the cache, at most
// the 128 MiB a node without a limit gets, and a thirty-second for each
// memtable (Pebble keeps up to two full ones besides the one it fills),
// at most 32 MiB. At 320 MiB: a 40 MiB cache and 10 MiB memtables.
func engineSizes(limit int64) (cache, memtable int64) {
	if limit <= 0 {
		return stateCacheBytes, maxMemtableBytes
	}
	return min(max(limit/8, 8<<20), stateCacheBytes), min(max(limit/32, 4<<20), maxMemtableBytes)
}

// maxMemtableBytes is the engine's memtable size without a memory limit.
const maxMemtableBytes = 32 << 20
