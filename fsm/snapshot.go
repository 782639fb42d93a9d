package fsm

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strings"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/fsm/ondisk"
)

// Snapshot stream format (see fsm.proto): the magic, then uvarint
// length-prefixed SnapshotRecords: one header, the tasks, the sessions, and
// a trailer with the CRC-32C (Castagnoli) of every byte before the
// trailer's length prefix. Nothing may follow the trailer.
const (
	snapshotMagic = "TSKSNAP1"
	// snapshotFormat is the stream format of a state of format 0;
	// snapshotFormatStated, of a higher one (the header's state_format says
	// which). A binary older than state formats reads only the first, so it
	// refuses a state whose rules it does not know instead of loading it.
	snapshotFormat       = 1
	snapshotFormatStated = 2
	// maxRecordBytes bounds one record. The largest legitimate record is a
	// session holding a result of a thousand 1 MiB values.
	maxRecordBytes = 4 << 30
	// eagerRecordBytes: records up to this length get their buffer at
	// once; longer ones grow it as bytes actually arrive, so that a corrupt
	// length cannot make Restore allocate more than the stream holds.
	eagerRecordBytes = 1 << 20
)

// ErrCorruptSnapshot is returned (wrapped) by Restore for a stream that is
// not a complete, intact snapshot.
var ErrCorruptSnapshot = errors.New("corrupt snapshot")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// snapshot is a consistent picture of the state: tasks and sessions are
// immutable, so copies of their pointers suffice.
type snapshot struct {
	format   uint32
	clock    int64
	applied  uint64
	tasks    []*task
	sessions []*session
	paused   []string             // sorted
	limits   []*fsmpb.QueueLimit  // sorted by queue
	reserved []*reservation       // in reservedOrder
	sched    []*fsmpb.Schedule    // by queue, then name
	slots    []*fsmpb.SlotState   // by slot
	policies []*fsmpb.QueuePolicy // sorted by queue
	table    uint32               // the slot table's size (with slots only)
	// taskBytes: state.taskBytes, in the on-disk store's small record
	// only (encodeSmall); 0 in a stream of the tasks.
	taskBytes uint64
	// stream, when set, has the tasks, sessions and reservations instead
	// of the slices: a store that reads them from a consistent view as
	// Persist writes them (diskStore), so a snapshot copies nothing.
	stream *snapshotStream
}

// snapshotStream is what a streaming store gives a snapshot: the counts
// and the records in the stream's order, read from a view that Release
// ends, and whatever Persist must wait for before the snapshot counts (an
// engine flush).
type snapshotStream struct {
	tasks, sessions, reserved uint64
	eachTask                  func(func(*task) error) error
	// encodedTasks, when set, is eachTask with each task already in the
	// stream's encoding (appendTask's bytes, valid during the call): what
	// Persist writes.
	encodedTasks func(func(encoded []byte) error) error
	eachSession  func(func(*session) error) error
	eachReserved func(func(*reservation) error) error
	done         func() error
	release      func()
	view         *ondisk.Txn // what the records are read from
}

// Snapshot captures the state cheaply; Persist streams it while Apply goes on.
func (m *Machine) Snapshot() (raft.FSMSnapshot, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if d, ok := m.st.store.(*diskStore); ok {
		if m.opts.MarkerSnapshots {
			flushed, err := d.st.AsyncFlush()
			if err != nil {
				return nil, fmt.Errorf("fsm: snapshot: flush the engine: %w", err)
			}
			return &markerSnapshot{applied: m.st.applied, flushed: flushed}, nil
		}
		return d.snapshot(m.st, true)
	}
	return m.st.viewSnapshot(), nil
}

// viewSnapshot is snapshot without the walk of every task under the
// caller's lock: a store in memory gives a copy-on-write view of its trees
// (memStore.view), which the snapshot's stream reads afterwards while
// entries go on applying. The lock is held a step per queue, not per task.
func (s *state) viewSnapshot() *snapshot {
	ms, ok := s.store.(*memStore)
	if !ok {
		return s.snapshot()
	}
	snap := s.smallSnapshot()
	snap.stream = ms.view().stream()
	return snap
}

// materialize turns a streamed snapshot of memory (viewSnapshot) into
// one with slices, as snapshot makes, off the caller's lock.
func (s *snapshot) materialize() {
	if s.stream == nil || s.stream.view != nil {
		return
	}
	tasks, sessions, reserved := s.counts()
	s.tasks = make([]*task, 0, tasks)
	s.sessions = make([]*session, 0, sessions)
	s.reserved = make([]*reservation, 0, reserved)
	_ = s.stream.eachTask(func(t *task) error { s.tasks = append(s.tasks, t); return nil })
	_ = s.stream.eachSession(func(ss *session) error { s.sessions = append(s.sessions, ss); return nil })
	_ = s.stream.eachReserved(func(r *reservation) error { s.reserved = append(s.reserved, r); return nil })
	s.stream = nil
}

func (s *state) snapshot() *snapshot {
	snap := s.smallSnapshot()
	snap.tasks = make([]*task, 0, s.store.count())
	snap.sessions = make([]*session, 0, s.store.sessionCount())
	// Queues by name, each in claim order: the stream is the same for the
	// same state, and Restore inserts each queue's tasks in index order,
	// which is several times faster than random order.
	s.store.ascendQueues("", func(q *queue) bool {
		s.store.ascendQueue(q, nil, func(t *task) bool {
			snap.tasks = append(snap.tasks, t)
			return true
		})
		return true
	})
	s.store.ascendSessions(func(ss *session) bool {
		snap.sessions = append(snap.sessions, ss)
		return true
	})
	s.store.ascendReservations(func(r *reservation) bool {
		snap.reserved = append(snap.reserved, r)
		return true
	})
	return snap
}

// smallSnapshot is a snapshot of the state without what its store holds:
// the clock, format, pauses, limits, schedules and slot states.
func (s *state) smallSnapshot() *snapshot {
	snap := &snapshot{format: s.format, clock: s.clock, applied: s.applied}
	for name := range s.paused {
		snap.paused = append(snap.paused, name)
	}
	slices.Sort(snap.paused)
	for name, l := range s.limits {
		snap.limits = append(snap.limits, &fsmpb.QueueLimit{Queue: name, MaxClaimed: l})
	}
	slices.SortFunc(snap.limits, func(a, b *fsmpb.QueueLimit) int { return strings.Compare(a.Queue, b.Queue) })
	for _, sc := range s.schedules {
		snap.sched = append(snap.sched, sc)
	}
	sortSchedules(snap.sched)
	for _, p := range s.policies {
		snap.policies = append(snap.policies, p)
	}
	slices.SortFunc(snap.policies, func(a, b *fsmpb.QueuePolicy) int { return strings.Compare(a.Queue, b.Queue) })
	if len(s.slotStates) > 0 {
		for _, ss := range s.slotStates {
			snap.slots = append(snap.slots, ss)
		}
		slices.SortFunc(snap.slots, func(a, b *fsmpb.SlotState) int { return int(a.Slot) - int(b.Slot) })
		snap.table = s.slotTable
	}
	return snap
}

// Persist writes the snapshot to sink, or cancels the sink on error.
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	err := s.writeTo(sink)
	if err == nil && s.stream != nil && s.stream.done != nil {
		err = s.stream.done()
	}
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("fsm: persist snapshot: %w", err)
	}
	return sink.Close()
}

// Release implements raft.FSMSnapshot: a streaming store's view ends.
func (s *snapshot) Release() {
	if s.stream != nil && s.stream.release != nil {
		s.stream.release()
	}
}

// counts are the numbers of tasks, sessions and reservations the stream
// holds.
func (s *snapshot) counts() (tasks, sessions, reserved uint64) {
	if s.stream != nil {
		return s.stream.tasks, s.stream.sessions, s.stream.reserved
	}
	return uint64(len(s.tasks)), uint64(len(s.sessions)), uint64(len(s.reserved))
}

func (s *snapshot) eachTask(fn func(*task) error) error {
	if s.stream != nil {
		return s.stream.eachTask(fn)
	}
	for _, t := range s.tasks {
		if err := fn(t); err != nil {
			return err
		}
	}
	return nil
}

func (s *snapshot) eachSession(fn func(*session) error) error {
	if s.stream != nil {
		return s.stream.eachSession(fn)
	}
	for _, ss := range s.sessions {
		if err := fn(ss); err != nil {
			return err
		}
	}
	return nil
}

func (s *snapshot) eachReserved(fn func(*reservation) error) error {
	if s.stream != nil {
		return s.stream.eachReserved(fn)
	}
	for _, r := range s.reserved {
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

// snapshotWriter frames records and keeps the running checksum.
type snapshotWriter struct {
	w    *bufio.Writer
	crc  uint32
	buf  []byte
	tbuf []byte
	// lenBuf is scratch space for length prefixes (a local array would
	// escape through crc32.Update).
	lenBuf [binary.MaxVarintLen64]byte
}

func (sw *snapshotWriter) write(p []byte) error {
	sw.crc = crc32.Update(sw.crc, castagnoli, p)
	_, err := sw.w.Write(p)
	return err
}

func (sw *snapshotWriter) record(rec *fsmpb.SnapshotRecord) error {
	var err error
	sw.buf, err = proto.MarshalOptions{Deterministic: true}.MarshalAppend(sw.buf[:0], rec)
	if err != nil {
		return err
	}
	return sw.frame()
}

// task writes a task record, encoded by hand (the same bytes as
// proto.Marshal of SnapshotRecord{Task: ...}, several times faster).
func (sw *snapshotWriter) task(t *task) error {
	sw.tbuf = appendTask(sw.tbuf[:0], t)
	sw.buf = protowire.AppendTag(sw.buf[:0], recordTaskField, protowire.BytesType)
	sw.buf = protowire.AppendBytes(sw.buf, sw.tbuf)
	return sw.frame()
}

// encodedTask writes a task record of a Task message already encoded.
func (sw *snapshotWriter) encodedTask(t []byte) error {
	sw.buf = protowire.AppendTag(sw.buf[:0], recordTaskField, protowire.BytesType)
	sw.buf = protowire.AppendBytes(sw.buf, t)
	return sw.frame()
}

// frame writes sw.buf with its length prefix.
func (sw *snapshotWriter) frame() error {
	if err := sw.write(sw.lenBuf[:binary.PutUvarint(sw.lenBuf[:], uint64(len(sw.buf)))]); err != nil {
		return err
	}
	return sw.write(sw.buf)
}

func (s *snapshot) writeTo(w io.Writer) error { return s.writeToSize(w, 256<<10) }

// writeToSize is writeTo with a buffer of size bytes.
func (s *snapshot) writeToSize(w io.Writer, size int) error {
	sw := &snapshotWriter{w: bufio.NewWriterSize(w, size)}
	if err := sw.write([]byte(snapshotMagic)); err != nil {
		return err
	}
	ntasks, nsessions, nreserved := s.counts()
	h := &fsmpb.SnapshotHeader{Format: snapshotFormat, Clock: s.clock,
		Tasks: ntasks, Sessions: nsessions, AppliedIndex: s.applied}
	if s.format > 0 {
		h.Format, h.StateFormat = snapshotFormatStated, s.format
	}
	h.PausedQueues, h.QueueLimits, h.Reservations = uint64(len(s.paused)), uint64(len(s.limits)), nreserved
	h.Schedules = uint64(len(s.sched))
	h.SlotStates, h.Slots = uint64(len(s.slots)), s.table
	h.TaskBytes = s.taskBytes
	h.QueuePolicies = uint64(len(s.policies))
	err := sw.record(&fsmpb.SnapshotRecord{Header: h})
	if err != nil {
		return err
	}
	if s.stream != nil && s.stream.encodedTasks != nil {
		err = s.stream.encodedTasks(sw.encodedTask)
	} else {
		err = s.eachTask(sw.task)
	}
	if err != nil {
		return err
	}
	err = s.eachSession(func(ss *session) error {
		return sw.record(&fsmpb.SnapshotRecord{Session: &fsmpb.Session{ClientId: ss.clientID, Seq: ss.seq,
			LastSeen: ss.lastSeen, Result: ss.answer(), Group: ss.group}})
	})
	if err != nil {
		return err
	}
	for _, name := range s.paused {
		if err := sw.record(&fsmpb.SnapshotRecord{PausedQueue: name}); err != nil {
			return err
		}
	}
	for _, l := range s.limits {
		if err := sw.record(&fsmpb.SnapshotRecord{QueueLimit: l}); err != nil {
			return err
		}
	}
	err = s.eachReserved(func(r *reservation) error {
		return sw.record(&fsmpb.SnapshotRecord{Reservation: &fsmpb.KeyReservation{Task: r.last.toProto(false), Until: r.until}})
	})
	if err != nil {
		return err
	}
	for _, sc := range s.sched {
		if err := sw.record(&fsmpb.SnapshotRecord{Schedule: sc}); err != nil {
			return err
		}
	}
	for _, ss := range s.slots {
		if err := sw.record(&fsmpb.SnapshotRecord{SlotState: ss}); err != nil {
			return err
		}
	}
	for _, p := range s.policies {
		if err := sw.record(&fsmpb.SnapshotRecord{QueuePolicy: p}); err != nil {
			return err
		}
	}
	if err := sw.record(&fsmpb.SnapshotRecord{Trailer: &fsmpb.SnapshotTrailer{Crc32C: sw.crc}}); err != nil {
		return err
	}
	return sw.w.Flush()
}

// encodeSmall is the small state (smallSnapshot) in the snapshot format:
// what the on-disk store keeps beside its tables, rewritten when it
// changes.
func (s *state) encodeSmall() []byte {
	var buf bytes.Buffer
	// Without the clock and the applied index, which the engine keeps in
	// its own record: so the bytes change only when what they hold does,
	// and most commits store nothing more (diskStore.commit).
	snap := s.smallSnapshot()
	snap.clock, snap.applied = 0, 0
	snap.taskBytes = uint64(max(s.taskBytes, 0))
	if err := snap.writeToSize(&buf, 512); err != nil {
		panic(fmt.Sprintf("fsm: encode the small state: %v", err)) // a bytes.Buffer does not fail
	}
	return buf.Bytes()
}

// loadSmall sets the small state from encodeSmall's bytes.
func (s *state) loadSmall(b []byte) error {
	small, err := readSnapshot(bytes.NewReader(b))
	if err != nil {
		return err
	}
	s.format, s.paused, s.limits, s.schedules = small.format, small.paused, small.limits, small.schedules
	s.policies = small.policies
	s.slotStates, s.slotTable = small.slotStates, small.slotTable
	s.taskBytes = small.taskBytes
	return nil
}
