package fsm

import (
	"fmt"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// State formats: the rules some commands apply by. The log raises a shard's
// format with OP_SET_FORMAT once every replica's binary applies it (the
// cluster decides when), so replicas of different versions never apply one
// entry by different rules. Formats are append-only, like op codes, and a
// format's rules are frozen once a binary with it is released (lands on
// main): a later change to how an entry applies needs the next format,
// because a released binary that claims a format applies it by the rules
// it was built with.
const (
	// FormatShardIDs is the first format: a task id is unique in its
	// shard, whatever the group (an insert of an id another group holds
	// fails with INSERT_DUPLICATE_ID).
	FormatShardIDs uint32 = 0
	// FormatGroupIDs: a task id is unique in its consistency group. Two
	// groups, even on one shard, may each hold a task with the same id;
	// every reference names its group (Modify.group), and a lookup by id
	// alone (Get) returns every match.
	FormatGroupIDs uint32 = 1
	// FormatQueueControls: an insert may be held by the Modify's claimant
	// until its time (Insert.held) and may keep its key reserved after its
	// deletion (Insert.dedup_window): both ignored below this format, so
	// that replicas of binaries that do not know the fields apply them
	// alike; and
	// the cluster accepts OP_PAUSE, OP_LIMIT, OP_SCHEDULE and OP_FIRE (the
	// API refuses them, held inserts and dedup windows below it, and
	// answers a schedule removal with nothing removed: a replica of an
	// older binary would stop at them).
	FormatQueueControls uint32 = 2
	// FormatSlotMoves: the cluster may move a hash slot between shards
	// (OP_SLOT, fsm/slots.go), and a session remembers its request's
	// consistency group (Session.group) so that a move carries the
	// sessions of the slot's groups. Below it OP_SLOT is refused and
	// sessions keep no group.
	FormatSlotMoves uint32 = 3
	// FormatMemoryBudget: a Modify that would take the shard's tasks past
	// the memory budget its command carries (Command.budget, stamped by
	// the leader) is refused (budget.go). Below it the stamp is ignored.
	// Raising the format recounts what the tasks take.
	FormatMemoryBudget uint32 = 4
	// FormatFailureKinds: a session's stored answer keeps its failure's
	// kind (Failure.kind). Below it the kind is cleared from the stored
	// copy, which stays what a binary without kinds stores; the answer
	// to the request itself carries its kind either way.
	FormatFailureKinds uint32 = 5
	// FormatHeaders: a task keeps the string pairs its insert gives it
	// (Insert.headers) and a change may replace or clear them
	// (Change.headers, Change.clear_headers). Below it both are ignored,
	// and the API refuses them.
	FormatHeaders uint32 = 6
	// FormatInsertClaimant: a task inserted available (at <= now) by a
	// Modify that names a claimant records it as the task's claimant
	// (who inserted it) until a claim or a change replaces it; a delayed
	// task does not (a claimant and a future at make a held task). A
	// claim counts an expired lease only for a task claimed before
	// (claims > 0), so neither an insert's claimant nor a held task's
	// counts as one. And the answer bounds (AnswerBytes: Modify's
	// max_answer_bytes, Claim's max_bytes) count a task's headers. Below
	// it an insert records only a held task's claimant and headers are
	// not counted.
	FormatInsertClaimant uint32 = 7
	// FormatPolicies: the cluster accepts OP_POLICY, a queue's policy
	// (policy.go), and a claim moves a task over its queue's delivery
	// limit to the dead-letter queue instead of claiming it. Below it the
	// API refuses policies and the machine refuses OP_POLICY (a replica
	// of an older binary would stop at it).
	FormatPolicies uint32 = 8
	// FormatRetention: a queue policy may retain its tasks for a while
	// (QueuePolicy.retain), and the cluster accepts OP_EXPIRE, the leader's
	// bounded steps that delete the tasks older than that. Below it the
	// API and the machine refuse a policy with a retain, and OP_EXPIRE
	// deletes nothing.
	FormatRetention uint32 = 9
	// FormatRate: a queue policy may have a rate (QueuePolicy.rate_interval
	// and burst), a token bucket in log time that bounds how fast claims
	// take the queue's tasks (rule 27); the bucket's state is part of the
	// policy. Below it the API and the machine refuse a policy with a rate.
	FormatRate uint32 = 10

	// MaxFormat is the highest format this binary applies.
	MaxFormat = FormatRate
)

// Format is the state format the log has raised the machine to.
func (m *Machine) Format() uint32 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.format
}

// SetFormatCommand is the command that raises a shard's state format to f.
func SetFormatCommand(f uint32) *fsmpb.Command {
	return &fsmpb.Command{Op: fsmpb.Op_OP_SET_FORMAT, Format: f}
}

// setFormat applies OP_SET_FORMAT. DecodeCommand has refused a format above
// MaxFormat; a lower or equal one changes nothing (formats never go down).
func (a *applier) setFormat(f uint32) *fsmpb.Result {
	if f > MaxFormat {
		panic(fmt.Sprintf("fsm: the log raises the state format to %d; this binary applies up to %d: upgrade it", f, MaxFormat))
	}
	if f >= FormatMemoryBudget && a.st.format < FormatMemoryBudget {
		a.st.recountTaskBytes()
	}
	if f > a.st.format {
		a.st.format = f
	}
	return &fsmpb.Result{}
}
