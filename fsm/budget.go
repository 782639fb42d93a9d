package fsm

import (
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/internal/bytesize"
)

// The memory budget (FormatMemoryBudget). A node whose shards keep their
// tasks in memory runs out of it when a backlog grows, and every replica
// of a shard holds the same tasks, so they would run out together. The
// leader stamps the budget of the shard's tasks into each command it
// proposes (Command.budget: bytes and a per-task overhead), and the
// machine refuses a Modify that would take the tasks past it. The
// decision reads only the log (the stamp) and the state (taskBytes and
// the task count), so every replica takes the same one, whatever its
// own flags, memory or binary: a follower never refuses what its leader
// accepted, nor the reverse.
//
// What a task takes is counted, not measured: taskSize (its variable
// bytes) plus the stamped overhead for the indexes and records around
// them. The overhead travels in the stamp so that a binary with a better
// estimate changes how later entries apply, never how replicas of one
// entry do.

// MemoryFull starts the message of a MEMORY_FULL failure: a Modify refused because its
// tasks would take the shard past its memory budget.
const MemoryFull = "memory budget reached"

// taskSize is what a task is counted as beyond the budget's per-task
// overhead: its id, key, value, error and headers. Not its claimant, so a claim
// does not change the count (and the on-disk store does not rewrite its
// small record for claims); a claimant is at most MaxNameBytes.
func taskSize(t *task) int64 {
	n := len(t.id) + len(t.key) + len(t.value) + len(t.err)
	for k, v := range t.headers() {
		n += len(k) + len(v)
	}
	return int64(n)
}

// used is what the tasks take by the budget's count.
func (s *state) used(overhead uint64) uint64 {
	return uint64(max(s.taskBytes, 0)) + uint64(s.store.count())*overhead
}

// recountTaskBytes sets taskBytes from the tasks themselves: when the
// format that reads it is reached, since a store written by an older
// binary (which did not count) may hold a wrong count. O(tasks), once per
// shard.
func (s *state) recountTaskBytes() {
	var n int64
	s.store.ascendQueues("", func(q *queue) bool {
		s.store.ascendQueue(q, nil, func(t *task) bool {
			n += taskSize(t)
			return true
		})
		return true
	})
	s.taskBytes = n
}

// overBudget returns the refusal of a Modify that would grow the tasks
// by growth (count delta tasks, bytes delta) past the budget, or nil. A
// Modify that does not grow them always applies, so claims, commits,
// deletes and purges free room at any fill.
func (s *state) overBudget(b *fsmpb.MemoryBudget, tasks, bytes int64) *fsmpb.Result {
	if b == nil || b.Bytes == 0 || s.format < FormatMemoryBudget {
		return nil
	}
	growth := bytes + tasks*int64(b.TaskOverhead)
	if growth <= 0 {
		return nil
	}
	used := s.used(b.TaskOverhead)
	if used+uint64(growth) <= b.Bytes {
		return nil
	}
	return failuref(fsmpb.Failure_MEMORY_FULL, "%s: the shard's tasks take %s of the %s this shard may hold in memory, and this request needs %s more; "+
		"claim and commit or delete tasks, purge a queue, or run the nodes with --state disk (or a larger --memory-limit)",
		MemoryFull, bytesize.Format(used), bytesize.Format(b.Bytes), bytesize.Format(uint64(growth)))
}

// MemoryUse is what a shard's tasks take by the budget's count, with
// overhead bytes per task (what the leader stamps).
func (m *Machine) MemoryUse(overhead uint64) uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.used(overhead)
}
