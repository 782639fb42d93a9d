package ondisk

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// meta is the shard's own record, written with every commit.
type meta struct {
	applied   uint64
	clock     int64
	nextQueue uint32
	digest    Digest
	// sessions and sessionBytes count the exactly-once records and their
	// sizes (SessionSize).
	sessions, sessionBytes uint64
	// tasks and reservations count the task records and key reservations.
	tasks, reservations uint64
	// layout is the layout the shard's range is in (Layout once Open has
	// upgraded it).
	layout byte
}

// metaLen1 is the shard record's size in layout 1, which had no layout
// byte; metaLen adds it. A binary of layout 1 refuses the longer record
// ("shard record of 85 bytes, want 84") rather than misread the range.
const (
	metaLen1 = 8 + 8 + 4 + 32 + 8 + 8 + 8 + 8
	metaLen  = metaLen1 + 1
)

func (m meta) encode() []byte {
	b := make([]byte, 0, metaLen)
	b = binary.BigEndian.AppendUint64(b, m.applied)
	b = binary.BigEndian.AppendUint64(b, uint64(m.clock))
	b = binary.BigEndian.AppendUint32(b, m.nextQueue)
	d := m.digest.Bytes()
	b = append(b, d[:]...)
	b = binary.BigEndian.AppendUint64(b, m.sessions)
	b = binary.BigEndian.AppendUint64(b, m.sessionBytes)
	b = binary.BigEndian.AppendUint64(b, m.tasks)
	b = binary.BigEndian.AppendUint64(b, m.reservations)
	return append(b, Layout)
}

func decodeMeta(b []byte) (meta, error) {
	layout := byte(1)
	switch len(b) {
	case metaLen1:
	case metaLen:
		layout = b[metaLen1]
		if layout > Layout {
			return meta{}, fmt.Errorf("ondisk: the shard's data is in layout %d, newer than this binary's %d: run a newer binary on it", layout, Layout)
		}
	default:
		return meta{}, fmt.Errorf("ondisk: shard record of %d bytes, want %d", len(b), metaLen)
	}
	m := meta{applied: binary.BigEndian.Uint64(b), clock: int64(binary.BigEndian.Uint64(b[8:])), nextQueue: binary.BigEndian.Uint32(b[16:])}
	m.digest = DigestFromBytes([32]byte(b[20:52]))
	m.sessions, m.sessionBytes = binary.BigEndian.Uint64(b[52:]), binary.BigEndian.Uint64(b[60:])
	m.tasks, m.reservations = binary.BigEndian.Uint64(b[68:]), binary.BigEndian.Uint64(b[76:])
	m.layout = layout
	return m, nil
}

// upgrade brings a range written by an older layout to Layout: layout 1
// kept the session order as keys (table 'o'), which layout 2 keeps in
// memory, so they are deleted; before layout 3, a claim or due key could
// be set again over itself (a task replaced without moving), and layout 3
// deletes them with single deletes, which would uncover the older set, so
// they are written anew over a range delete (rewriteIndexes). The shard
// record names the new layout in the last batch. No sync: a crash before
// the next flush leaves the old layout, upgraded again at the next Open.
func (s *State) upgrade() error {
	if s.meta.layout >= Layout {
		return nil
	}
	if err := s.rewriteIndexes(); err != nil {
		return err
	}
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.DeleteRange(tableKey(s.shard, TableSessionOrder, 0), tableKey(s.shard, TableSessionOrder+1, 0), nil); err != nil {
		return err
	}
	m := s.meta
	m.layout = Layout
	if err := b.Set(MetaKey(s.shard, "shard"), m.encode(), nil); err != nil {
		return err
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return err
	}
	s.meta = m
	return nil
}

// rewriteChunk is how many keys rewriteIndexes writes per batch.
var rewriteChunk = 10_000

// rewriteIndexes writes the shard's claim and due keys anew (tables 'c'
// and 'd', adjacent), a batch per rewriteChunk keys: each batch deletes
// its part of the tables with a range delete and sets its keys again
// after it, so that every key is then set once over a range delete, as
// single deletes need (commitSorted), whatever older sets the engine's
// files hold and whatever snapshots are open. What it writes is what was
// there: a crash part way leaves a range that reads the same, upgraded
// again at the next Open.
func (s *State) rewriteIndexes() error {
	lo, hi := tableKey(s.shard, TableClaim, 0), tableKey(s.shard, TableDue+1, 0)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	from := lo
	var keys [][]byte
	write := func(to []byte) error {
		b := s.db.NewBatch()
		defer b.Close()
		if err := b.DeleteRange(from, to, nil); err != nil {
			return err
		}
		for _, k := range keys {
			if err := b.Set(k, nil, nil); err != nil {
				return err
			}
		}
		keys, from = keys[:0], to
		return b.Commit(pebble.NoSync)
	}
	for ok := it.First(); ok; ok = it.Next() {
		if len(it.Value()) != 0 {
			return fmt.Errorf("ondisk: index key %x has a value", it.Key())
		}
		keys = append(keys, bytes.Clone(it.Key()))
		if len(keys) == rewriteChunk {
			if err := write(append(bytes.Clone(keys[len(keys)-1]), 0)); err != nil {
				return err
			}
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	return write(hi)
}
