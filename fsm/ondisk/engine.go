package ondisk

import (
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
)

// EngineOptions are the Pebble options of a node's state engine (see
// DESIGN.md): no WAL, because the node's Raft log is the durable record and
// the state records the index it has applied; a bounded block cache and
// memtables, because memory must not grow with the tasks; Bloom filters,
// because every insert looks up an id that is not there (to replace an
// earlier version), and without a filter that reads an index block per
// level.
func EngineOptions(cacheBytes int64) *pebble.Options {
	o := &pebble.Options{
		DisableWAL:   true,
		Cache:        pebble.NewCache(cacheBytes),
		MemTableSize: 32 << 20,
		// Compact L0 at 8 files (Pebble's default 4), stopping writes at
		// 24 (12): a task's claim and due keys spread over every queue's
		// range, so each L0 compaction rewrites much of Lbase; waiting for
		// more files rewrites it less often. Batched inserts through a
		// cluster +3 to +23% (DESIGN.md, "Compaction of L0").
		L0CompactionThreshold: 8,
		L0StopWritesThreshold: 24,
	}
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	return o
}
