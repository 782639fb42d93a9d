package fsm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/fsm/ondisk"
)

// A marker is what a machine on disk writes as raft's snapshot when
// Options.MarkerSnapshots is set: no state, only the index the engine held
// (and flushed) when raft took it. The engine is the snapshot: raft still
// truncates its log up to there, and restores it at start, which keeps the
// engine's state (Restore). A follower that needs the state gets a full
// stream that the node's snapshot store makes from the engine when raft
// opens the marker to send it (FullSnapshot, cluster's snapshot store): of
// the state now, at or past the marker's index, which is the marker's
// state with the entries after it applied, and the follower skips those
// as raft replays them (ApplyBatch).
//
// Format: markerMagic, the index (8 bytes, big-endian), CRC-32C of both.
const markerMagic = "TSKMARK1"

const markerLen = len(markerMagic) + 8 + 4

// IsMarker reports whether r starts with a marker, without consuming it.
func IsMarker(r *bufio.Reader) bool {
	b, err := r.Peek(len(markerMagic))
	return err == nil && string(b) == markerMagic
}

func encodeMarker(applied uint64) []byte {
	b := binary.BigEndian.AppendUint64([]byte(markerMagic), applied)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// readMarker reads a whole marker from r.
func readMarker(r io.Reader) (uint64, error) {
	b := make([]byte, markerLen)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, corrupt("marker: %v", err)
	}
	body, sum := b[:markerLen-4], binary.BigEndian.Uint32(b[markerLen-4:])
	if string(body[:len(markerMagic)]) != markerMagic || crc32.Checksum(body, castagnoli) != sum {
		return 0, corrupt("marker: bad magic or checksum")
	}
	return binary.BigEndian.Uint64(body[len(markerMagic):]), nil
}

// errMarkerInMemory refuses a marker on a machine in memory: the state it
// stands for is in an engine this machine does not read.
var errMarkerInMemory = errors.New("fsm: restore: the snapshot is a marker of a state kept on disk (--state disk), and this machine keeps its state in memory without the engine: start the node with --state disk, or rebuild this replica from its peers (taskctl shard rebuild)")

// markerSnapshot is a marker being taken: Persist writes it once the
// engine flushed everything up to its index.
type markerSnapshot struct {
	applied uint64
	flushed <-chan struct{}
}

func (s *markerSnapshot) Persist(sink raft.SnapshotSink) error {
	<-s.flushed
	if _, err := sink.Write(encodeMarker(s.applied)); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("fsm: persist marker: %w", err)
	}
	return sink.Close()
}

func (s *markerSnapshot) Release() {}

// restoreMarker handles a marker given to Restore: a machine on disk whose
// engine holds its index or a later one keeps its state.
func (m *Machine) restoreMarker(r io.Reader) error {
	applied, err := readMarker(r)
	if err != nil {
		return err
	}
	if _, onDisk := m.st.store.(*diskStore); !onDisk {
		if m.opts.MarkerSource == nil {
			return errMarkerInMemory
		}
		rc, err := m.opts.MarkerSource()
		if err != nil {
			return fmt.Errorf("fsm: restore: the state on disk a marker stands for: %w", err)
		}
		if err := m.Restore(rc); err != nil {
			return err
		}
		if held := m.AppliedIndex(); held < applied {
			return fmt.Errorf("fsm: restore: the snapshot is a marker of index %d of the state on disk, but the engine holds only index %d", applied, held)
		}
		return nil
	}
	if held := m.AppliedIndex(); held < applied {
		return fmt.Errorf("fsm: restore: the snapshot is a marker of index %d of the state on disk, but the engine holds only index %d: it lost what it had flushed (rebuild this replica from its peers: taskctl shard rebuild)", applied, held)
	}
	return nil
}

// FullSnapshot is a snapshot of the whole state, as Snapshot takes one
// without Options.MarkerSnapshots: what a follower installs.
func (m *Machine) FullSnapshot() (raft.FSMSnapshot, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if d, ok := m.st.store.(*diskStore); ok {
		return d.snapshot(m.st, true)
	}
	return m.st.viewSnapshot(), nil
}

// SnapshotInfo reports the applied index and the task count of a snapshot
// that Snapshot or FullSnapshot took; ok is false for a marker, which
// holds no state.
func SnapshotInfo(s raft.FSMSnapshot) (applied, tasks uint64, ok bool) {
	snap, isFull := s.(*snapshot)
	if !isFull {
		return 0, 0, false
	}
	tasks, _, _ = snap.counts()
	return snap.applied, tasks, true
}

// PeekSnapshot reads the applied index and task count from the header of
// the snapshot stream br begins with, without consuming it: restore names
// a Raft snapshot by the index before it writes the stream.
func PeekSnapshot(br *bufio.Reader) (applied, tasks uint64, err error) {
	head, err := br.Peek(len(snapshotMagic) + binary.MaxVarintLen64)
	if len(head) < len(snapshotMagic) {
		return 0, 0, fmt.Errorf("%w: %d bytes: %v", ErrCorruptSnapshot, len(head), err)
	}
	if string(head[:len(snapshotMagic)]) != snapshotMagic {
		return 0, 0, fmt.Errorf("%w: not a snapshot stream", ErrCorruptSnapshot)
	}
	n, k := binary.Uvarint(head[len(snapshotMagic):])
	if k <= 0 || n > 1<<20 {
		return 0, 0, fmt.Errorf("%w: the header's length", ErrCorruptSnapshot)
	}
	all, err := br.Peek(len(snapshotMagic) + k + int(n))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: the header: %v", ErrCorruptSnapshot, err)
	}
	var rec fsmpb.SnapshotRecord
	if err := proto.Unmarshal(all[len(snapshotMagic)+k:], &rec); err != nil || rec.Header == nil {
		return 0, 0, fmt.Errorf("%w: the header: %v", ErrCorruptSnapshot, err)
	}
	return rec.Header.AppliedIndex, rec.Header.Tasks, nil
}

// BackupSnapshot is FullSnapshot for a backup: the same state in the same
// stream format, but a store on disk streams its tasks in its task table's
// order (one sequential read of the engine) instead of queue by queue in
// claim order (a lookup per task, some 50 times slower at a million tasks;
// BenchmarkBackupCopy). Restore takes tasks in any order.
// Nor does it flush the engine first, as a snapshot raft truncates its
// log after must: the flush's files set off a compaction that cost the
// writers a fifth of the nodes' CPU while a backup ran.
func (m *Machine) BackupSnapshot() (raft.FSMSnapshot, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	d, ok := m.st.store.(*diskStore)
	if !ok {
		return m.st.viewSnapshot(), nil
	}
	snap, err := d.snapshot(m.st, false)
	if err != nil {
		return nil, err
	}
	view := snap.stream.view
	snap.stream.eachTask = func(fn func(*task) error) error {
		// Queue records of the stream's own (the store's are the apply
		// goroutine's), one per queue.
		queues := map[uint32]*queue{}
		// One task record for every call: the stream encodes each at
		// once (AscendTasks' record and value are valid only during
		// the call too).
		var t task
		var ferr error
		err := view.AscendTasks(func(id string, tk *ondisk.Task) bool {
			q := queues[tk.Queue]
			if q == nil {
				name, err := view.QueueName(tk)
				if err != nil {
					ferr = err
					return false
				}
				q = &queue{name: name, group: groupOf(name)}
				queues[tk.Queue] = q
			}
			fillTask(&t, id, tk, q)
			ferr = fn(&t)
			return ferr == nil
		})
		if ferr != nil {
			return ferr
		}
		return err
	}
	snap.stream.encodedTasks = func(fn func([]byte) error) error {
		queues := map[uint32]*queue{}
		queueOf := func(num uint32) (*queue, error) {
			if q := queues[num]; q != nil {
				return q, nil
			}
			name, err := view.QueueName(&ondisk.Task{Queue: num})
			if err != nil {
				return nil, err
			}
			q := &queue{name: name, group: groupOf(name)}
			queues[num] = q
			return q, nil
		}
		// The stored bytes go into the stream as they are, renumbered
		// (appendTaskRecord): no task is decoded, filled and encoded
		// again, which was half of a copy's CPU.
		var buf []byte
		var t task
		var ferr error
		err := view.AscendTaskRecords(func(id, rec []byte) bool {
			var q *queue
			if q, ferr = queueOf(recordQueue(rec)); ferr != nil {
				return false
			}
			var ok bool
			if buf, ok = appendTaskRecord(buf[:0], id, q.name, rec); !ok {
				// Headers, or a record of a later layout: the long way.
				var tk *ondisk.Task
				if tk, ferr = ondisk.DecodeTask(rec); ferr != nil {
					return false
				}
				if q, ferr = queueOf(tk.Queue); ferr != nil {
					return false
				}
				fillTask(&t, string(id), tk, q)
				buf = appendTask(buf[:0], &t)
			}
			ferr = fn(buf)
			return ferr == nil
		})
		if ferr != nil {
			return ferr
		}
		return err
	}
	return snap, nil
}
