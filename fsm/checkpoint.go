package fsm

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"sync"
	"time"
)

// CheckpointEvery is how much log time passes between two state
// checkpoints. Replicas compare checkpoints to find one whose state
// diverged from the others', so every replica must use the same
// value: it is a constant of the log's meaning, not a setting.
const CheckpointEvery = int64(time.Minute)

// checkpointRing is how many completed checkpoints a Machine keeps.
const checkpointRing = 16

// Checkpoint is the Digest of the state right after the entry at Index was
// applied. A checkpoint is taken after each entry that moves the clock into
// a new CheckpointEvery bucket (floor(clock/CheckpointEvery) grows): that
// depends only on the log, so replicas that applied the same log take
// checkpoints at the same indexes with the same digests.
type Checkpoint struct {
	Index uint64
	// Clock is the machine clock at Index (log time, nanoseconds).
	Clock  int64
	Digest [32]byte
	// OnDisk says Digest is of a machine on disk, computed another way
	// (onDiskDigest): comparable only with other OnDisk checkpoints.
	OnDisk bool
}

// checkpoints holds a Machine's recent checkpoints. Digests are computed
// on their own goroutines, so Apply never waits for sorting and hashing the
// state; only completed checkpoints are listed.
type checkpoints struct {
	mu   sync.Mutex // guards ring and gen
	ring []Checkpoint
	// gen changes on Restore: digests of the replaced state still being
	// computed are dropped when they finish.
	gen uint64
	wg  sync.WaitGroup // digests being computed (tests wait on it)
}

// crossesCheckpoint reports whether moving the clock from before to after
// enters a new checkpoint bucket.
func crossesCheckpoint(before, after int64) bool {
	return after/CheckpointEvery > before/CheckpointEvery
}

// checkpointLocked starts a checkpoint of the state as it is now, at index.
// The caller holds m.mu for writing; the view (viewSnapshot) is taken here and
// the digest computed from it on another goroutine.
func (m *Machine) checkpointLocked(index uint64) {
	if d, ok := m.st.store.(*diskStore); ok {
		m.checkpointOnDisk(d, index)
		return
	}
	snap := m.st.viewSnapshot()
	m.cp.mu.Lock()
	gen := m.cp.gen
	m.cp.mu.Unlock()
	m.cp.wg.Add(1)
	go func() {
		defer m.cp.wg.Done()
		snap.materialize()
		d := digestOf(snap)
		m.cp.add(gen, Checkpoint{Index: index, Clock: snap.clock, Digest: d})
	}()
}

// checkpointOnDisk checkpoints a machine on disk without reading its
// state: the engine keeps a digest of its records as it writes them
// (ondisk.Digest), so the batch is committed up to this entry and its
// digest read, which is the same on every replica at this index however it
// batched the entries before, or installed a snapshot.
func (m *Machine) checkpointOnDisk(d *diskStore, index uint64) {
	d.commit(index, m.st.encodeSmall())
	cp := Checkpoint{Index: index, Clock: m.st.clock, Digest: onDiskDigest(d, m.st.clock), OnDisk: true}
	d.begin()
	m.cp.mu.Lock()
	gen := m.cp.gen
	m.cp.mu.Unlock()
	m.cp.add(gen, cp)
}

// onDiskDigest is a checkpoint's digest of the committed state of d
// (its small state included), at clock.
func onDiskDigest(d *diskStore, clock int64) (sum [32]byte) {
	dg := d.st.Digest().Bytes()
	h := sha256.New()
	h.Write([]byte("taskstore fsm on-disk digest v1"))
	h.Write(dg[:])
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(clock)))
	h.Sum(sum[:0])
	return sum
}

func (c *checkpoints) add(gen uint64, cp Checkpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	// Digests may finish out of order: keep the ring sorted by index.
	i, found := slices.BinarySearchFunc(c.ring, cp.Index, func(a Checkpoint, idx uint64) int {
		switch {
		case a.Index < idx:
			return -1
		case a.Index > idx:
			return 1
		}
		return 0
	})
	if found {
		c.ring[i] = cp
		return
	}
	c.ring = slices.Insert(c.ring, i, cp)
	if len(c.ring) > checkpointRing {
		c.ring = slices.Delete(c.ring, 0, len(c.ring)-checkpointRing)
	}
}

// reset forgets every checkpoint (the state was replaced).
func (c *checkpoints) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.ring = nil
}

// Checkpoints returns the completed checkpoints, oldest first (at most the
// last 16). A checkpoint whose digest is still being computed is not listed
// yet. Restore forgets them all.
func (m *Machine) Checkpoints() []Checkpoint {
	m.cp.mu.Lock()
	defer m.cp.mu.Unlock()
	return slices.Clone(m.cp.ring)
}
