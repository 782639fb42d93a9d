package ondisk

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
)

// commitSorted commits b's writes in key order, the last write of each
// key only, without a sync. Pebble inserts a batch into its memtable (a
// skiplist of everything not yet flushed) in the batch's order, and an
// insert next to the previous one starts from where that one ended
// instead of from the top of the list: a transaction's writes jump
// between tables (a task's record, then its claim key, then the next
// record), so in their own order each insert searches the whole
// skiplist, and in key order most find their place in a step or two.
// Only Set and Delete are written in a transaction's batch, and for
// those the last write of a key is what the key reads afterwards.
func (s *State) commitSorted(b *pebble.Batch) error {
	ops := s.ops[:0]
	for r := b.Reader(); ; {
		kind, k, v, ok, err := r.Next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if kind != pebble.InternalKeyKindSet && kind != pebble.InternalKeyKindDelete {
			return fmt.Errorf("ondisk: shard %d: a write of kind %v in a transaction", s.shard, kind)
		}
		ops = append(ops, batchOp{kind: kind, key: k, value: v, seq: len(ops), p0: keyWord(k, 0), p1: keyWord(k, 8)})
	}
	slices.SortFunc(ops, compareOps)
	sorted := s.db.NewBatchWithSize(len(b.Repr()))
	defer sorted.Close()
	for i, op := range ops {
		if i+1 < len(ops) && bytes.Equal(op.key, ops[i+1].key) {
			continue // a later write of the key replaces this one
		}
		s.writtenKeys++
		s.writtenBytes += uint64(len(op.key) + len(op.value))
		var err error
		if op.kind == pebble.InternalKeyKindSet {
			err = sorted.Set(op.key, op.value, nil)
		} else {
			err = sorted.Delete(op.key, nil)
		}
		if err != nil {
			return err
		}
	}
	clear(ops) // let the batch's memory go
	s.ops = ops[:0]
	return sorted.Commit(pebble.NoSync)
}

// batchOp is one write of a batch, in commitSorted.
type batchOp struct {
	kind       pebble.InternalKeyKind
	key, value []byte
	seq        int // the write's place in the batch
	// p0, p1: the key's first 16 bytes as numbers (keyWord), which decide
	// most comparisons of the sort without a call to bytes.Compare: every
	// key starts with the shard and a table byte.
	p0, p1 uint64
}

// keyWord is the 8 bytes of k from i on, big-endian, zero-padded: two keys
// whose words differ compare as their words do.
func keyWord(k []byte, i int) uint64 {
	if len(k) >= i+8 {
		return binary.BigEndian.Uint64(k[i:])
	}
	var w [8]byte
	if len(k) > i {
		copy(w[:], k[i:])
	}
	return binary.BigEndian.Uint64(w[:])
}

// compareOps orders writes by key, then by their place in the batch.
func compareOps(a, b batchOp) int {
	if a.p0 != b.p0 {
		return cmp.Compare(a.p0, b.p0)
	}
	if a.p1 != b.p1 {
		return cmp.Compare(a.p1, b.p1)
	}
	return cmp.Or(bytes.Compare(a.key, b.key), cmp.Compare(a.seq, b.seq))
}
