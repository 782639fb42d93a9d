package fsm

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/maphash"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// errHeld stops a restore whose snapshot the on-disk state already holds.
var errHeld = errors.New("fsm: the state holds the snapshot's index already")

// Restore replaces the state with a snapshot stream; a corrupt or truncated
// stream returns an error and leaves the machine unchanged. A machine on
// disk whose stored state is at or past the snapshot's applied index keeps
// it and reads no further: every replica applies the same committed log,
// so the state after a later index of it is the snapshot's state with the
// entries between applied, which raft replays and Apply skips.
func (m *Machine) Restore(rc io.ReadCloser) error {
	br := bufio.NewReaderSize(rc, 256<<10)
	if IsMarker(br) {
		err := m.restoreMarker(br)
		if cerr := rc.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("fsm: restore: %w", cerr)
		}
		return err
	}
	var st *state
	var err error
	d, onDisk := m.st.store.(*diskStore)
	var staged *diskStore
	if onDisk {
		held := m.AppliedIndex()
		st, err = readSnapshotInto(br, func(h *fsmpb.SnapshotHeader) (*state, error) {
			if held > 0 && h.AppliedIndex <= held {
				return nil, errHeld
			}
			// Into the shard's other range, while reads go on from this
			// one; switched to once the whole stream checked out.
			var err error
			staged, err = d.staging()
			if err != nil {
				return nil, err
			}
			return newStateWith(staged), nil
		})
	} else {
		st, err = readSnapshot(br)
	}
	if cerr := rc.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("fsm: restore: %w", cerr)
	}
	if errors.Is(err, errHeld) {
		// The engine holds this state or a later one of the same log:
		// raft restores its latest snapshot when a node starts, and the
		// entries after it that the engine holds too are skipped as they
		// replay (ApplyBatch).
		return nil
	}
	if err != nil {
		if staged != nil {
			staged.clear()
		}
		return err
	}
	m.mu.Lock()
	if onDisk {
		d.switchTo(staged)
	}
	m.st = st
	m.cp.reset()
	var names []string
	st.store.ascendQueues("", func(q *queue) bool {
		names = append(names, q.name)
		return true
	})
	m.mu.Unlock()
	// Waiters re-check: any queue may now hold available tasks.
	m.notify(&notifier{queues: names})
	return nil
}

// snapshotReader reads records and keeps the running checksum.
type snapshotReader struct {
	r   *bufio.Reader
	crc uint32
	buf []byte
	one [1]byte // scratch for ReadByte (a local would escape)
}

func (sr *snapshotReader) ReadByte() (byte, error) {
	b, err := sr.r.ReadByte()
	if err == nil {
		sr.one[0] = b
		sr.crc = crc32.Update(sr.crc, castagnoli, sr.one[:])
	}
	return b, err
}

func (sr *snapshotReader) readFull(n uint64) ([]byte, error) {
	if n <= eagerRecordBytes {
		if uint64(cap(sr.buf)) < n {
			sr.buf = make([]byte, n)
		}
		sr.buf = sr.buf[:n]
		if _, err := io.ReadFull(sr.r, sr.buf); err != nil {
			return nil, err
		}
	} else {
		var b bytes.Buffer
		got, err := io.CopyN(&b, sr.r, int64(n))
		if err != nil {
			return nil, fmt.Errorf("record of %d bytes: got %d: %w", n, got, io.ErrUnexpectedEOF)
		}
		sr.buf = b.Bytes()
	}
	sr.crc = crc32.Update(sr.crc, castagnoli, sr.buf)
	return sr.buf, nil
}

// next reads one record's bytes; sum is the checksum of every byte before
// it. The bytes are valid until the next call.
func (sr *snapshotReader) next() (data []byte, sum uint32, err error) {
	sum = sr.crc
	n, err := binary.ReadUvarint(sr)
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, 0, err
	}
	if n > maxRecordBytes {
		return nil, 0, fmt.Errorf("record length %d exceeds %d", n, uint64(maxRecordBytes))
	}
	data, err = sr.readFull(n)
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, 0, err
	}
	return data, sum, nil
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("fsm: restore: %w: %s", ErrCorruptSnapshot, fmt.Sprintf(format, args...))
}

// record is one parsed SnapshotRecord: exactly one field is set.
type record struct {
	header  *fsmpb.SnapshotHeader
	task    []byte // the encoded Task, decoded by restoreTask
	session *fsmpb.Session
	trailer *fsmpb.SnapshotTrailer
	paused  *string
	limit   *fsmpb.QueueLimit
	reserve *fsmpb.KeyReservation
	sched   *fsmpb.Schedule
	slot    *fsmpb.SlotState
	policy  *fsmpb.QueuePolicy
}

// parseRecord splits a SnapshotRecord into its one body.
func parseRecord(data []byte) (record, error) {
	var rec record
	set := 0
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return rec, protowire.ParseError(n)
		}
		data = data[n:]
		if typ != protowire.BytesType {
			return rec, fmt.Errorf("field %d has wire type %d", num, typ)
		}
		body, n := protowire.ConsumeBytes(data)
		if n < 0 {
			return rec, protowire.ParseError(n)
		}
		data = data[n:]
		set++
		var err error
		switch num {
		case 1:
			rec.header = &fsmpb.SnapshotHeader{}
			err = proto.Unmarshal(body, rec.header)
		case recordTaskField:
			rec.task = body
		case 3:
			rec.session = &fsmpb.Session{}
			err = proto.Unmarshal(body, rec.session)
		case 4:
			rec.trailer = &fsmpb.SnapshotTrailer{}
			err = proto.Unmarshal(body, rec.trailer)
		case 5:
			name := string(body)
			rec.paused = &name
		case 6:
			rec.limit = &fsmpb.QueueLimit{}
			err = proto.Unmarshal(body, rec.limit)
		case 7:
			rec.reserve = &fsmpb.KeyReservation{}
			err = proto.Unmarshal(body, rec.reserve)
		case 8:
			rec.sched = &fsmpb.Schedule{}
			err = proto.Unmarshal(body, rec.sched)
		case 9:
			rec.slot = &fsmpb.SlotState{}
			err = proto.Unmarshal(body, rec.slot)
		case 10:
			rec.policy = &fsmpb.QueuePolicy{}
			err = proto.Unmarshal(body, rec.policy)
		default:
			return rec, fmt.Errorf("unknown field %d", num)
		}
		if err != nil {
			return rec, err
		}
	}
	if set != 1 {
		return rec, fmt.Errorf("%d bodies, want 1", set)
	}
	return rec, nil
}

// readSnapshot parses and checks a whole stream into a new state in memory.
func readSnapshot(r io.Reader) (*state, error) {
	return readSnapshotInto(r, func(h *fsmpb.SnapshotHeader) (*state, error) {
		// Size the id map from the header, within reason: the header is
		// not yet verified.
		return newStateWith(newMemStore(int(min(h.Tasks, 1<<20)))), nil
	})
}

// installBatch is how many records an install writes per transaction of a
// store that has them.
const installBatch = 10000

// readSnapshotInto parses and checks a whole stream into the empty state
// newState makes from its header. A store with transactions (diskStore)
// gets the records in batches, the last committed with the stream's
// applied index once the trailer checked out, and flushed; on an error the
// caller discards what was written.
func readSnapshotInto(r io.Reader, newState func(*fsmpb.SnapshotHeader) (*state, error)) (_ *state, err error) {
	sr := &snapshotReader{r: bufio.NewReaderSize(r, 256<<10)}
	var magic [len(snapshotMagic)]byte
	if _, err := io.ReadFull(sr.r, magic[:]); err != nil {
		return nil, corrupt("magic: %v", err)
	}
	if string(magic[:]) != snapshotMagic {
		return nil, corrupt("bad magic %q", magic[:])
	}
	sr.crc = crc32.Update(sr.crc, castagnoli, magic[:])

	data, _, err := sr.next()
	if err != nil {
		return nil, corrupt("header: %v", err)
	}
	rec, err := parseRecord(data)
	if err != nil {
		return nil, corrupt("header: %v", err)
	}
	h := rec.header
	if h == nil {
		return nil, corrupt("first record is not a header")
	}
	switch {
	case h.Format != snapshotFormat && h.Format != snapshotFormatStated:
		return nil, corrupt("format %d, this version reads %d and %d", h.Format, snapshotFormat, snapshotFormatStated)
	case (h.Format == snapshotFormat) != (h.StateFormat == 0):
		return nil, corrupt("stream format %d with state format %d", h.Format, h.StateFormat)
	case h.StateFormat > MaxFormat:
		return nil, fmt.Errorf("fsm: restore: the snapshot's state format %d is newer than this version's %d: upgrade this node", h.StateFormat, MaxFormat)
	}
	st, err := newState(h)
	if err != nil {
		return nil, err
	}
	st.format = h.StateFormat
	st.clock = h.Clock
	st.applied = h.AppliedIndex
	var tasks, sessions, paused, limits, reserved, scheds, slotStates, policies uint64
	var last *queue // the queue of the last task: a snapshot has them by queue
	if h.SlotStates > 0 && h.Slots == 0 {
		return nil, corrupt("%d slot states without a slot table", h.SlotStates)
	}
	st.slotTable = h.Slots
	if h.TaskBytes > 0 && h.Tasks > 0 {
		// Only a small record carries a count; a stream's tasks are
		// counted as they are read.
		return nil, corrupt("a task count of %d bytes beside %d task records", h.TaskBytes, h.Tasks)
	}
	st.taskBytes = int64(h.TaskBytes)
	ts, _ := st.store.(txnStore)
	if ts != nil {
		ts.begin()
		defer func() {
			if err != nil {
				ts.abort()
			}
		}()
	}
	// A store on disk answers a duplicate check with a read of its engine
	// (a point read, or an iterator by id before FormatGroupIDs): at a
	// million tasks that was a third of an install's time. The install's
	// range starts empty, so the stream alone tells what it holds; seen
	// keeps a hash of each id and key, and the engine is asked only on a
	// hash that repeats.
	var seen *restoreSeen
	if ts != nil {
		seen = newRestoreSeen(h.Tasks)
	}
	records := 0
	for {
		data, sum, err := sr.next()
		if err != nil {
			return nil, corrupt("record %d: %v", tasks+sessions+paused+1, err)
		}
		rec, err := parseRecord(data)
		if err != nil {
			return nil, corrupt("record %d: %v", tasks+sessions+paused+1, err)
		}
		if records++; ts != nil && records%installBatch == 0 {
			ts.commit(0, st.encodeSmall())
			ts.begin()
		}
		if policies > 0 && rec.policy == nil && rec.trailer == nil {
			return nil, corrupt("record %d after queue policies", tasks+sessions+paused+1)
		}
		switch {
		case rec.policy != nil:
			p := rec.policy
			if policies == h.QueuePolicies {
				return nil, corrupt("more queue policies than the header's %d", h.QueuePolicies)
			}
			if p.Queue == "" || policyEmpty(p) || st.policies[p.Queue] != nil {
				return nil, corrupt("queue policy %v empty or repeated", p)
			}
			st.policies[p.Queue] = p
			policies++
		case rec.slot != nil:
			ss := rec.slot
			if slotStates == h.SlotStates {
				return nil, corrupt("more slot states than the header's %d", h.SlotStates)
			}
			if ss.Slot >= h.Slots || st.slotStates[ss.Slot] != nil || ss.Move == 0 || ss.Phase == fsmpb.SlotState_PHASE_UNSPECIFIED {
				return nil, corrupt("slot state %v out of range, repeated or incomplete", ss)
			}
			st.slotStates[ss.Slot] = ss
			slotStates++
		case rec.sched != nil:
			if slotStates > 0 {
				return nil, corrupt("schedule after slot states")
			}
			sc := rec.sched
			if scheds == h.Schedules {
				return nil, corrupt("more schedules than the header's %d", h.Schedules)
			}
			k := scheduleKey(sc.Queue, sc.Name)
			if sc.Queue == "" || sc.Name == "" || st.schedules[k] != nil {
				return nil, corrupt("schedule %q of %q empty or repeated", sc.Name, sc.Queue)
			}
			st.schedules[k] = sc
			scheds++
		case rec.reserve != nil:
			if scheds > 0 {
				return nil, corrupt("key reservation after schedules")
			}
			if reserved == h.Reservations {
				return nil, corrupt("more key reservations than the header's %d", h.Reservations)
			}
			if err := st.restoreReservation(rec.reserve); err != nil {
				return nil, corrupt("key reservation %d: %v", reserved+1, err)
			}
			reserved++
		case rec.limit != nil:
			if reserved > 0 || scheds > 0 {
				return nil, corrupt("queue limit after key reservations")
			}
			l := rec.limit
			if limits == h.QueueLimits {
				return nil, corrupt("more queue limits than the header's %d", h.QueueLimits)
			}
			if l.Queue == "" || l.MaxClaimed == 0 || st.limits[l.Queue] != 0 {
				return nil, corrupt("queue limit %v empty, zero or repeated", l)
			}
			st.limits[l.Queue] = l.MaxClaimed
			limits++
		case rec.paused != nil:
			if limits > 0 || reserved > 0 || scheds > 0 {
				return nil, corrupt("paused queue after queue limits or reservations")
			}
			if paused == h.PausedQueues {
				return nil, corrupt("more paused queues than the header's %d", h.PausedQueues)
			}
			if *rec.paused == "" || st.isPaused(*rec.paused) {
				return nil, corrupt("paused queue %q empty or repeated", *rec.paused)
			}
			st.paused[*rec.paused] = struct{}{}
			paused++
		case rec.task != nil:
			if sessions > 0 || paused > 0 {
				return nil, corrupt("task record after session or paused records")
			}
			if tasks == h.Tasks {
				return nil, corrupt("more task records than the header's %d", h.Tasks)
			}
			if limits > 0 || reserved > 0 || scheds > 0 {
				return nil, corrupt("task record after queue limits or reservations")
			}
			if last, err = st.restoreTask(rec.task, last, seen); err != nil {
				return nil, corrupt("task record %d: %v", tasks+1, err)
			}
			tasks++
		case rec.session != nil:
			if sessions == h.Sessions {
				return nil, corrupt("more session records than the header's %d", h.Sessions)
			}
			if paused > 0 || limits > 0 || reserved > 0 || scheds > 0 {
				return nil, corrupt("session record after paused queues or limits")
			}
			if err := st.restoreSession(rec.session); err != nil {
				return nil, corrupt("session record %d: %v", sessions+1, err)
			}
			sessions++
		case rec.trailer != nil:
			if slotStates != h.SlotStates || policies != h.QueuePolicies {
				return nil, corrupt("%d slot states and %d queue policies, header says %d and %d", slotStates, policies, h.SlotStates, h.QueuePolicies)
			}
			if reserved != h.Reservations || scheds != h.Schedules {
				return nil, corrupt("%d key reservations and %d schedules, header says %d and %d", reserved, scheds, h.Reservations, h.Schedules)
			}
			if tasks != h.Tasks || sessions != h.Sessions || paused != h.PausedQueues || limits != h.QueueLimits {
				return nil, corrupt("%d tasks, %d sessions, %d paused queues and %d limits, header says %d, %d, %d and %d",
					tasks, sessions, paused, limits, h.Tasks, h.Sessions, h.PausedQueues, h.QueueLimits)
			}
			if rec.trailer.Crc32C != sum {
				return nil, corrupt("checksum %08x, trailer says %08x", sum, rec.trailer.Crc32C)
			}
			if _, err := sr.r.ReadByte(); err != io.EOF {
				return nil, corrupt("bytes after the trailer")
			}
			if ts != nil {
				ts.commit(st.applied, st.encodeSmall())
				ts.flush()
			}
			return st, nil
		default:
			return nil, corrupt("record %d: a second header", tasks+sessions+1)
		}
	}
}

// restoreSeen is what an install into an empty store has read so far: a
// hash of each task's id (with its group from FormatGroupIDs on) and of
// each key (with its queue). A hash not seen before proves the id or key
// new without asking the store; one seen before (a duplicate, or rarely
// two values with one hash) is checked exactly, by the store.
type restoreSeen struct {
	seed maphash.Seed
	ids  map[uint64]struct{}
	keys map[uint64]struct{}
}

func newRestoreSeen(tasks uint64) *restoreSeen {
	// The header is not verified yet: size from it within reason.
	return &restoreSeen{seed: maphash.MakeSeed(), ids: make(map[uint64]struct{}, min(tasks, 1<<20)),
		keys: map[uint64]struct{}{}}
}

// restoreHash hashes a pair for restoreSeen; a test replaces it to make
// every pair collide.
var restoreHash = pairHash

func pairHash(seed maphash.Seed, a, b string) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	h.WriteString(a)
	h.WriteByte(0) // neither a group nor a queue holds a 0 byte
	h.WriteString(b)
	return h.Sum64()
}

// fresh reports whether the pair's hash is new to set, and adds it.
func (r *restoreSeen) fresh(set map[uint64]struct{}, a, b string) bool {
	h := restoreHash(r.seed, a, b)
	if _, ok := set[h]; ok {
		return false
	}
	set[h] = struct{}{}
	return true
}

// restoreTask adds the encoded task; last is the previous task's queue,
// returned for the next (a snapshot lists each queue's tasks together, so
// the queue's name is not looked up, nor made a string, once per task).
// With seen (an install into an empty store), the store is asked about an
// id or key only when its hash was seen before.
func (s *state) restoreTask(data []byte, last *queue, seen *restoreSeen) (*queue, error) {
	t, queue, err := decodeTask(data)
	if err != nil {
		return last, err
	}
	if t.id == "" || len(queue) == 0 {
		return last, errors.New("empty id or queue")
	}
	q := last
	if q == nil || q.name != string(queue) {
		q = s.queueFor(string(queue))
	}
	idGroup := q.group
	if s.format < FormatGroupIDs {
		idGroup = "" // an id is unique across groups
	}
	if (seen == nil || !seen.fresh(seen.ids, idGroup, t.id)) && s.idTaken(q.group, t.id) {
		return q, fmt.Errorf("duplicate id %q", t.id)
	}
	if t.key != "" && (seen == nil || !seen.fresh(seen.keys, q.name, t.key)) && s.store.keyOwner(q.name, t.key) != "" {
		return q, fmt.Errorf("duplicate key %q in queue %q", t.key, q.name)
	}
	t.q = q
	s.add(t)
	return q, nil
}

func (s *state) restoreReservation(p *fsmpb.KeyReservation) error {
	tp := p.GetTask()
	if tp.GetQueue() == "" || tp.Key == "" || tp.Id == "" || p.Until <= s.clock {
		return errors.New("empty queue, key or id, or expired")
	}
	if s.store.reservation(tp.Queue, tp.Key) != nil {
		return fmt.Errorf("key %q of queue %q reserved twice", tp.Key, tp.Queue)
	}
	// The deleted version's queue record is detached: only its name counts.
	t := &task{id: tp.Id, key: tp.Key, claimant: tp.Claimant, err: tp.Err, value: tp.Value,
		q: &queue{name: tp.Queue, group: groupOf(tp.Queue)}, version: tp.Version, at: tp.At, created: tp.Created,
		modified: tp.Modified, priority: tp.Priority, claims: tp.Claims, attempt: tp.Attempt, ext: newTaskExt(tp.DedupWindow, tp.Headers)}
	s.store.putReservation(&reservation{last: t, until: p.Until})
	return nil
}

func (s *state) restoreSession(p *fsmpb.Session) error {
	if p.ClientId == "" || p.Result == nil {
		return errors.New("empty client id or result")
	}
	if s.store.session(p.ClientId) != nil {
		return fmt.Errorf("duplicate client id %q", p.ClientId)
	}
	s.putSession(&session{clientID: p.ClientId, seq: p.Seq, group: p.Group, lastSeen: p.LastSeen, result: p.Result, size: sessionSize(p.ClientId, p.Result)})
	return nil
}
