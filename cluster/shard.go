package cluster

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// Shard is one replica of a shard: a Raft group running an fsm.Machine. It is
// safe for concurrent use.
type Shard struct {
	id            uint32
	g             *group
	machine       *fsm.Machine
	clock         func() time.Time
	tuning        Tuning
	log           *slog.Logger
	waiters       waiters
	applySeconds  prometheus.Observer
	leaderChanges prometheus.Counter
	// proposedRequests, proposedEntries count the commands this replica
	// proposed as leader and the log entries that carried them (several
	// client writes may share one, coalesce.go); nil in tests that build
	// a bare shard.
	proposedRequests prometheus.Counter
	proposedEntries  prometheus.Counter
	// emptyClaims counts the claims answered empty without a log entry
	// (tryClaim); nil in tests that build a bare shard.
	emptyClaims prometheus.Counter
	// co queues the writes behind the entry in flight (coalesce.go).
	co            coalescer
	scheduleTicks *prometheus.CounterVec // by result; nil in tests that build a bare shard
	unevaluable   int64                  // the tick of the last schedule warned about (FireSchedules)
	// retainAt is where each retained queue's walk goes on (ExpireRetained;
	// only its chore touches it).
	retainAt map[string]*fsmpb.ExpireResult
	// aheadLog, aheadMono: the log time and monotonic instant Now counts
	// from while the log's time is ahead of this node's clock.
	aheadMu   sync.Mutex
	aheadLog  int64
	aheadMono time.Time
	// mayNotLead says why this node must not lead now (a clock too far
	// from its peers', clock.go; a full disk, disk.go), or ""; nil trusts it.
	mayNotLead func() string
	// logBound: the TrailingLogs and SnapshotThreshold last set by
	// chores.boundLogs (node goroutine only).
	logBound [2]uint64
	// logBase: the counts the bound never exceeds: Tuning's, or what
	// someone else (an operator, a test) set with ReloadConfig since.
	logBase [2]uint64
	// leaderHint resolves a leader id to its gRPC address through the map.
	leaderHint func(shard uint32, id raft.ServerID, addr raft.ServerAddress) *NotLeaderError
	// beforeReady runs once the leader's post-election barrier returned
	// and before it serves its first request (nil: nothing to do).
	beforeReady func()
	// budget is the memory budget this replica stamps, as leader, into
	// the Modifies it proposes (nil func or result: none; memory.go).
	budget func() *fsmpb.MemoryBudget

	// readyTerm is the term in which this replica, as leader, applied
	// everything committed before that term (its Barrier returned), or 0.
	// Linearizable reads may be served after one VerifyLeader only while
	// it leads in that same term: LeaderCh may drop a "lost" signal, so a
	// replica that stepped down and was re-elected before watchLeadership
	// ran would otherwise keep the flag of its earlier term and serve reads
	// that miss what another leader committed in between.
	readyTerm atomic.Uint64
	// watchHold is held by tests (export_test.go) to stall
	// watchLeadership between receiving a signal and acting on it.
	watchHold sync.Mutex
	stop      chan struct{}
	wg        sync.WaitGroup
}

// newShard makes a shard whose machine newMachine makes (fsm.New, or on
// the node's engine).
func newShard(id uint32, clock func() time.Time, t Tuning, log *slog.Logger, newMachine func(fsm.Options) (*fsm.Machine, error)) (*Shard, error) {
	s := &Shard{id: id, clock: clock, tuning: t, log: log.With("shard", id), stop: make(chan struct{})}
	m, err := newMachine(fsm.Options{OnAvailable: s.waiters.notify, OnSlotChange: s.waiters.wakeAll})
	if err != nil {
		return nil, err
	}
	s.machine = m
	s.waiters = waiters{
		byQueue:   make(map[string][]*waiter),
		now:       s.Now,
		available: s.machine.Available,
		nextAt:    s.machine.NextAt,
		leading:   s.IsLeader,
	}
	return s, nil
}

// ID is the shard id.
func (s *Shard) ID() uint32 { return s.id }

// Machine is the shard's state machine, for replica checks and tests:
// the API reads through Read, which fences linearizable reads.
func (s *Shard) Machine() *fsm.Machine { return s.machine }

// Raft is the shard's Raft instance.
func (s *Shard) Raft() *raft.Raft { return s.g.raft }

// LogReader reads one replica's Raft log. raft.LogStore satisfies it.
type LogReader interface {
	FirstIndex() (uint64, error)
	LastIndex() (uint64, error)
	GetLog(index uint64, log *raft.Log) error
}

// Log reads this replica's Raft log as stored on disk, for the checkers
// that compare replicas entry by entry (testing/checker.LogAgreement).
func (s *Shard) Log() LogReader { return s.g.logs }

func (s *Shard) start(g *group) {
	s.g = g
	g.stored.hook(s.before, s.stored)
	s.wg.Add(1)
	go s.watchLeadership()
}

// close stops the replica; its machine lets go of the node's engine, which
// may be closed or have the shard dropped from it afterwards.
func (s *Shard) close() error {
	close(s.stop)
	s.waiters.close()
	err := s.g.shutdown()
	s.wg.Wait()
	s.machine.Close()
	return err
}

// watchLeadership marks the shard ready for linearizable reads once a new
// leader has applied everything committed before its term.
func (s *Shard) watchLeadership() {
	defer s.wg.Done()
	for {
		select {
		case <-s.stop:
			return
		case leader := <-s.g.raft.LeaderCh():
			s.watchHold.Lock() // tests stall the watcher here
			s.watchHold.Unlock()
			s.readyTerm.Store(0)
			if !leader {
				s.log.Info("lost leadership")
				s.waiters.wakeAll() // their claims answer "not leader"
				continue
			}
			term := s.g.raft.CurrentTerm()
			err, stopped := awaitFuture(context.Background(), s.stop, s.g.raft.Barrier(s.tuning.ApplyTimeout))
			if stopped != nil {
				return
			}
			if err != nil {
				s.log.Warn("barrier after election failed", "err", err)
				continue
			}
			// The barrier proves the log applied up to this term's start
			// only if the term did not change while it ran.
			if s.beforeReady != nil && s.g.raft.State() == raft.Leader && s.g.raft.CurrentTerm() == term {
				s.beforeReady()
			}
			if s.g.raft.State() == raft.Leader && s.g.raft.CurrentTerm() == term {
				s.readyTerm.Store(term)
				s.leaderChanges.Inc()
				s.log.Info("leading", "term", term)
			}
		}
	}
}

// IsLeader reports whether this replica leads and is ready: it leads in
// the term its post-election barrier ran in.
func (s *Shard) IsLeader() bool {
	t := s.readyTerm.Load()
	if t == 0 || s.g.raft.CurrentTerm() != t {
		return false
	}
	// A node leads at most once per term, so Leader in the barrier's term
	// is the leadership the barrier ran for; the second term read closes
	// the window where the state is read after a term change.
	return s.g.raft.State() == raft.Leader && s.g.raft.CurrentTerm() == t
}

func (s *Shard) notLeader() error {
	addr, id := s.g.raft.LeaderWithID()
	return s.leaderHint(s.id, id, addr)
}

// Now is the time the leader stamps into a command: its clock, but never
// before the machine's clock, so log time never goes backwards across leader
// changes. When the log's time is ahead of this clock (an earlier leader's
// clock ran fast), it advances from the log's time at the monotonic rate
// instead of stamping that same time until this clock catches up: that
// froze leases and delays for as long as the jump.
func (s *Shard) Now() int64 {
	now := s.clock().UnixNano()
	c := s.machine.Clock()
	s.aheadMu.Lock()
	defer s.aheadMu.Unlock()
	if c <= now {
		s.aheadLog = 0
		return now
	}
	if s.aheadLog == 0 || s.aheadLog+int64(time.Since(s.aheadMono)) < c {
		s.aheadLog, s.aheadMono = c, time.Now()
	}
	return max(c, s.aheadLog+int64(time.Since(s.aheadMono)))
}

// Propose stamps cmd with the leader's time and commits it: a client write
// (Modify, claim) may share its log entry with others (coalesce.go). On an error the
// command either was not applied (ErrNotLeader, safe to retry anywhere) or
// its outcome is unknown (ErrUnknownOutcome: retry with the same request id).
func (s *Shard) Propose(ctx context.Context, cmd *fsmpb.Command) (res *fsmpb.Result, err error) {
	ctx, span := s.startPropose(ctx, cmd)
	if span != nil {
		defer func() { endPropose(span, res, err) }()
	}
	if !s.IsLeader() {
		return nil, s.notLeader()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.mayNotLead != nil && s.mayNotLead() != "" {
		// A far clock's time would become the log's for good (clock.go);
		// a full disk cannot append (disk.go). No hint: it hands
		// leadership away.
		return nil, &NotLeaderError{Shard: s.id}
	}
	cmd.Now = s.Now()
	if coalesces(cmd) {
		if _, n, _ := s.tuning.coalesceLimits(); n > 1 {
			// Unstamped: the entry carries the budget once, a lone
			// write's or a batch's head (launch, batchEntry).
			return s.proposeCoalesced(ctx, cmd, span)
		}
	}
	if takesBudget(cmd.Op) {
		// The machine decides by this stamp, so every replica refuses
		// alike whatever its own limit (fsm/budget.go).
		cmd.Budget = s.budgetStamp()
	}
	data, err := fsm.EncodeCommand(cmd)
	if err != nil {
		return nil, err
	}
	timeout := s.tuning.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	start := time.Now()
	if s.proposedEntries != nil {
		s.proposedRequests.Inc()
		s.proposedEntries.Inc()
	}
	commit := startCommit(span, 1)
	f := s.g.raft.Apply(data, timeout)
	err, stopped := awaitFuture(ctx, s.stop, f)
	endCommit(commit, cmp.Or(err, stopped))
	if stopped != nil {
		// The entry may still commit.
		return nil, fmt.Errorf("shard %d: %w: %w", s.id, ErrUnknownOutcome, stopped)
	}
	if err != nil {
		return nil, s.applyErr(err)
	}
	s.applySeconds.Observe(time.Since(start).Seconds())
	res, ok := f.Response().(*fsmpb.Result)
	if !ok {
		return nil, fmt.Errorf("shard %d: unexpected apply response %T", s.id, f.Response())
	}
	return res, nil
}

// Read runs fn on the shard's state machine. Unless stale, the read is
// linearizable (ReadBarrier first): it sees every write acknowledged before
// Read was called. A stale read sees this replica's state, however far it
// trails. It is the one way the API reads a shard.
func (s *Shard) Read(ctx context.Context, stale bool, fn func(*fsm.Machine) error) error {
	if !stale {
		if err := s.ReadBarrier(ctx); err != nil {
			return err
		}
	}
	return fn(s.machine)
}

// ReadBarrier makes a following read of the machine linearizable: this
// replica leads, has applied everything committed before its term, and a
// quorum still follows it. Every acknowledged write was applied before it
// was acknowledged, so the read sees it.
func (s *Shard) ReadBarrier(ctx context.Context) error {
	if !s.IsLeader() {
		return s.notLeader()
	}
	err, stopped := awaitFuture(ctx, s.stop, s.g.raft.VerifyLeader())
	if stopped != nil {
		return stopped
	}
	if err != nil {
		return s.notLeader()
	}
	return nil
}

// Claim claims and, when nothing is available and wait > 0, parks until
// the leader wakes it for a task that became available in one of the
// queues (insert, release, move, or a delay or lease running out), then
// tries again, until wait ends (an empty result, not an error). The leader
// wakes as many parked claims as there are tasks, oldest first (waiters); a
// claim that was woken but found nothing parks again in its place.
//
// Each try proposes the claim only when it may take something
// (tryClaim): a claim that finds nothing, and a waiting claim as it parks,
// cost no log entry.
func (s *Shard) Claim(ctx context.Context, cmd *fsmpb.Command, wait time.Duration) (*fsmpb.Result, error) {
	if wait <= 0 {
		return s.tryClaim(ctx, cmd) // nothing to wait for: no waiter to register
	}
	deadline := s.clock().Add(wait)
	// Registered before the first try, so that a commit between its
	// result and the wait is not missed.
	w := s.waiters.add(cmd.Claim.Queues, int(cmd.Claim.Limit))
	defer s.waiters.leave(w)
	for {
		res, err := s.tryClaim(ctx, cmd)
		if err != nil || res.Failure != nil || len(res.GetClaim().GetTasks()) > 0 {
			return res, err
		}
		left := deadline.Sub(s.clock())
		if left <= 0 {
			return res, nil
		}
		s.waiters.park(w)
		timer := time.NewTimer(left)
		select {
		case <-w.ch:
		case <-timer.C:
		case <-ctx.Done():
		case <-s.stop:
		}
		timer.Stop()
		if ctx.Err() != nil || s.isStopped() || !deadline.After(s.clock()) {
			return res, nil
		}
	}
}

// tryClaim answers a claim that would find nothing from the leader's
// applied state, with no log entry, and proposes it otherwise. The answer
// "nothing" comes from a linearizable read (ReadBarrier: this replica
// leads, has applied its term's start, and a quorum still follows it, a
// heartbeat round and no entry), so a deposed leader never answers it from
// stale state; every write acknowledged before the claim is in that state.
// The time it judges by is taken after the barrier and is no earlier than
// what a proposal would stamp, so a task due or a lease ending by then
// counts as claimable. When in doubt (a retry the session knows, a claim
// that would be refused, a task that may be claimable) it proposes:
// fsm.Machine.ClaimFindsNothing. A claim that may find a task is proposed
// at once, without the barrier: it costs what it cost before.
func (s *Shard) tryClaim(ctx context.Context, cmd *fsmpb.Command) (*fsmpb.Result, error) {
	if s.IsLeader() && (s.mayNotLead == nil || s.mayNotLead() == "") && s.machine.ClaimFindsNothing(cmd, s.Now()) {
		if err := s.ReadBarrier(ctx); err != nil {
			return nil, err
		}
		// Read again: the first read was not fenced, and a write may
		// have applied while the barrier ran.
		if s.machine.ClaimFindsNothing(cmd, s.Now()) {
			if s.emptyClaims != nil {
				s.emptyClaims.Inc()
			}
			return &fsmpb.Result{Claim: &fsmpb.ClaimResult{}}, nil
		}
	}
	return s.Propose(ctx, cmd) // also answers "not leader"
}

// Waiting is the number of claims waiting on this replica (Claim with a
// wait, from its first proposal until it answers).
func (s *Shard) Waiting() int { return s.waiters.count() }

func (s *Shard) isStopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// LogBytes is the size of the replica's retained Raft log entries.
func (s *Shard) LogBytes() int64 {
	if g, ok := s.g.logs.(interface{ Bytes() int64 }); ok {
		return g.Bytes()
	}
	return 0
}
