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
	}
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	return o
}
