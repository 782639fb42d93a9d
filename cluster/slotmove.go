package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// Slot moves. The meta leader's slot mover (slotMover) drives each move
// the meta map holds, up to moversAtOnce at a time, through the shards'
// logs (fsm/slots.go has the shard side), phase by phase as
// control.MoveSteps lists them; it reaches the shards' leaders through
// shardLeaders (slotpeer.go):
//
//	COPYING   source FREEZE; target DROP (what an earlier attempt left),
//	          then IMPORT chunk 0, 1, ... of ExportSlot from the source;
//	          meta FLIP: the routing table names the target.
//	FLIPPED   target ACTIVATE; source DROP until empty; meta END.
//	ABORTING  target DROP until empty; source UNFREEZE; meta END.
//
// Every step is safe to repeat, so a new meta leader resumes a move from
// its phase (a copy starts over). A copy the shards refuse, or that cannot
// finish within MoveCopyTimeout, is abandoned (control.AbandonCopy;
// ABORTING): the slot is served where it was.

const (
	// slotChunkBytes bounds the records of one IMPORT entry.
	slotChunkBytes = 1 << 20
	// slotDropLimit bounds the tasks one DROP entry deletes, so that a big
	// slot's deletion does not hold the shard's other writes for long.
	slotDropLimit = 2000
	// MoveCopyTimeout is how long a move's copy may keep failing before it
	// is abandoned: meanwhile the slot's writers wait.
	MoveCopyTimeout = 30 * time.Second
)

// MovePhaseName is the name the API shows for a move's phase.
func MovePhaseName(p metapb.SlotMove_Phase) string {
	switch p {
	case metapb.SlotMove_COPYING:
		return "copying"
	case metapb.SlotMove_FLIPPED:
		return "flipped"
	case metapb.SlotMove_ABORTING:
		return "aborting"
	case metapb.SlotMove_DONE:
		return "done"
	case metapb.SlotMove_ABORTED:
		return "aborted"
	}
	return "unknown"
}

// MoveToAPI converts a move for the API.
func MoveToAPI(m *metapb.SlotMove) *taskstorepb.SlotMove {
	return &taskstorepb.SlotMove{Id: m.Id, Slot: m.Slot, From: m.From, To: m.To, Phase: MovePhaseName(m.Phase), Error: m.Error}
}

// slotMover is the meta leader's slot mover: it drives the moves the map
// holds through the shards' logs (control.MoveSteps) and, when none is
// under way, the retiring shards' chores (control.Controller.RetiringWork).
// It holds only what it needs of the node.
type slotMover struct {
	meta     *metaFSM
	leading  func() bool // the meta group's leader, past its barrier
	propose  func(context.Context, *metapb.Command) error
	leaders  shardLeaders
	ctl      *control.Controller
	log      *slog.Logger
	finished *prometheus.CounterVec // moves finished, by outcome
	timeout  time.Duration          // one Raft round's (Tuning.ApplyTimeout)
	stop     <-chan struct{}
	wake     chan struct{}
}

func newSlotMover(n *Node) *slotMover {
	return &slotMover{
		meta:     n.meta,
		leading:  n.metaLead.ready.Load,
		propose:  n.metaLead.propose,
		leaders:  n.shardLeaders(),
		ctl:      n.ctl,
		log:      n.log,
		finished: n.metrics.movesFinished,
		timeout:  n.cfg.Tuning.ApplyTimeout,
		stop:     n.stop,
		wake:     make(chan struct{}, 1),
	}
}

// stopContext is a context that ends after d or when stop closes,
// whichever is first: a stopping node must not wait on its chores.
func stopContext(stop <-chan struct{}, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// wakeUp makes the slot mover look at the map now.
func (m *slotMover) wakeUp() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// moversAtOnce bounds the moves driven at once: moves of different slots
// are independent, and their steps share the groups' Raft rounds.
const moversAtOnce = 32

// run drives up to moversAtOnce moves at a time, each on its own
// goroutine, one phase per turn; when no move is under way it does the
// retiring shards' chores. It returns when the node stops.
func (m *slotMover) run() {
	var (
		mu       sync.Mutex
		failing  = map[uint64]time.Time{} // move -> when its copy first failed
		inFlight = map[uint64]bool{}
		wg       sync.WaitGroup
	)
	defer wg.Wait()
	for {
		if m.leading() {
			moves := m.meta.Map().Moves
			mu.Lock()
			for _, mv := range moves {
				if len(inFlight) >= moversAtOnce {
					break
				}
				if inFlight[mv.Id] {
					continue
				}
				inFlight[mv.Id] = true
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := m.drive(mv, &mu, failing)
					if err != nil {
						m.log.Info("slot move waits", "move", mv.Id, "slot", mv.Slot, "from", mv.From, "to", mv.To,
							"phase", MovePhaseName(mv.Phase), "err", err)
						select {
						case <-time.After(500 * time.Millisecond):
						case <-m.stop:
						}
					}
					mu.Lock()
					delete(inFlight, mv.Id)
					mu.Unlock()
					m.wakeUp()
				}()
			}
			idle := len(inFlight) == 0
			mu.Unlock()
			if idle && len(moves) == 0 {
				ctx, cancel := stopContext(m.stop, m.timeout)
				changed, err := m.ctl.RetiringWork(ctx)
				cancel()
				if err != nil {
					m.log.Info("shard removal waits", "err", err)
				}
				if changed {
					continue
				}
			}
		}
		select {
		case <-m.wake:
		case <-time.After(time.Second):
		case <-m.stop:
			return
		}
	}
}

// slotRefused is a step a shard refused (fsm failure): it will not succeed
// by repeating it.
type slotRefused struct {
	shard uint32
	msg   string
}

func (e *slotRefused) Error() string { return fmt.Sprintf("shard %d refused: %s", e.shard, e.msg) }

// drive takes a move one phase further (control.MoveSteps).
func (m *slotMover) drive(mv *metapb.SlotMove, mu *sync.Mutex, failing map[uint64]time.Time) error {
	ctx, cancel := stopContext(m.stop, 2*m.timeout)
	defer cancel()
	start := time.Now()
	for _, st := range control.MoveSteps(mv) {
		var err error
		switch st.Kind {
		case control.MoveCopy:
			if err = m.copySlot(ctx, mv); err != nil {
				return m.copyFailed(ctx, mv, err, mu, failing)
			}
			mu.Lock()
			delete(failing, mv.Id)
			mu.Unlock()
		case control.MoveFlip:
			if err = m.propose(ctx, &metapb.Command{Op: metapb.Op_OP_MOVE_FLIP, Move: &metapb.SlotMove{Id: mv.Id}}); err == nil {
				m.log.Info("slot moved: the routing table names its new shard", "move", mv.Id, "slot", mv.Slot, "from", mv.From, "to", mv.To,
					"copy", time.Since(start).Round(time.Millisecond))
			}
		case control.MoveActivate:
			_, err = m.step(ctx, st.Shard, mv, fsmpb.SlotCommand_ACTIVATE)
		case control.MoveUnfreeze:
			_, err = m.step(ctx, st.Shard, mv, fsmpb.SlotCommand_UNFREEZE)
		case control.MoveDrop:
			err = m.dropSlot(ctx, st.Shard, mv)
		case control.MoveEnd:
			if err = m.propose(ctx, &metapb.Command{Op: metapb.Op_OP_MOVE_END, Move: &metapb.SlotMove{Id: mv.Id}}); err == nil {
				outcome := "done"
				if mv.Phase == metapb.SlotMove_ABORTING {
					outcome = "aborted"
				}
				m.finished.WithLabelValues(outcome).Inc()
				m.log.Info("slot move finished", "move", mv.Id, "slot", mv.Slot, "from", mv.From, "to", mv.To, "outcome", outcome)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// copyFailed abandons the move (ABORTING) when control.AbandonCopy says
// so, and returns the copy's error otherwise, to try again.
func (m *slotMover) copyFailed(ctx context.Context, mv *metapb.SlotMove, err error, mu *sync.Mutex, failing map[uint64]time.Time) error {
	mu.Lock()
	first, ok := failing[mv.Id]
	if !ok {
		failing[mv.Id] = time.Now()
	}
	mu.Unlock()
	var failingFor time.Duration
	if ok {
		failingFor = time.Since(first)
	}
	var refused *slotRefused
	isRefused := errors.As(err, &refused)
	if !control.AbandonCopy(isRefused, failingFor, MoveCopyTimeout) {
		return err
	}
	if failingFor > MoveCopyTimeout {
		err = fmt.Errorf("the copy kept failing for %s: %w", failingFor.Round(time.Second), err)
	}
	m.log.Warn("slot move abandoned: the slot stays where it was", "move", mv.Id, "slot", mv.Slot, "from", mv.From, "to", mv.To, "err", err)
	return m.propose(ctx, &metapb.Command{Op: metapb.Op_OP_MOVE_ABORT, Move: &metapb.SlotMove{Id: mv.Id, Error: err.Error()}})
}

// SlotTable is a copy of the routing table's slots (slot -> shard).
func (n *Node) SlotTable() []uint32 { return n.meta.SlotTable() }

// slotCount is the size of the map's slot table.
func slotCount(cm *metapb.ClusterMap) uint32 {
	if s := len(cm.Slots); s > 0 {
		return uint32(s)
	}
	return taskstorepb.DefaultSlots
}

// step proposes one slot command for the move on the shard's leader.
func (m *slotMover) step(ctx context.Context, shard uint32, mv *metapb.SlotMove, a fsmpb.SlotCommand_Action) (*fsmpb.Result, error) {
	return m.leaders.slotStep(ctx, shard, &fsmpb.SlotCommand{Action: a, Slot: mv.Slot, Slots: slotCount(m.meta.Map()), Move: mv.Id})
}

// copySlot freezes the slot on the source and copies it to the target.
func (m *slotMover) copySlot(ctx context.Context, mv *metapb.SlotMove) error {
	slots := slotCount(m.meta.Map())
	if _, err := m.leaders.slotStep(ctx, mv.From, &fsmpb.SlotCommand{Action: fsmpb.SlotCommand_FREEZE, Slot: mv.Slot, Slots: slots, Move: mv.Id, To: mv.To}); err != nil {
		return err
	}
	if err := m.dropSlot(ctx, mv.To, mv); err != nil { // an earlier attempt's part
		return err
	}
	var cur fsm.SlotCursor
	tasks := 0
	for chunk := uint32(0); ; chunk++ {
		ch, err := m.leaders.exportSlot(ctx, mv.From, mv, slots, cur)
		if err != nil {
			return err
		}
		c := &fsmpb.SlotCommand{Action: fsmpb.SlotCommand_IMPORT, Slot: mv.Slot, Slots: slots, Move: mv.Id, Chunk: chunk, Records: ch.records}
		if _, err := m.leaders.slotStep(ctx, mv.To, c); err != nil {
			return err
		}
		tasks += ch.tasks
		if ch.done {
			m.log.Debug("slot copied", "move", mv.Id, "slot", mv.Slot, "tasks", tasks, "chunks", chunk+1)
			return nil
		}
		cur = ch.next
	}
}

// dropSlot deletes the move's slot from a shard, a bounded number of tasks
// per entry.
func (m *slotMover) dropSlot(ctx context.Context, shard uint32, mv *metapb.SlotMove) error {
	for {
		res, err := m.leaders.slotStep(ctx, shard, &fsmpb.SlotCommand{Action: fsmpb.SlotCommand_DROP, Slot: mv.Slot, Slots: slotCount(m.meta.Map()),
			Move: mv.Id, Limit: slotDropLimit})
		if err != nil {
			return err
		}
		if res.GetSlot().GetDone() {
			return nil
		}
	}
}
