package fsm

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// StaleSequenceMessage is the message of a STALE_SEQUENCE failure: a request whose sequence
// number is below the last one applied for its client.
const StaleSequenceMessage = "stale request sequence"

// notifier collects, without duplicates, the queues whose available set may
// have grown during a command, for Options.OnAvailable.
type notifier struct {
	queues []string
	seen   map[string]struct{}
	slots  bool // a slot was frozen, unfrozen or activated (OnSlotChange)
}

func (n *notifier) add(queue string) {
	if n.seen == nil {
		// Most commands touch a queue or two: a scan beats a map.
		if slices.Contains(n.queues, queue) {
			return
		}
		if len(n.queues) < 8 {
			n.queues = append(n.queues, queue)
			return
		}
		n.seen = make(map[string]struct{}, 2*len(n.queues))
		for _, q := range n.queues {
			n.seen[q] = struct{}{}
		}
	}
	if _, ok := n.seen[queue]; ok {
		return
	}
	n.seen[queue] = struct{}{}
	n.queues = append(n.queues, queue)
}

// applier applies commands to a state. It holds no lock itself: the
// Machine's write lock is held while it runs.
type applier struct {
	st     *state
	opts   *Options
	n      *notifier
	budget *fsmpb.MemoryBudget // the entry's (an OP_BATCH's commands take it)
}

// failuref is a failure of the kind the caller decided, with a message for
// people (nothing above the state machine reads it to decide).
func failuref(kind fsmpb.Failure_Kind, format string, args ...any) *fsmpb.Result {
	return &fsmpb.Result{Failure: &fsmpb.Failure{Kind: kind, Message: fmt.Sprintf(format, args...)}}
}

// command applies one command, with its clock update and exactly-once
// handling.
func (a *applier) command(cmd *fsmpb.Command) *fsmpb.Result {
	if cmd == nil {
		return failuref(fsmpb.Failure_INVALID, "empty command")
	}
	a.st.advance(cmd.Now, a.n.add)
	a.expireSessions()
	a.st.expireReservations()
	var untouched *session
	if cmd.ClientId != "" {
		if s := a.st.store.session(cmd.ClientId); s != nil {
			if cmd.Seq > s.seq && touchesNoSession(cmd.Op) {
				// A new request, whose answer (below) replaces the session
				// with one seen now: touched only if it is not remembered,
				// so that the session is written once per command (on
				// disk each write is an encoding of the answer and a
				// record in the batch). The state after the command is the
				// same either way: the command reads and writes no session
				// in between.
				untouched = s
			} else {
				a.touch(s)
			}
			switch {
			case cmd.Seq == s.seq:
				var r *fsmpb.Result
				if s.encoded {
					r = s.answer() // decoded afresh: the caller's own
				} else {
					r = proto.Clone(s.result).(*fsmpb.Result)
				}
				r.Replayed = true
				return r
			case cmd.Seq < s.seq:
				return &fsmpb.Result{Failure: &fsmpb.Failure{Message: StaleSequenceMessage, Kind: fsmpb.Failure_STALE_SEQUENCE}}
			}
		}
	}
	group := commandGroup(cmd)
	if ss := a.st.unserved(group); ss != nil {
		// Not remembered: the retry belongs to the shard that serves the
		// slot now, which applies it.
		if untouched != nil {
			a.touch(untouched)
		}
		return movedFailure(ss, group)
	}
	res := a.dispatch(cmd)
	switch {
	case cmd.ClientId != "" && !emptyClaim(res) && !memoryFull(res):
		if a.st.format < FormatSlotMoves {
			group = "" // older binaries' sessions have none: same state
		}
		a.remember(cmd.ClientId, cmd.Seq, res, group)
	case untouched != nil:
		a.touch(untouched)
	}
	return res
}

// touchesNoSession reports the ops whose application reads and writes no
// exactly-once session, so that touching the client's session after them
// leaves the state a touch before them would. A batch is not one: its
// commands remember their own answers and evict the least recently seen
// sessions, which an untouched session could be.
func touchesNoSession(op fsmpb.Op) bool {
	return op == fsmpb.Op_OP_MODIFY || op == fsmpb.Op_OP_MODIFY_CLAIM || op == fsmpb.Op_OP_CLAIM
}

// emptyClaim reports a claim that claimed nothing. It changed no state, so
// it is not remembered: a retry with the same sequence number claims again
// (what a waiting claim does) instead of replaying the empty answer.
func emptyClaim(res *fsmpb.Result) bool {
	return res.Claim != nil && len(res.Claim.Tasks) == 0
}

// memoryFull reports a Modify refused for the memory budget. It changed
// nothing and is not remembered either: a retry with the same sequence
// number applies once claims or deletes have made room.
func memoryFull(res *fsmpb.Result) bool {
	return res.Failure.GetKind() == fsmpb.Failure_MEMORY_FULL
}

func (a *applier) dispatch(cmd *fsmpb.Command) *fsmpb.Result {
	switch cmd.Op {
	case fsmpb.Op_OP_MODIFY, fsmpb.Op_OP_MODIFY_CLAIM:
		// The ops differ only for older binaries (which refuse the second):
		// here the claim part applies whenever it is present.
		if cmd.Modify == nil {
			return failuref(fsmpb.Failure_INVALID, "%v without a modify body", cmd.Op)
		}
		return a.modify(cmd.Modify)
	case fsmpb.Op_OP_CLAIM:
		if cmd.Claim == nil {
			return failuref(fsmpb.Failure_INVALID, "OP_CLAIM without a claim body")
		}
		return a.claim(cmd.Claim)
	case fsmpb.Op_OP_PURGE:
		if cmd.Purge == nil {
			return failuref(fsmpb.Failure_INVALID, "OP_PURGE without a purge body")
		}
		return a.purge(cmd.Purge)
	case fsmpb.Op_OP_TICK:
		return &fsmpb.Result{}
	case fsmpb.Op_OP_SET_FORMAT:
		return a.setFormat(cmd.Format)
	case fsmpb.Op_OP_PAUSE:
		if cmd.Pause == nil || cmd.Pause.Queue == "" {
			return failuref(fsmpb.Failure_INVALID, "OP_PAUSE without a queue")
		}
		return a.pause(cmd.Pause)
	case fsmpb.Op_OP_SCHEDULE:
		if cmd.Schedule == nil || cmd.Schedule.Queue == "" || cmd.Schedule.Name == "" {
			return failuref(fsmpb.Failure_INVALID, "OP_SCHEDULE without a queue and name")
		}
		return a.schedule(cmd.Schedule)
	case fsmpb.Op_OP_FIRE:
		if cmd.Fire == nil {
			return failuref(fsmpb.Failure_INVALID, "OP_FIRE without a body")
		}
		return a.fire(cmd.Fire)
	case fsmpb.Op_OP_LIMIT:
		if cmd.Limit == nil || cmd.Limit.Queue == "" {
			return failuref(fsmpb.Failure_INVALID, "OP_LIMIT without a queue")
		}
		return a.limit(cmd.Limit)
	case fsmpb.Op_OP_POLICY:
		if cmd.Policy == nil || cmd.Policy.Queue == "" {
			return failuref(fsmpb.Failure_INVALID, "OP_POLICY without a queue")
		}
		return a.policy(cmd.Policy)
	case fsmpb.Op_OP_EXPIRE:
		if cmd.Expire == nil || cmd.Expire.Queue == "" {
			return failuref(fsmpb.Failure_INVALID, "OP_EXPIRE without a queue")
		}
		return a.expire(cmd.Expire)
	case fsmpb.Op_OP_SLOT:
		if cmd.Slot == nil {
			return failuref(fsmpb.Failure_INVALID, "OP_SLOT without a body")
		}
		return a.slotCommand(cmd.Slot)
	case fsmpb.Op_OP_BATCH:
		res := &fsmpb.Result{Batch: make([]*fsmpb.Result, len(cmd.Batch))}
		for i, sub := range cmd.Batch {
			res.Batch[i] = a.command(sub)
		}
		return res
	}
	// Validate refuses unknown ops at the edge, so one in the log was written
	// by a newer version. Answering it with a failure would let this replica
	// diverge from those that understand it: stop instead, like an
	// undecodable entry.
	panic(fmt.Sprintf("fsm: unknown op %d in the log: this binary is older than the cluster", int32(cmd.Op)))
}

// expireSessions drops sessions not seen for longer than SessionTTL of log
// time.
func (a *applier) expireSessions() {
	st := a.st
	if since, known := st.store.seenSince(); known && addSat(since, a.opts.SessionTTL) >= st.clock {
		return // no session is old enough
	}
	for {
		lastSeen, ok := st.store.oldestSeen()
		if !ok || addSat(lastSeen, a.opts.SessionTTL) >= st.clock {
			return
		}
		st.dropOldestSession()
	}
}

// touch marks s seen at the clock.
func (a *applier) touch(s *session) {
	if s.lastSeen == a.st.clock {
		return
	}
	a.st.putSession(&session{clientID: s.clientID, seq: s.seq, group: s.group, lastSeen: a.st.clock, result: s.result, size: s.size,
		raw: s.raw, encoded: s.encoded})
}

// remember stores the result of clientID's request seq, evicting the least
// recently seen sessions beyond MaxSessions or MaxSessionBytes (never the
// one just stored). group is the request's consistency group, if any.
func (a *applier) remember(clientID string, seq uint64, res *fsmpb.Result, group string) {
	if a.st.format < FormatFailureKinds {
		res = withoutKinds(res)
	}
	a.keep(&session{clientID: clientID, seq: seq, group: group, lastSeen: a.st.clock, result: res, size: sessionSize(clientID, res)})
}

// keep stores s, evicting as remember does.
func (a *applier) keep(s *session) {
	st := a.st
	st.putSession(s)
	for n := st.store.sessionCount(); n > a.opts.MaxSessions || st.store.sessionBytes() > a.opts.MaxSessionBytes && n > 1; n = st.store.sessionCount() {
		st.dropOldestSession()
	}
}

// withoutKinds is res as a binary without failure kinds stores it (below
// FormatFailureKinds): the stored answer is state (snapshots, the digest,
// a session's size), so it stays byte for byte what such a replica stores.
// The caller's answer keeps its kinds; res is copied only when it has any.
func withoutKinds(res *fsmpb.Result) *fsmpb.Result {
	if !hasKind(res) {
		return res
	}
	res = proto.Clone(res).(*fsmpb.Result)
	var clear func(*fsmpb.Result)
	clear = func(r *fsmpb.Result) {
		if r.Failure != nil {
			r.Failure.Kind = fsmpb.Failure_KIND_UNSPECIFIED
		}
		for _, b := range r.Batch {
			clear(b)
		}
	}
	clear(res)
	return res
}

func hasKind(r *fsmpb.Result) bool {
	if r.GetFailure().GetKind() != fsmpb.Failure_KIND_UNSPECIFIED {
		return true
	}
	for _, b := range r.GetBatch() {
		if hasKind(b) {
			return true
		}
	}
	return false
}
