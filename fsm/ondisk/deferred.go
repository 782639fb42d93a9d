package ondisk

import (
	"github.com/cockroachdb/pebble/v2"
)

// deferred is what a shard's commits changed among the records the State
// keeps in memory anyway, and the engine does not hold yet: the shard's
// record (meta), the queues' records, the small record, and the sessions'
// records. Every commit changes the shard's record and those of the queues
// it touched, and every command replaces its client's session: written
// through the pending batch, each would cost a skiplist insert there and a
// place in commitSorted's sort, to be replaced by the next commit. Written
// back, each reaches the engine once per commitPending, as what it is
// then, in the same batch as the pending writes: the engine still holds
// the state at one applied index, as before.
//
// Reads: the shard's, queues' and small records are read from the
// engine only by Open; a transaction reads the sessions here before the
// engine (Txn.Session). A view and a read (BeginRead) commit the pending
// writes first, so they find these in the engine.
// deferredSessionsMax bounds the written-back sessions: commands that
// write little else (claims of empty queues, ever-new clients) would
// otherwise keep them from the engine, and in memory, until the next read
// or snapshot.
const deferredSessionsMax = 4096

type deferred struct {
	meta, small bool
	// queues: the names of the queues whose record changed; the record
	// is the State's queue of that name, or none (a deleted queue).
	queues map[string]struct{}
	// sessions: the session records by key (nil: deleted).
	sessions map[string][]byte
}

func (d *deferred) empty() bool {
	return !d.meta && !d.small && len(d.queues) == 0 && len(d.sessions) == 0
}

func (d *deferred) queue(name string) {
	if d.queues == nil {
		d.queues = map[string]struct{}{}
	}
	d.queues[name] = struct{}{}
}

func (d *deferred) session(k string, rec []byte) {
	if d.sessions == nil {
		d.sessions = map[string][]byte{}
	}
	d.sessions[k] = rec
}

// writeDeferred writes the deferred records into b and forgets them.
func (s *State) writeDeferred(b *pebble.Batch) error {
	d := &s.deferred
	for name := range d.queues {
		var err error
		if q := s.queues[name]; q != nil {
			err = b.Set(QueueKey(s.shard, name), q.encode(), nil)
		} else {
			err = b.Delete(QueueKey(s.shard, name), nil)
		}
		if err != nil {
			return err
		}
	}
	for k, rec := range d.sessions {
		var err error
		if rec != nil {
			err = b.Set([]byte(k), rec, nil)
		} else {
			err = b.Delete([]byte(k), nil)
		}
		if err != nil {
			return err
		}
	}
	if d.small {
		if err := b.Set(MetaKey(s.shard, "small"), s.small, nil); err != nil {
			return err
		}
	}
	if d.meta {
		if err := b.Set(MetaKey(s.shard, "shard"), s.meta.encode(), nil); err != nil {
			return err
		}
	}
	clear(d.queues)
	clear(d.sessions)
	d.meta, d.small = false, false
	return nil
}
