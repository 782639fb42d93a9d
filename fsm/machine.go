package fsm

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/api/limits"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// CONTRACT (used by cluster/): the exported names and signatures in this file
// are fixed. Implementations may add exported names but must not change these.

// Options configure a Machine.
type Options struct {
	// OnAvailable, when set, is called on the apply goroutine after a command
	// that may have made tasks available in the named queues (inserts, changes
	// that move or release a task, purge frees nothing). It must not block.
	OnAvailable func(queues []string)
	// OnSlotChange, when set, is called on the apply goroutine after a
	// command that froze, unfroze or activated a slot (OP_SLOT): waiting
	// claims of any queue of it, even one that holds nothing, must look
	// again (a frozen slot's claims go to its new shard). It must not
	// block.
	OnSlotChange func()
	// MaxSessions bounds the exactly-once memory (default 100000).
	MaxSessions int
	// MaxSessionBytes bounds it by the size of the answers it keeps
	// (default 128 MiB): an answer may carry values of up to the message
	// limit, so a count alone bounds nothing. Every replica must use the
	// same bounds: they decide which answers are replayed.
	MaxSessionBytes uint64
	// SessionTTL in nanoseconds of log time (default 10 minutes).
	SessionTTL int64
	// MarkerSnapshots makes Snapshot of a machine on disk a marker
	// (marker.go) rather than the whole state: the node's snapshot store
	// then makes the state's stream (FullSnapshot) when a follower needs
	// it. No effect in memory.
	MarkerSnapshots bool
	// MarkerSource, for a machine in memory, streams the whole state of
	// the engine a marker was taken on (a node that ran with its state on
	// disk and now runs in memory): Restore reads it instead of the
	// marker. Nil: a marker is refused.
	MarkerSource func() (io.ReadCloser, error)
}

// Limits bound what a command may carry (limits.Commands, where clients
// read them too). Validate enforces them at the API edge so that nothing
// over a limit reaches the log. A zero field means the field of
// DefaultLimits.
type Limits = limits.Commands

// DefaultLimits are the limits Validate uses for zero fields of its Limits.
var DefaultLimits = limits.DefaultCommands

// MaxDedupWindow bounds Insert.dedup_window: a key reserved for a week
// after its task is done covers any producer's retries.
const MaxDedupWindow = int64(7 * 24 * time.Hour)

// Bounds of a task's headers (Insert.headers, Change.headers): a few dozen
// short pairs carry trace context and tags; anything larger is a value.
const (
	MaxHeaders        = 32
	MaxHeaderBytes    = 4096 // keys and values together
	MaxHeaderKeyBytes = 256
)

// Default exactly-once bounds.
const (
	DefaultMaxSessions = 100000
	// DefaultMaxSessionBytes is per shard.
	DefaultMaxSessionBytes = 128 << 20
	DefaultSessionTTL      = int64(10 * time.Minute)
)

// QueueStats counts one queue's tasks at the machine's clock.
type QueueStats struct {
	Name      string
	Total     uint64
	Available uint64
	Claimed   uint64
	Delayed   uint64
	// OldestAvailableAt is the smallest at among available tasks (0 if
	// none), looking at the queue's highest 256 priorities only.
	OldestAvailableAt int64
	// Paused: the queue hands out no claims (OP_PAUSE). A paused queue is
	// listed even when it holds no tasks.
	Paused bool
	// MaxClaimed is the queue's concurrency limit (OP_LIMIT; 0: none). A
	// queue with a limit is listed even when it holds no tasks.
	MaxClaimed uint32
	// Policy is the queue's policy (OP_POLICY; nil: none). A queue with
	// a policy is listed even when it holds no tasks.
	Policy *fsmpb.QueuePolicy
}

// Machine is the state machine of one shard. It implements raft.FSM. Apply,
// Snapshot and Restore are called by raft on one goroutine; the read methods
// are safe for concurrent use with them.
//
// Results and tasks returned by a Machine share memory with its state (task
// values, stored exactly-once results): callers must treat them as read-only.
type Machine struct {
	opts Options // normalised by New

	mu sync.RWMutex // guards st; Apply and Restore write, reads read
	st *state

	cp checkpoints
}

var (
	_ raft.FSM         = (*Machine)(nil)
	_ raft.BatchingFSM = (*Machine)(nil)
)

// New returns an empty machine.
func New(opts Options) *Machine {
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = DefaultMaxSessions
	}
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = DefaultSessionTTL
	}
	if opts.MaxSessionBytes == 0 {
		opts.MaxSessionBytes = DefaultMaxSessionBytes
	}
	return &Machine{opts: opts, st: newState()}
}

// NewOnDisk returns a machine whose tasks, sessions and key reservations
// are shard's range of db (package fsm/ondisk), reopening what the range
// holds. Each batch of entries it applies is one write to db, without a
// sync: the Raft log is the durable record.
//
// A reopened machine is the state after the applied index it stored
// (AppliedIndex); Apply skips the entries up to it, which raft replays
// from its last snapshot. Snapshot flushes the engine first, so the stored
// state is never older than a snapshot raft keeps.
//
// Not yet complete (fsm/ondisk/DESIGN.md, step 3): snapshots and installs
// go through memory. Until then it is for tests, which run the applier on
// both stores.
func NewOnDisk(opts Options, db *pebble.DB, shard uint32) (*Machine, error) {
	m := New(opts)
	d, err := openDiskStore(db, shard)
	if err != nil {
		return nil, fmt.Errorf("fsm: open shard %d of the on-disk state: %w", shard, err)
	}
	m.st = newStateWith(d)
	if d.small != nil {
		if err := m.st.loadSmall(d.small); err != nil {
			return nil, fmt.Errorf("fsm: open shard %d of the on-disk state: %w", shard, err)
		}
	}
	tx := d.st.Begin()
	m.st.clock = tx.Clock()
	tx.Discard()
	m.st.applied = d.st.Applied()
	return m, nil
}

// Close lets go of the engine under a machine on disk: from now on its
// reads see an empty state, so that a read racing a node's shutdown does
// not reach a closed engine. The caller has stopped raft (no Apply or
// Restore runs, and no snapshot is being written); the engine can be
// closed once Close returns. On a machine in memory it drops the state.
func (m *Machine) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.st = newState()
}

// DropOnDisk deletes what shard holds in the engine db, durably, so that a
// replica started there afresh (one retired earlier, or rebuilt) starts
// empty. No machine may be open on the shard.
func DropOnDisk(db *pebble.DB, shard uint32) error {
	if err := checkShard(shard); err != nil {
		return err
	}
	for gen := range uint32(2) {
		if err := clearRange(db, shard, gen); err != nil {
			return fmt.Errorf("fsm: drop shard %d: %w", shard, err)
		}
	}
	if err := db.Delete(genKey(shard), pebble.NoSync); err != nil {
		return fmt.Errorf("fsm: drop shard %d: %w", shard, err)
	}
	if err := db.Flush(); err != nil { // no WAL: a write lasts once flushed
		return fmt.Errorf("fsm: drop shard %d: %w", shard, err)
	}
	return nil
}

// Apply decodes and applies one log entry. It returns *fsmpb.Result for a
// command entry. An undecodable entry panics: diverging replicas are worse
// than a crash.
func (m *Machine) Apply(l *raft.Log) interface{} {
	return m.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch implements raft.BatchingFSM: it applies several entries under
// one lock acquisition, each exactly as Apply would.
func (m *Machine) ApplyBatch(logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	cmds := make([]*fsmpb.Command, len(logs))
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		cmd, err := DecodeCommand(l.Data)
		if err != nil {
			panic(fmt.Sprintf("fsm: log entry %d (term %d) is not a command this version can apply: %v", l.Index, l.Term, err))
		}
		cmds[i] = cmd
	}
	var n notifier
	m.mu.Lock()
	ts, _ := m.st.store.(txnStore)
	if ts != nil {
		ts.begin() // one transaction for the batch
	}
	for i, l := range logs {
		if l.Index <= m.st.applied {
			// In the state already: raft replays the log from its last
			// snapshot, and the on-disk state may be ahead of it; a
			// follower that installed a snapshot expanded from a marker
			// holds a state past the snapshot's index (marker.go).
			continue
		}
		if cmds[i] == nil {
			m.setAppliedLocked(l.Index)
			continue
		}
		out[i] = m.applyLocked(l.Index, cmds[i], &n)
	}
	if ts != nil {
		ts.commit(m.st.applied, m.st.encodeSmall())
	}
	m.mu.Unlock()
	m.notify(&n)
	return out
}

// ApplyCommand applies a decoded command as if at log index index (used by
// Apply, tests and log replay without raft).
func (m *Machine) ApplyCommand(index uint64, cmd *fsmpb.Command) *fsmpb.Result {
	var n notifier
	m.mu.Lock()
	ts, _ := m.st.store.(txnStore)
	if ts != nil {
		ts.begin()
	}
	res := m.applyLocked(index, cmd, &n)
	if ts != nil {
		ts.commit(m.st.applied, m.st.encodeSmall())
	}
	m.mu.Unlock()
	m.notify(&n)
	return res
}

func (m *Machine) setAppliedLocked(index uint64) {
	if index > m.st.applied {
		m.st.applied = index
	}
}

func (m *Machine) applyLocked(index uint64, cmd *fsmpb.Command, n *notifier) *fsmpb.Result {
	m.setAppliedLocked(index)
	before := m.st.clock
	a := applier{st: m.st, opts: &m.opts, n: n, budget: cmd.GetBudget()}
	res := a.command(cmd)
	// Right here, even in the middle of a batch: the checkpoint must be the
	// state after exactly this entry on every replica.
	if crossesCheckpoint(before, m.st.clock) {
		m.checkpointLocked(index)
	}
	return res
}

func (m *Machine) notify(n *notifier) {
	if m.opts.OnAvailable != nil && len(n.queues) > 0 {
		m.opts.OnAvailable(n.queues)
	}
	if m.opts.OnSlotChange != nil && n.slots {
		m.opts.OnSlotChange()
	}
}

// Clock is the largest leader time the machine has seen.
func (m *Machine) Clock() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.clock
}

// NextDue returns the earliest time at which a task that is delayed or
// claimed now becomes available (a delay or a lease ends), if any. Until a
// command moves the clock past it, the counts of Queues show it as it was:
// the leader ticks a shard whose next task came due (cluster).
func (m *Machine) NextDue() (at int64, ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	t, ok := m.st.store.nextDue()
	if !ok {
		return 0, false
	}
	return t.at, true
}

// AppliedIndex is the index of the last applied log entry.
func (m *Machine) AppliedIndex() uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.applied
}

// TaskCount is the number of tasks held.
func (m *Machine) TaskCount() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.store.count()
}
