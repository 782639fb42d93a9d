package fsm

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// Slot moves (FormatSlotMoves). A consistency group lives in the hash slot
// SlotOf(group, slots), and the meta group's table says which shard serves
// each slot. Moving a slot from shard S to shard T is a sequence of OP_SLOT
// entries in the two shards' logs, driven by the meta leader (cluster's
// slot mover), each naming the move:
//
//	S: FREEZE     S refuses the slot's commands (Failure.moved), so its
//	              state of the slot stops changing; ExportSlot reads it.
//	T: IMPORT     begin, then as many as the records need (tasks, sessions,
//	              pauses, limits, reservations, schedules); T refuses the
//	              slot's commands meanwhile.
//	meta: flip    the routing table names T.
//	T: ACTIVATE   T serves the slot.
//	S: DROP       S deletes its copy a bounded number of tasks per entry;
//	              the slot stays refused on S (GONE).
//
// A move abandoned before the flip is undone by DROP on T and UNFREEZE on
// S. A shard serves every slot it has no state for: the table only changes
// through moves, and a slot leaves a shard only by FREEZE, so a request
// routed by an old table to a shard that no longer serves its slot is
// refused, never applied. A refusal is not remembered as the request's
// answer: its retry belongs to the shard that serves the slot.

// SlotMoved starts the Failure.message of a command refused because its
// group's slot is not served by this shard (Failure.moved says how).
const SlotMoved = "slot moved"

// SlotNeedsFormat starts the message of a SLOT_NEEDS_FORMAT failure: an OP_SLOT applied below
// FormatSlotMoves (a shard whose leader has not raised its format yet).
const SlotNeedsFormat = "OP_SLOT needs state format"

// SlotOf is the hash slot of a consistency group in a table of slots:
// FNV-1a (32 bit) mod slots. It is taskstorepb.SlotOf, which is part of the
// routing contract (a test pins that they agree); fsm keeps its own copy
// because it imports nothing above it.
func SlotOf(group string, slots uint32) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(group); i++ {
		h ^= uint32(group[i])
		h *= 16777619
	}
	return h % slots
}

// commandGroup is the consistency group a command acts on, or "" for the
// commands that have none (ticks, formats, slot steps, batches: a batch's
// commands are checked one by one).
func commandGroup(cmd *fsmpb.Command) string {
	switch cmd.Op {
	case fsmpb.Op_OP_MODIFY, fsmpb.Op_OP_MODIFY_CLAIM:
		m := cmd.Modify
		if m == nil {
			return ""
		}
		if m.Group != "" {
			return m.Group
		}
		// Entries written before Modify.group: the queues it names.
		for _, in := range m.Inserts {
			return groupOf(in.Queue)
		}
		for _, c := range m.Changes {
			if c.Queue != "" {
				return groupOf(c.Queue)
			}
		}
		if c := m.Claim; c != nil && len(c.Queues) > 0 {
			return groupOf(c.Queues[0])
		}
	case fsmpb.Op_OP_CLAIM:
		if c := cmd.Claim; c != nil && len(c.Queues) > 0 {
			return groupOf(c.Queues[0])
		}
	case fsmpb.Op_OP_PURGE:
		return groupOf(cmd.Purge.GetQueue())
	case fsmpb.Op_OP_PAUSE:
		return groupOf(cmd.Pause.GetQueue())
	case fsmpb.Op_OP_LIMIT:
		return groupOf(cmd.Limit.GetQueue())
	case fsmpb.Op_OP_SCHEDULE:
		return groupOf(cmd.Schedule.GetQueue())
	case fsmpb.Op_OP_FIRE:
		return groupOf(cmd.Fire.GetQueue())
	}
	return ""
}

// unserved returns the state of group's slot when this shard does not serve
// it, else nil.
func (s *state) unserved(group string) *fsmpb.SlotState {
	if len(s.slotStates) == 0 || group == "" {
		return nil
	}
	return s.slotStates[SlotOf(group, s.slotTable)]
}

// queuesInSlot lists, in order, the queues of a per-queue setting (pauses,
// limits, policies) whose group is in slot: what a slot export carries.
func queuesInSlot[V any](s *state, settings map[string]V, slot uint32) []string {
	var names []string
	for name := range settings {
		if s.inSlot(groupOf(name), slot) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// inSlot reports whether group is in slot of the state's table.
func (s *state) inSlot(group string, slot uint32) bool {
	return s.slotTable != 0 && SlotOf(group, s.slotTable) == slot
}

func movedFailure(ss *fsmpb.SlotState, group string) *fsmpb.Result {
	where := "ask the routing table where it is served"
	if ss.To != 0 {
		where = fmt.Sprintf("shard %d serves it", ss.To)
		if ss.Phase == fsmpb.SlotState_FROZEN {
			where = fmt.Sprintf("it is moving to shard %d", ss.To)
		}
	}
	msg := fmt.Sprintf("%s: group %q is in slot %d, which this shard does not serve (%s); retry", SlotMoved, group, ss.Slot, where)
	return &fsmpb.Result{Failure: &fsmpb.Failure{Message: msg, Moved: ss, Kind: fsmpb.Failure_MOVED}}
}

// slotQueues calls visit with each queue of the slot, in name order.
func (s *state) slotQueues(slot uint32, visit func(q *queue) bool) {
	s.store.ascendQueues("", func(q *queue) bool {
		if !s.inSlot(q.group, slot) {
			return true
		}
		return visit(q)
	})
}

// notifySlot tells waiting claims on the slot's queues to look again: on a
// freeze their retry is refused and goes where the slot moves; on an
// activation the slot's tasks became claimable here.
func (a *applier) notifySlot(slot uint32) {
	a.n.slots = true
	// Collected, then added: a closure over a handed to the store would
	// put every command's applier on the heap.
	var names []string
	a.st.slotQueues(slot, func(q *queue) bool {
		names = append(names, q.name)
		return true
	})
	for _, name := range names {
		a.n.add(name)
	}
}

func (a *applier) slotCommand(c *fsmpb.SlotCommand) *fsmpb.Result {
	st := a.st
	switch {
	case st.format < FormatSlotMoves:
		return failuref(fsmpb.Failure_SLOT_NEEDS_FORMAT, "%s %d; the shard is at %d", SlotNeedsFormat, FormatSlotMoves, st.format)
	case c.Slots == 0 || c.Slot >= c.Slots || c.Move == 0:
		return failuref(fsmpb.Failure_SLOT_REFUSED, "OP_SLOT: slot %d of %d, move %d: out of range", c.Slot, c.Slots, c.Move)
	case st.slotTable != 0 && st.slotTable != c.Slots:
		return failuref(fsmpb.Failure_SLOT_REFUSED, "OP_SLOT: the shard's slot table has %d slots, the command says %d", st.slotTable, c.Slots)
	}
	if st.slotTable == 0 {
		st.slotTable = c.Slots // a table size is set once, whatever follows
	}
	cur := st.slotStates[c.Slot]
	same := cur != nil && cur.Move == c.Move
	refuse := func(want string) *fsmpb.Result {
		state := "served"
		if cur != nil {
			state = fmt.Sprintf("%v for move %d", cur.Phase, cur.Move)
			if cur.Phase == fsmpb.SlotState_IMPORTING {
				state += fmt.Sprintf(" (%d chunks in)", cur.Chunks)
			}
		}
		return failuref(fsmpb.Failure_SLOT_REFUSED, "OP_SLOT %v of slot %d (move %d): the slot is %s, want %s", c.Action, c.Slot, c.Move, state, want)
	}
	set := func(phase fsmpb.SlotState_Phase, to uint32) {
		st.slotStates[c.Slot] = &fsmpb.SlotState{Slot: c.Slot, Phase: phase, Move: c.Move, To: to}
	}
	ok := &fsmpb.Result{Slot: &fsmpb.SlotResult{}}
	switch c.Action {
	case fsmpb.SlotCommand_FREEZE:
		switch {
		case cur == nil:
			set(fsmpb.SlotState_FROZEN, c.To)
			a.notifySlot(c.Slot)
		case same && cur.Phase == fsmpb.SlotState_FROZEN:
		default:
			return refuse("served")
		}
		return ok
	case fsmpb.SlotCommand_UNFREEZE:
		switch {
		case cur == nil:
		case same && cur.Phase == fsmpb.SlotState_FROZEN:
			delete(st.slotStates, c.Slot)
			a.notifySlot(c.Slot)
		default:
			return refuse("frozen by this move")
		}
		return ok
	case fsmpb.SlotCommand_IMPORT:
		begin := c.Chunk == 0
		if same && cur.Phase == fsmpb.SlotState_IMPORTING && c.Chunk < cur.Chunks {
			return ok // applied already: a repeated step
		}
		if begin {
			switch {
			case cur == nil && st.slotHolds(c.Slot):
				return failuref(fsmpb.Failure_SLOT_REFUSED, "OP_SLOT IMPORT begin of slot %d (move %d): the shard serves the slot and holds its tasks", c.Slot, c.Move)
			case cur == nil || cur.Phase == fsmpb.SlotState_GONE:
				set(fsmpb.SlotState_IMPORTING, 0)
			default:
				return refuse("served and empty, or gone")
			}
		} else if !same || cur.Phase != fsmpb.SlotState_IMPORTING || c.Chunk != cur.Chunks {
			return refuse(fmt.Sprintf("importing for this move, at chunk %d", c.Chunk))
		}
		if err := st.checkImport(c.Slot, c.Records); err != nil {
			if begin {
				st.slotStates[c.Slot] = cur // nothing changed
				if cur == nil {
					delete(st.slotStates, c.Slot)
				}
			}
			return failuref(fsmpb.Failure_SLOT_REFUSED, "OP_SLOT IMPORT of slot %d (move %d): %v", c.Slot, c.Move, err)
		}
		a.importRecords(c.Records)
		in := st.slotStates[c.Slot] // immutable: snapshots share them
		st.slotStates[c.Slot] = &fsmpb.SlotState{Slot: in.Slot, Phase: in.Phase, Move: in.Move, To: in.To, Chunks: c.Chunk + 1}
		return ok
	case fsmpb.SlotCommand_ACTIVATE:
		switch {
		case cur == nil:
		case same && cur.Phase == fsmpb.SlotState_IMPORTING:
			delete(st.slotStates, c.Slot)
			a.notifySlot(c.Slot)
		default:
			return refuse("importing for this move")
		}
		return ok
	case fsmpb.SlotCommand_DROP:
		switch {
		case cur != nil && cur.Phase == fsmpb.SlotState_GONE, cur == nil && !st.slotHolds(c.Slot):
			// Nothing to drop: gone already, or an abandoned move's
			// target that never took anything.
			ok.Slot.Done = true
			return ok
		case !same:
			return refuse("frozen or importing for this move")
		}
		n, done := st.dropSlot(c.Slot, int(c.Limit))
		ok.Slot.Dropped, ok.Slot.Done = uint64(n), done
		if done {
			to := uint32(0)
			if cur.Phase == fsmpb.SlotState_FROZEN {
				to = cur.To
			}
			set(fsmpb.SlotState_GONE, to)
		}
		return ok
	}
	return failuref(fsmpb.Failure_INVALID, "OP_SLOT: unknown action %d", int32(c.Action))
}

// slotHolds reports whether the state holds anything of the slot's groups.
func (s *state) slotHolds(slot uint32) bool {
	holds := false
	s.slotQueues(slot, func(q *queue) bool {
		holds = s.store.queueLen(q) > 0
		return !holds
	})
	return holds
}

// dropSlot deletes up to limit (<= 0: all) of the slot's tasks and reports
// how many and whether none is left; when none is left it deletes the
// slot's pauses, limits, key reservations and schedules too. Sessions stay
// until they expire: a retry that reaches this shard is answered with what
// it did here.
func (s *state) dropSlot(slot uint32, limit int) (int, bool) {
	var victims []*task
	s.slotQueues(slot, func(q *queue) bool {
		s.store.ascendQueue(q, nil, func(t *task) bool {
			if limit > 0 && len(victims) == limit {
				return false
			}
			victims = append(victims, t)
			return true
		})
		return limit <= 0 || len(victims) < limit
	})
	for _, t := range victims {
		s.remove(t)
		s.prune(t.q.name)
	}
	if limit > 0 && len(victims) == limit && s.slotHolds(slot) {
		return len(victims), false
	}
	for name := range s.paused {
		if s.inSlot(groupOf(name), slot) {
			delete(s.paused, name)
		}
	}
	for name := range s.limits {
		if s.inSlot(groupOf(name), slot) {
			delete(s.limits, name)
		}
	}
	for name := range s.policies {
		if s.inSlot(groupOf(name), slot) {
			delete(s.policies, name)
		}
	}
	var reserved []*reservation
	s.store.ascendReservations(func(r *reservation) bool {
		if s.inSlot(r.last.q.group, slot) {
			reserved = append(reserved, r)
		}
		return true
	})
	for _, r := range reserved {
		s.store.dropReservation(r)
	}
	for k, sc := range s.schedules {
		if s.inSlot(groupOf(sc.Queue), slot) {
			delete(s.schedules, k)
		}
	}
	return len(victims), true
}

// checkImport checks every record of an IMPORT before any applies, so that
// a refused step changes nothing.
func (s *state) checkImport(slot uint32, recs []*fsmpb.SnapshotRecord) error {
	type groupID struct{ group, id string }
	ids := make(map[groupID]bool)
	keys := make(map[queueKey]bool)
	in := func(what, queue string) error {
		if queue == "" || queue[0] == '/' {
			return fmt.Errorf("%s without a valid queue", what)
		}
		if !s.inSlot(groupOf(queue), slot) {
			return fmt.Errorf("%s of queue %q, which is not in slot %d", what, queue, slot)
		}
		return nil
	}
	for i, r := range recs {
		switch {
		case r.Task != nil:
			t := r.Task
			if err := in("task", t.Queue); err != nil {
				return fmt.Errorf("record %d: %w", i, err)
			}
			g := groupID{groupOf(t.Queue), t.Id}
			if t.Id == "" || ids[g] || s.find(g.group, g.id) != nil {
				return fmt.Errorf("record %d: task id %q of group %q empty or already held", i, t.Id, g.group)
			}
			ids[g] = true
			if t.Key != "" {
				k := queueKey{t.Queue, t.Key}
				if keys[k] || s.store.keyOwner(t.Queue, t.Key) != "" {
					return fmt.Errorf("record %d: key %q of queue %q already held", i, t.Key, t.Queue)
				}
				keys[k] = true
			}
		case r.Session != nil:
			ss := r.Session
			if ss.ClientId == "" || ss.Result == nil {
				return fmt.Errorf("record %d: session without a client id or result", i)
			}
			if ss.Group != "" && !s.inSlot(ss.Group, slot) {
				return fmt.Errorf("record %d: session of group %q, which is not in slot %d", i, ss.Group, slot)
			}
		case r.PausedQueue != "":
			if err := in("pause", r.PausedQueue); err != nil {
				return fmt.Errorf("record %d: %w", i, err)
			}
		case r.QueueLimit != nil:
			if err := in("limit", r.QueueLimit.Queue); err != nil {
				return fmt.Errorf("record %d: %w", i, err)
			}
		case r.QueuePolicy != nil:
			if err := in("policy", r.QueuePolicy.Queue); err != nil {
				return fmt.Errorf("record %d: %w", i, err)
			}
			if s.format < FormatPolicies || r.QueuePolicy.Retain != 0 && s.format < FormatRetention || r.QueuePolicy.RateInterval != 0 && s.format < FormatRate {
				return fmt.Errorf("record %d: a queue policy needs state format %d; the shard is at %d", i, FormatRate, s.format)
			}
			if f := checkPolicy(r.QueuePolicy); f != nil {
				return fmt.Errorf("record %d: %s", i, f.Failure.Message)
			}
		case r.Reservation != nil:
			t := r.Reservation.Task
			if err := in("key reservation", t.GetQueue()); err != nil {
				return fmt.Errorf("record %d: %w", i, err)
			}
			if t.Key == "" || t.Id == "" {
				return fmt.Errorf("record %d: key reservation without a key or id", i)
			}
		case r.Schedule != nil:
			if err := in("schedule", r.Schedule.Queue); err != nil {
				return fmt.Errorf("record %d: %w", i, err)
			}
			if r.Schedule.Name == "" {
				return fmt.Errorf("record %d: schedule without a name", i)
			}
		default:
			return fmt.Errorf("record %d: not a record a slot move carries", i)
		}
	}
	return nil
}

// importRecords applies records checkImport accepted.
func (a *applier) importRecords(recs []*fsmpb.SnapshotRecord) {
	st := a.st
	for _, r := range recs {
		switch {
		case r.Task != nil:
			t := taskFromProto(r.Task)
			t.q = st.queueFor(r.Task.Queue)
			st.add(t)
		case r.Session != nil:
			p := r.Session
			if old := st.store.session(p.ClientId); old != nil && old.seq >= p.Seq {
				continue // this shard saw a later request of the client
			}
			a.keep(&session{clientID: p.ClientId, seq: p.Seq, group: p.Group, lastSeen: p.LastSeen, result: p.Result,
				size: sessionSize(p.ClientId, p.Result)})
		case r.PausedQueue != "":
			st.paused[r.PausedQueue] = struct{}{}
		case r.QueueLimit != nil:
			if r.QueueLimit.MaxClaimed == 0 {
				delete(st.limits, r.QueueLimit.Queue)
			} else {
				st.limits[r.QueueLimit.Queue] = r.QueueLimit.MaxClaimed
			}
		case r.Reservation != nil:
			if r.Reservation.Until <= st.clock {
				continue
			}
			tp := r.Reservation.Task
			t := taskFromProto(tp)
			t.q = &queue{name: tp.Queue, group: groupOf(tp.Queue)}
			st.store.putReservation(&reservation{last: t, until: r.Reservation.Until})
		case r.Schedule != nil:
			st.schedules[scheduleKey(r.Schedule.Queue, r.Schedule.Name)] = r.Schedule
		case r.QueuePolicy != nil:
			if policyEmpty(r.QueuePolicy) {
				delete(st.policies, r.QueuePolicy.Queue)
			} else {
				st.policies[r.QueuePolicy.Queue] = r.QueuePolicy
			}
		}
	}
}

// taskFromProto builds a task from its record; the caller sets q.
func taskFromProto(tp *fsmpb.Task) *task {
	return &task{id: tp.Id, key: tp.Key, claimant: tp.Claimant, err: tp.Err, value: tp.Value,
		version: tp.Version, at: tp.At, created: tp.Created, modified: tp.Modified,
		priority: tp.Priority, claims: tp.Claims, attempt: tp.Attempt, ext: newTaskExt(tp.DedupWindow, tp.Headers)}
}

// SlotCursor is where an ExportSlot chunk ends and the next begins; the
// zero cursor is the start.
type SlotCursor struct {
	// Phase 0: tasks, after Queue/ID (in queue name order, each queue in
	// claim order); 1: sessions, after ID (a client id, in order); 2: the
	// rest (pauses, limits, reservations, schedules), in one chunk.
	Phase int
	Queue string
	ID    string
}

// SlotChunk is one chunk of a slot's state, as an IMPORT carries it.
type SlotChunk struct {
	Records []*fsmpb.SnapshotRecord
	Tasks   int        // task records among them
	Next    SlotCursor // where the next chunk starts
	Done    bool       // nothing follows
}

// ErrSlotNotFrozen is returned by ExportSlot for a slot the move has not
// frozen: its state could change between chunks.
var ErrSlotNotFrozen = errors.New("fsm: the slot is not frozen by this move")

// ExportSlot reads the slot's state from after, records of about maxBytes
// at most (at least one record), for move, which must have frozen the slot:
// the chunks of a frozen slot make one consistent copy.
func (m *Machine) ExportSlot(slot, slots uint32, move uint64, after SlotCursor, maxBytes int) (SlotChunk, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	st := m.st
	if ss := st.slotStates[slot]; ss == nil || ss.Move != move || ss.Phase != fsmpb.SlotState_FROZEN || st.slotTable != slots {
		return SlotChunk{}, ErrSlotNotFrozen
	}
	var out SlotChunk
	size := 0
	full := func(r *fsmpb.SnapshotRecord) bool {
		n := proto.Size(r)
		if len(out.Records) > 0 && size+n > maxBytes {
			return true
		}
		size += n
		out.Records = append(out.Records, r)
		return false
	}
	if after.Phase == 0 {
		var err error
		var lastQueue, lastID string
		stopped := false
		st.store.ascendQueues(after.Queue, func(q *queue) bool {
			if !st.inSlot(q.group, slot) {
				return true
			}
			var from *task
			if q.name == after.Queue && after.ID != "" {
				if from = st.find(q.group, after.ID); from == nil || from.q != q {
					err = fmt.Errorf("fsm: export of slot %d: task %q of %q is gone (the slot is frozen: this is a bug)", slot, after.ID, q.name)
					return false
				}
			}
			visit := func(t *task) bool {
				if from != nil && t.id == from.id {
					return true // the last task of the previous chunk (by id: a store may decode a task per read)
				}
				if full(&fsmpb.SnapshotRecord{Task: t.toProto(false)}) {
					stopped = true
					return false
				}
				out.Tasks++
				lastQueue, lastID = q.name, t.id
				return true
			}
			st.store.ascendQueue(q, from, visit)
			return !stopped
		})
		if err != nil {
			return SlotChunk{}, err
		}
		if stopped {
			out.Next = SlotCursor{Queue: lastQueue, ID: lastID}
			if out.Tasks == 0 { // cannot happen: full keeps one record
				out.Next = after
			}
			return out, nil
		}
		after = SlotCursor{Phase: 1}
	}
	if after.Phase == 1 {
		var slotSessions []*session
		st.store.ascendSessions(func(ss *session) bool {
			if ss.clientID > after.ID && (ss.group == "" || st.inSlot(ss.group, slot)) {
				slotSessions = append(slotSessions, ss)
			}
			return true
		})
		slices.SortFunc(slotSessions, func(a, b *session) int { return strings.Compare(a.clientID, b.clientID) })
		next := after
		for _, ss := range slotSessions {
			id := ss.clientID
			rec := &fsmpb.SnapshotRecord{Session: &fsmpb.Session{ClientId: ss.clientID, Seq: ss.seq, LastSeen: ss.lastSeen,
				Result: ss.answer(), Group: ss.group}}
			if full(rec) {
				out.Next = next
				return out, nil
			}
			next = SlotCursor{Phase: 1, ID: id}
		}
		after = SlotCursor{Phase: 2}
	}
	// The rest is small (a queue's settings, a deleted task's key): one
	// chunk, whatever its size.
	for _, name := range queuesInSlot(st, st.paused, slot) {
		out.Records = append(out.Records, &fsmpb.SnapshotRecord{PausedQueue: name})
	}
	for _, name := range queuesInSlot(st, st.limits, slot) {
		out.Records = append(out.Records, &fsmpb.SnapshotRecord{QueueLimit: &fsmpb.QueueLimit{Queue: name, MaxClaimed: st.limits[name]}})
	}
	st.store.ascendReservations(func(r *reservation) bool {
		if st.inSlot(r.last.q.group, slot) {
			out.Records = append(out.Records, &fsmpb.SnapshotRecord{Reservation: &fsmpb.KeyReservation{Task: r.last.toProto(false), Until: r.until}})
		}
		return true
	})
	var sched []*fsmpb.Schedule
	for _, sc := range st.schedules {
		if st.inSlot(groupOf(sc.Queue), slot) {
			sched = append(sched, sc)
		}
	}
	sortSchedules(sched)
	for _, sc := range sched {
		out.Records = append(out.Records, &fsmpb.SnapshotRecord{Schedule: sc})
	}
	for _, name := range queuesInSlot(st, st.policies, slot) {
		out.Records = append(out.Records, &fsmpb.SnapshotRecord{QueuePolicy: st.policies[name]})
	}
	out.Done = true
	return out, nil
}

// SlotStates returns the slots this shard does not serve, by slot.
func (m *Machine) SlotStates() []*fsmpb.SlotState {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]*fsmpb.SlotState, 0, len(m.st.slotStates))
	for _, ss := range m.st.slotStates {
		out = append(out, ss)
	}
	slices.SortFunc(out, func(a, b *fsmpb.SlotState) int { return int(a.Slot) - int(b.Slot) })
	return out
}

// SlotTasks counts the tasks per slot of a table of slots (only slots that
// hold some), for balancing and status. It walks the queues, not the tasks.
func (m *Machine) SlotTasks(slots uint32) map[uint32]int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make(map[uint32]int)
	m.st.store.ascendQueues("", func(q *queue) bool {
		if n := m.st.store.queueLen(q); n > 0 {
			out[SlotOf(q.group, slots)] += n
		}
		return true
	})
	return out
}

// readable reports whether reads of the slot are answered from this state:
// it is served, or frozen (its state stopped changing, and no other shard
// serves it yet). An importing or gone slot is not.
func (s *state) readable(slot uint32) bool {
	ss := s.slotStates[slot]
	return ss == nil || ss.Phase == fsmpb.SlotState_FROZEN
}

// ReadsGroup reports whether this machine answers reads of the group: its
// slot is not being imported here and has not moved away. A read of a
// group it does not answer for must go where the routing table says.
func (m *Machine) ReadsGroup(group string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.readsGroup(group)
}

func (s *state) readsGroup(group string) bool {
	return len(s.slotStates) == 0 || s.readable(SlotOf(group, s.slotTable))
}

// GetServed is Get for a read that asks every shard: it answers for the
// slots of table (the routing table: slot -> shard) that name shard and
// that this machine reads (ReadsGroup), returns only their tasks, and says
// which slots those are (bit s of byte s/8). Answers that together cover
// every slot exactly once make a complete read; a slot covered twice or not
// at all moved between the answers.
func (m *Machine) GetServed(ids []string, table []uint32, shard uint32) ([]*fsmpb.Task, []byte) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	served := make([]byte, (len(table)+7)/8)
	for s, sh := range table {
		if sh == shard && m.st.readable(uint32(s)) {
			served[s/8] |= 1 << (s % 8)
		}
	}
	var out []*fsmpb.Task
	for _, id := range ids {
		from := len(out)
		m.st.store.withID(id, func(t *task) bool {
			s := SlotOf(t.q.group, uint32(len(table)))
			if served[s/8]&(1<<(s%8)) != 0 {
				out = append(out, t.toProto(false))
			}
			return true
		})
		if len(out)-from > 1 {
			slices.SortFunc(out[from:], func(a, b *fsmpb.Task) int { return strings.Compare(a.Queue, b.Queue) })
		}
	}
	return out, served
}
