package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hashicorp/raft"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// Coalesced proposals. A shard's leader hands hashicorp/raft at most one
// entry of client writes (Modify, claim) at a time (Tuning.CoalesceInflight)
// until its leader loop has appended it to the log (the StoreLogs that
// carries it returned: storeHook) or it completed. A write that finds no
// entry waiting to be appended is proposed at once, alone, exactly as it
// would be without coalescing; the writes that arrive while one waits (the
// leader syncing its log) queue, and when it is appended the queue goes out
// as one OP_BATCH entry (bounded by Tuning.CoalesceBytes and
// CoalesceRequests; the rest goes next). No timer: each entry carries what
// queued while the one before was appended, what hashicorp/raft would have
// put in that one append as separate entries, and a lone write waits for
// nothing. Entries already appended replicate, commit and apply meanwhile,
// so the pipeline stays as full as without coalescing. (Waiting for the
// entry to commit instead made the leader's sync and its followers' take
// turns: half the throughput.)
//
// Every command of an OP_BATCH is applied on its own (fsm/apply.go): its own
// clock update, exactly-once session, slot check, atomicity and Result, so
// one refused write does not refuse its neighbours and each caller gets its
// own answer. The entry's memory budget is the one the applier uses for
// every command in it.

// Defaults of Tuning.CoalesceBytes, CoalesceRequests and CoalesceInflight.
const (
	DefaultCoalesceBytes    = 1 << 20
	DefaultCoalesceRequests = 256
	DefaultCoalesceInflight = 1
)

// pendingState is where a queued write stands.
const (
	pendingQueued    int32 = iota // in the queue; its caller waits
	pendingTaken                  // in an entry (or about to be): its outcome is the entry's
	pendingAbandoned              // its caller gave up before it was taken: never proposed
)

// pending is one write waiting for, or carried by, a coalesced entry.
type pending struct {
	// data is the encoded command, stamped with Now but not with the
	// memory budget: the entry carries that once (launch, batchEntry).
	data []byte
	now  int64
	// budgeted: the command is one the budget applies to (takesBudget).
	budgeted bool
	state    atomic.Int32
	start    time.Time
	done     chan proposed // buffered: the deliverer never blocks
	// span is the write's propose span, commit its commit span from when
	// its entry goes to Raft (nil when not traced: tracing.go).
	span, commit trace.Span
}

type proposed struct {
	res *fsmpb.Result
	err error
}

// coalescer is a shard's queue of writes behind its entries waiting to be
// appended.
type coalescer struct {
	mu       sync.Mutex
	inflight int // entries of writes built or waiting to be appended
	queue    []*pending
	// appending maps the first byte of each such entry's data to it, for
	// the leader's StoreLogs to release (storeHook); waiting is its size,
	// read without the lock by every StoreLogs, followers' included.
	appending map[*byte]*launched
	waiting   atomic.Int32
}

// launched is one entry of writes handed to raft.
type launched struct {
	// batch: its writes; key: the first byte of its data. Both change
	// (under coalescer.mu) when writes join it before the append.
	batch    []*pending
	key      *byte
	released atomic.Bool // its slot was freed: appended or completed
}

// coalesces reports whether cmd may share an entry: client writes only.
// Ticks, schedules, formats and slot steps are proposed alone as before.
func coalesces(cmd *fsmpb.Command) bool {
	switch cmd.Op {
	case fsmpb.Op_OP_MODIFY, fsmpb.Op_OP_MODIFY_CLAIM, fsmpb.Op_OP_CLAIM:
		return true
	}
	return false
}

func (t Tuning) coalesceLimits() (bytes, requests, inflight int) {
	bytes, requests, inflight = t.CoalesceBytes, t.CoalesceRequests, t.CoalesceInflight
	if bytes <= 0 {
		bytes = DefaultCoalesceBytes
	}
	if requests <= 0 {
		requests = DefaultCoalesceRequests
	}
	if inflight <= 0 {
		inflight = DefaultCoalesceInflight
	}
	return bytes, requests, inflight
}

// proposeCoalesced proposes cmd (stamped already) at once if fewer entries
// than the bound are in flight, else queues it for the next entry, and
// waits for its outcome.
func (s *Shard) proposeCoalesced(ctx context.Context, cmd *fsmpb.Command, span trace.Span) (*fsmpb.Result, error) {
	data, err := fsm.EncodeCommand(cmd)
	if err != nil {
		return nil, err
	}
	p := &pending{data: data, now: cmd.Now, budgeted: takesBudget(cmd.Op), start: time.Now(), done: make(chan proposed, 1), span: span}
	c := &s.co
	c.mu.Lock()
	c.queue = append(c.queue, p)
	if _, _, most := s.tuning.coalesceLimits(); c.inflight < most {
		s.takeLocked() // unlocks
	} else {
		c.mu.Unlock()
	}
	select {
	case out := <-p.done:
		return out.res, out.err
	case <-ctx.Done():
		if p.state.CompareAndSwap(pendingQueued, pendingAbandoned) {
			return nil, ctx.Err() // never proposed
		}
		return nil, fmt.Errorf("shard %d: %w: %w", s.id, ErrUnknownOutcome, ctx.Err())
	case <-s.stop:
		if p.state.CompareAndSwap(pendingQueued, pendingAbandoned) {
			return nil, &NotLeaderError{Shard: s.id} // never proposed: retry elsewhere
		}
		return nil, fmt.Errorf("shard %d: %w: %w", s.id, ErrUnknownOutcome, ErrShutdown)
	}
}

// launch proposes the taken writes in batch as one entry (a lone write as
// itself) and, once the entry completes, answers them. Until the leader's
// loop appends it, writes that queue meanwhile join it (before). The entry's
// slot is freed, and what queued after the append launched, when the leader
// has appended it or it completed, whichever comes first.
func (s *Shard) launch(batch []*pending) {
	var data []byte
	if len(batch) > 1 {
		data = s.batchEntry(batch)
	} else {
		data = s.loneEntry(batch[0])
	}
	for _, p := range batch {
		if p.span != nil {
			p.commit = startCommit(p.span, len(batch))
		}
	}
	e := &launched{batch: batch, key: unsafe.SliceData(data)}
	c := &s.co
	c.mu.Lock()
	if c.appending == nil {
		c.appending = make(map[*byte]*launched)
	}
	c.appending[e.key] = e
	c.waiting.Add(1)
	c.mu.Unlock()
	f := s.g.raft.Apply(data, s.tuning.ApplyTimeout)
	go func() {
		// A future may never answer once its group shut down
		// (hashicorp/raft#498): the writes' callers leave on stop, and
		// the shard is not used again.
		err := f.Error()
		s.release(e)
		c.mu.Lock()
		batch := e.batch
		c.mu.Unlock()
		if s.proposedEntries != nil {
			s.proposedRequests.Add(float64(len(batch)))
			s.proposedEntries.Inc()
		}
		s.answer(batch, f, err)
	}()
}

// before is called by the leader's loop right before it appends entries
// (storeHook): an entry of writes among them takes in the writes that
// queued since it was proposed, up to the bounds, so that the entry is cut
// when raft writes it, not when it was handed over. Nothing has read its
// data yet: the leader stores, replicates and applies it from this Log.
func (s *Shard) before(logs []*raft.Log) {
	c := &s.co
	if c.waiting.Load() == 0 {
		return
	}
	maxBytes, maxRequests, _ := s.tuning.coalesceLimits()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		return
	}
	for _, l := range logs {
		if l.Type != raft.LogCommand || len(l.Data) == 0 {
			continue
		}
		e := c.appending[unsafe.SliceData(l.Data)]
		if e == nil || e.released.Load() {
			continue
		}
		// The bound is on the OP_BATCH the entry becomes: its head and
		// each write's framing count.
		size := s.batchHeadBytes()
		for _, p := range e.batch {
			size += framedBytes(p)
		}
		grown := e.batch
		i := 0
		for ; i < len(c.queue); i++ {
			p := c.queue[i]
			if len(grown) >= maxRequests || size+framedBytes(p) > maxBytes {
				break
			}
			if !p.state.CompareAndSwap(pendingQueued, pendingTaken) {
				continue // its caller gave up
			}
			if p.span != nil {
				p.commit = startCommit(p.span, 0) // joins an entry as the leader appends it
			}
			grown = append(grown, p)
			size += framedBytes(p)
		}
		n := copy(c.queue, c.queue[i:])
		clear(c.queue[n:])
		c.queue = c.queue[:n]
		if len(grown) > len(e.batch) {
			l.Data = s.batchEntry(grown)
			delete(c.appending, e.key)
			e.batch, e.key = grown, unsafe.SliceData(l.Data)
			c.appending[e.key] = e
		}
		if len(c.queue) == 0 {
			return
		}
	}
}

// stored is called after each StoreLogs of the shard's log (storeHook): on
// the leader, entries its loop appended, among them maybe entries of
// writes, whose slots it frees. It runs on raft's loop, so it proposes
// nothing itself.
func (s *Shard) stored(logs []*raft.Log) {
	c := &s.co
	if c.waiting.Load() == 0 {
		return
	}
	for _, l := range logs {
		if l.Type != raft.LogCommand || len(l.Data) == 0 {
			continue
		}
		c.mu.Lock()
		e := c.appending[unsafe.SliceData(l.Data)]
		if e != nil && len(c.queue) == 0 && e.released.CompareAndSwap(false, true) {
			// Nothing to propose: free the slot right here.
			c.releaseLocked(e)
			e = nil
		}
		c.mu.Unlock()
		if e != nil {
			go s.release(e)
		}
	}
}

// release frees e's slot, once, and launches what queued behind it.
func (s *Shard) release(e *launched) {
	if !e.released.CompareAndSwap(false, true) {
		return
	}
	c := &s.co
	c.mu.Lock()
	c.releaseLocked(e)
	s.takeLocked()
}

// releaseLocked frees the slot of e, released already, with c.mu held.
func (c *coalescer) releaseLocked(e *launched) {
	delete(c.appending, e.key)
	c.waiting.Add(-1)
	c.inflight--
}

// takesBudget reports whether the memory budget applies to commands of
// op: the machine reads it for Modifies (and an OP_BATCH's commands take
// the batch's).
func takesBudget(op fsmpb.Op) bool {
	return op == fsmpb.Op_OP_MODIFY || op == fsmpb.Op_OP_MODIFY_CLAIM || op == fsmpb.Op_OP_BATCH
}

// budgetStamp is the budget this leader stamps now, or nil (none).
func (s *Shard) budgetStamp() *fsmpb.MemoryBudget {
	if s.budget == nil {
		return nil
	}
	return s.budget()
}

// Command's field numbers the coalescer writes as raw bytes.
const (
	commandBatchField  = 13 // Command.batch
	commandBudgetField = 20 // Command.budget
)

// loneEntry is the entry of a write proposed alone: its command, stamped
// with the budget when it takes one. A singular message field appended to
// an encoded message is that field (its data carries none), so the bytes
// are not encoded again.
func (s *Shard) loneEntry(p *pending) []byte {
	b := s.budgetStamp()
	if !p.budgeted || b == nil {
		return p.data
	}
	enc, err := proto.Marshal(b)
	if err != nil {
		panic(fmt.Sprintf("cluster: encode a memory budget: %v", err)) // a plain message always encodes
	}
	out := make([]byte, 0, len(p.data)+protowire.SizeTag(commandBudgetField)+protowire.SizeBytes(len(enc)))
	out = append(out, p.data...)
	out = protowire.AppendTag(out, commandBudgetField, protowire.BytesType)
	return protowire.AppendBytes(out, enc)
}

// framedBytes is what p takes in an OP_BATCH: its command with the field's
// tag and length.
func framedBytes(p *pending) int {
	return protowire.SizeTag(commandBatchField) + protowire.SizeBytes(len(p.data))
}

// batchHeadBytes bounds the size of an OP_BATCH's head (batchEntry): the
// largest time and budget it may carry.
func (s *Shard) batchHeadBytes() int {
	head := &fsmpb.Command{Op: fsmpb.Op_OP_BATCH, Now: math.MaxInt64}
	if s.budgetStamp() != nil {
		head.Budget = &fsmpb.MemoryBudget{Bytes: math.MaxUint64, TaskOverhead: math.MaxUint64}
	}
	return proto.Size(head)
}

// batchEntry encodes an OP_BATCH of the writes' commands, as raw bytes
// (each was encoded once, by its caller, without a budget): the entry's
// time is the latest of theirs, and its head carries the budget the
// applier uses for all of them, once.
func (s *Shard) batchEntry(batch []*pending) []byte {
	head := &fsmpb.Command{Op: fsmpb.Op_OP_BATCH, Budget: s.budgetStamp()}
	for _, p := range batch {
		head.Now = max(head.Now, p.now)
	}
	out, err := fsm.EncodeCommand(head)
	if err != nil {
		panic(fmt.Sprintf("cluster: encode a batch head: %v", err)) // a plain message always encodes
	}
	for _, p := range batch {
		out = protowire.AppendTag(out, commandBatchField, protowire.BytesType)
		out = protowire.AppendBytes(out, p.data)
	}
	return out
}

// answer gives each write of batch its outcome from the completed entry f.
func (s *Shard) answer(batch []*pending, f raft.ApplyFuture, err error) {
	for _, p := range batch {
		endCommit(p.commit, err)
	}
	if err != nil {
		err = s.applyErr(err)
		for _, p := range batch {
			p.done <- proposed{err: err}
		}
		return
	}
	res, ok := f.Response().(*fsmpb.Result)
	if !ok || len(batch) > 1 && len(res.GetBatch()) != len(batch) {
		err := fmt.Errorf("shard %d: %w: unexpected apply response %T", s.id, ErrUnknownOutcome, f.Response())
		for _, p := range batch {
			p.done <- proposed{err: err}
		}
		return
	}
	for i, p := range batch {
		r := res
		if len(batch) > 1 {
			r = res.Batch[i]
		}
		s.applySeconds.Observe(time.Since(p.start).Seconds())
		p.done <- proposed{res: r}
	}
}

// takeLocked, with s.co.mu held and a slot free, launches the queued
// writes, up to the bounds, as one entry, and unlocks. Without the
// leadership (or with a reason not to lead) it refuses every queued write
// instead: none was proposed, so each may be retried anywhere.
func (s *Shard) takeLocked() {
	maxBytes, maxRequests, _ := s.tuning.coalesceLimits()
	c := &s.co
	var refuse error
	if len(c.queue) > 0 {
		if s.isStopped() {
			refuse = &NotLeaderError{Shard: s.id}
		} else if !s.IsLeader() {
			refuse = s.notLeader()
		} else if s.mayNotLead != nil && s.mayNotLead() != "" {
			refuse = &NotLeaderError{Shard: s.id}
		}
	}
	var batch []*pending
	// The bound is on the OP_BATCH: its head and each write's framing
	// count (a lone write goes as it is, whatever its size).
	size, i := 0, 0
	if len(c.queue) > 1 && refuse == nil {
		size = s.batchHeadBytes()
	}
	for ; i < len(c.queue); i++ {
		p := c.queue[i]
		if refuse == nil && len(batch) > 0 && (len(batch) >= maxRequests || size+framedBytes(p) > maxBytes) {
			break
		}
		if !p.state.CompareAndSwap(pendingQueued, pendingTaken) {
			continue // its caller gave up
		}
		if refuse != nil {
			p.done <- proposed{err: refuse}
			continue
		}
		batch = append(batch, p)
		size += framedBytes(p)
	}
	n := copy(c.queue, c.queue[i:])
	clear(c.queue[n:])
	c.queue = c.queue[:n]
	if len(batch) == 0 {
		c.mu.Unlock()
		return
	}
	c.inflight++
	c.mu.Unlock()
	s.launch(batch)
}

// applyErr maps a failed proposal's error: not enqueued (safe to retry
// anywhere) or an unknown outcome (retry with the same request id).
func (s *Shard) applyErr(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress),
		errors.Is(err, raft.ErrEnqueueTimeout):
		return s.notLeader()
	default:
		// ErrLeadershipLost, ErrRaftShutdown, or anything else after enqueueing.
		return fmt.Errorf("shard %d: %w: %w", s.id, ErrUnknownOutcome, err)
	}
}
