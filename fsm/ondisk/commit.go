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
//
// Claim and due keys (singleDeleted) are written as a change of the
// engine's state: a set where the key was absent, a single delete where
// it was present, nothing where it is as it was. A single delete and the
// set it meets in a compaction (or a flush) both vanish, where a delete
// stays as a tombstone down to the last level; it is correct only if the
// key was set once since it was last deleted, which this keeps: the
// transaction sets a claim or due key only where it is absent (index, for
// a task with no stored version) and deletes one only where it is present
// (unindex, Advance), so a task replaced without moving (a delete and a
// set of the same key, then present as before) writes nothing, where
// layout 2 set the key again over itself.
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
		ops = append(ops, batchOp{kind: kind, key: k, value: v})
	}
	order := sortOps(ops, s.sortBuf[:0])
	sorted := s.db.NewBatchWithSize(len(b.Repr()))
	defer sorted.Close()
	for i := 0; i < len(order); {
		first := ops[order[i].i]
		for i++; i < len(order) && bytes.Equal(ops[order[i].i].key, first.key); i++ {
		}
		op := ops[order[i-1].i] // the last write of the key replaces the others
		kind := op.kind
		if singleDeleted(op.key) {
			// Set only where absent, deleted only where present: the
			// first write says whether the key was there before the
			// transaction, the last whether it is after.
			before, after := first.kind == pebble.InternalKeyKindDelete, op.kind == pebble.InternalKeyKindSet
			if before == after {
				continue // there before and after (valueless: unchanged), or neither
			}
			if !after {
				kind = pebble.InternalKeyKindSingleDelete
			}
		}
		s.writtenKeys++
		s.writtenBytes += uint64(len(op.key) + len(op.value))
		var err error
		switch kind {
		case pebble.InternalKeyKindSet:
			err = sorted.Set(op.key, op.value, nil)
		case pebble.InternalKeyKindSingleDelete:
			err = sorted.SingleDelete(op.key, nil)
		default:
			err = sorted.Delete(op.key, nil)
		}
		if err != nil {
			return err
		}
	}
	clear(ops) // let the batch's memory go
	s.ops, s.sortBuf = ops[:0], order[:0]
	return sorted.Commit(pebble.NoSync)
}

// batchOp is one write of a batch, in commitSorted.
type batchOp struct {
	kind       pebble.InternalKeyKind
	key, value []byte
}

// sortOp is a write's place in the sort: ops[i], and 16 bytes of its key
// as two numbers (keyWord) from where the batch's keys start to differ,
// which decide most comparisons without a call to bytes.Compare (every
// key of a shard starts with the same shard and most with one table
// byte). The sort moves these 24 bytes, not the write.
type sortOp struct {
	p0, p1 uint64
	i      int32
}

// sortOps returns the places of ops in key order, writes of one key in
// their order in the batch, in buf's memory.
func sortOps(ops []batchOp, buf []sortOp) []sortOp {
	off := 0 // the bytes every key shares, up to 8
	if len(ops) > 0 {
		first := ops[0].key
		off = min(len(first), 8)
		for _, op := range ops[1:] {
			off = min(off, len(op.key))
			for off > 0 && !bytes.Equal(op.key[:off], first[:off]) {
				off--
			}
		}
	}
	order := buf[:0]
	for i, op := range ops {
		order = append(order, sortOp{p0: keyWord(op.key, off), p1: keyWord(op.key, off+8), i: int32(i)})
	}
	slices.SortFunc(order, func(a, b sortOp) int {
		if a.p0 != b.p0 {
			return cmp.Compare(a.p0, b.p0)
		}
		if a.p1 != b.p1 {
			return cmp.Compare(a.p1, b.p1)
		}
		return cmp.Or(bytes.Compare(ops[a.i].key, ops[b.i].key), cmp.Compare(a.i, b.i))
	})
	return order
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

// singleDeleted reports whether k is a claim or due key: valueless, set
// and deleted in turn, so deleted with a single delete (commitSorted).
func singleDeleted(k []byte) bool {
	return len(k) > shardLen && (k[shardLen] == TableClaim || k[shardLen] == TableDue)
}
