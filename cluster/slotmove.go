package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/cluster/peerpb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// Slot moves. The meta leader's slot mover drives each move the
// meta map holds, one at a time, in id order, through the shards' logs
// (fsm/slots.go has the shard side):
//
//	COPYING   source FREEZE; target DROP (what an earlier attempt left),
//	          then IMPORT chunk 0, 1, ... of ExportSlot from the source;
//	          meta FLIP: the routing table names the target.
//	FLIPPED   target ACTIVATE; source DROP until empty; meta END.
//	ABORTING  target DROP until empty; source UNFREEZE; meta END.
//
// Every step is safe to repeat, so a new meta leader resumes a move from
// its phase (a copy starts over). A copy the shards refuse, or that cannot
// finish within MoveCopyTimeout, is abandoned (ABORTING): the slot is
// served where it was.

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

// MoveSlots records moves of slots to shard to (one per slot not already
// there) and returns them; the slot mover runs them. Only on the meta
// leader (else a NotLeaderError naming it). Every node must run a version
// that moves slots.
func (n *Node) MoveSlots(ctx context.Context, slots []uint32, to uint32) ([]*metapb.SlotMove, error) {
	if !n.metaReady.Load() {
		return nil, n.metaNotLeader()
	}
	cm := n.meta.Map()
	if sh := findShard(cm, to); sh == nil {
		return nil, &NotFoundError{What: "shard", Name: fmt.Sprint(to)}
	} else if sh.Retiring {
		return nil, fmt.Errorf("%w: shard %d is being removed: move slots to another shard", ErrRefused, to)
	}
	if len(slots) == 0 {
		return nil, fmt.Errorf("%w: name at least one slot", ErrInvalidRequest)
	}
	for _, s := range slots {
		if int(s) >= len(cm.Slots) {
			return nil, fmt.Errorf("%w: slot %d: the table has slots 0 to %d", ErrInvalidRequest, s, len(cm.Slots)-1)
		}
	}
	if err := n.everyNodeMovesSlots(ctx, cm); err != nil {
		return nil, err
	}
	// One entry records every move (a rebalance records hundreds).
	var out []*metapb.SlotMove
	cmd := &metapb.Command{Op: metapb.Op_OP_MOVE_BEGIN}
	for _, s := range slots {
		if mv := moveOfSlot(cm, s); mv != nil {
			if mv.To != to {
				return nil, fmt.Errorf("%w: slot %d is moving to shard %d already (move %d); wait for it to finish", ErrRefused, s, mv.To, mv.Id)
			}
			continue
		}
		if cm.Slots[s] != to {
			cmd.Moves = append(cmd.Moves, &metapb.SlotMove{Slot: s, From: cm.Slots[s], To: to, Begun: cm.Epoch})
		}
	}
	if len(cmd.Moves) > 0 {
		if err := n.proposeMeta(ctx, cmd); err != nil {
			return nil, err
		}
	}
	cm = n.meta.Map()
	for _, s := range slots {
		mv := moveOfSlot(cm, s)
		switch {
		case mv != nil && mv.To == to:
			out = append(out, mv)
		case mv == nil && cm.Slots[s] == to:
			// There already (or moved meanwhile).
		default:
			return out, fmt.Errorf("%w: the move of slot %d was not recorded (the map changed meanwhile); try again", ErrRefused, s)
		}
	}
	if len(cmd.Moves) > 0 {
		n.log.Info("slot moves recorded", "moves", len(cmd.Moves), "to", to, "first", out[0].Id)
	}
	n.wakeMover()
	return out, nil
}

// everyNodeMovesSlots refuses a move while a member node's binary does not
// know the move ops: its meta replica would stop at them.
func (n *Node) everyNodeMovesSlots(ctx context.Context, cm *metapb.ClusterMap) error {
	for _, node := range cm.Nodes {
		if node.Membership == NodeRemoved {
			continue
		}
		var f uint32
		if node.Id == n.cfg.ID {
			f = n.maxStateFormat()
		} else if r := n.askReport(ctx, node.Address); r != nil && r.Node == node.Id {
			f = r.MaxStateFormat
		} else {
			return fmt.Errorf("%w: node %s does not answer; every node must run a version that moves slots before a move starts", ErrRefused, node.Id)
		}
		if f < fsm.FormatSlotMoves {
			return fmt.Errorf("%w: node %s runs an older version (state format %d; moving slots needs %d): upgrade every node first", ErrRefused, node.Id, f, fsm.FormatSlotMoves)
		}
	}
	return nil
}

// stopContext is a context that ends after d or when the node stops,
// whichever is first: a stopping node must not wait on its chores.
func (n *Node) stopContext(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	go func() {
		select {
		case <-n.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// wakeMover makes the slot mover look at the map now.
func (n *Node) wakeMover() {
	select {
	case n.moverWake <- struct{}{}:
	default:
	}
}

// moversAtOnce bounds the moves driven at once: moves of different slots
// are independent, and their steps share the groups' Raft rounds.
const moversAtOnce = 32

// runSlotMoves is the meta leader's slot mover: it drives up to
// moversAtOnce moves at a time, each on its own goroutine, one phase per
// turn; when no move is under way it does the retiring shards' chores.
func (n *Node) runSlotMoves() {
	var (
		mu       sync.Mutex
		failing  = map[uint64]time.Time{} // move -> when its copy first failed
		inFlight = map[uint64]bool{}
		wg       sync.WaitGroup
	)
	defer wg.Wait()
	for {
		if n.metaReady.Load() {
			moves := n.meta.Map().Moves
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
					err := n.driveMove(mv, &mu, failing)
					if err != nil {
						n.log.Info("slot move waits", "move", mv.Id, "slot", mv.Slot, "from", mv.From, "to", mv.To,
							"phase", MovePhaseName(mv.Phase), "err", err)
						n.sleep(500 * time.Millisecond)
					}
					mu.Lock()
					delete(inFlight, mv.Id)
					mu.Unlock()
					n.wakeMover()
				}()
			}
			idle := len(inFlight) == 0
			mu.Unlock()
			if idle && len(moves) == 0 {
				ctx, cancel := n.stopContext(n.cfg.Tuning.ApplyTimeout)
				changed, err := n.ctl.RetiringWork(ctx)
				cancel()
				if err != nil {
					n.log.Info("shard removal waits", "err", err)
				}
				if changed {
					continue
				}
			}
		}
		select {
		case <-n.moverWake:
		case <-time.After(time.Second):
		case <-n.stop:
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

// driveMove takes a move one phase further.
func (n *Node) driveMove(mv *metapb.SlotMove, mu *sync.Mutex, failing map[uint64]time.Time) error {
	ctx, cancel := n.stopContext(2 * n.cfg.Tuning.ApplyTimeout)
	defer cancel()
	step := func(shard uint32, a fsmpb.SlotCommand_Action, to uint32) error {
		_, err := n.slotStep(ctx, shard, &fsmpb.SlotCommand{Action: a, Slot: mv.Slot, Slots: uint32(n.slotTable()), Move: mv.Id, To: to})
		return err
	}
	switch mv.Phase {
	case metapb.SlotMove_COPYING:
		start := time.Now()
		if err := n.copySlot(ctx, mv); err != nil {
			var refused *slotRefused
			mu.Lock()
			first, ok := failing[mv.Id]
			if !ok {
				failing[mv.Id] = time.Now()
			}
			mu.Unlock()
			if ok && time.Since(first) > MoveCopyTimeout {
				err = fmt.Errorf("the copy kept failing for %s: %w", time.Since(first).Round(time.Second), err)
				refused = &slotRefused{}
			}
			if errors.As(err, &refused) {
				n.log.Warn("slot move abandoned: the slot stays where it was", "move", mv.Id, "slot", mv.Slot, "from", mv.From, "to", mv.To, "err", err)
				return n.proposeMeta(ctx, &metapb.Command{Op: metapb.Op_OP_MOVE_ABORT, Move: &metapb.SlotMove{Id: mv.Id, Error: err.Error()}})
			}
			return err
		}
		mu.Lock()
		delete(failing, mv.Id)
		mu.Unlock()
		if err := n.proposeMeta(ctx, &metapb.Command{Op: metapb.Op_OP_MOVE_FLIP, Move: &metapb.SlotMove{Id: mv.Id}}); err != nil {
			return err
		}
		n.log.Info("slot moved: the routing table names its new shard", "move", mv.Id, "slot", mv.Slot, "from", mv.From, "to", mv.To,
			"copy", time.Since(start).Round(time.Millisecond))
		return nil
	case metapb.SlotMove_FLIPPED:
		if err := step(mv.To, fsmpb.SlotCommand_ACTIVATE, 0); err != nil {
			return err
		}
		if err := n.dropSlot(ctx, mv.From, mv); err != nil {
			return err
		}
	case metapb.SlotMove_ABORTING:
		if err := n.dropSlot(ctx, mv.To, mv); err != nil {
			return err
		}
		if err := step(mv.From, fsmpb.SlotCommand_UNFREEZE, 0); err != nil {
			return err
		}
	}
	if err := n.proposeMeta(ctx, &metapb.Command{Op: metapb.Op_OP_MOVE_END, Move: &metapb.SlotMove{Id: mv.Id}}); err != nil {
		return err
	}
	outcome := "done"
	if mv.Phase == metapb.SlotMove_ABORTING {
		outcome = "aborted"
	}
	n.metrics.movesFinished.WithLabelValues(outcome).Inc()
	n.log.Info("slot move finished", "move", mv.Id, "slot", mv.Slot, "from", mv.From, "to", mv.To, "outcome", outcome)
	return nil
}

// SlotTable is a copy of the routing table's slots (slot -> shard).
func (n *Node) SlotTable() []uint32 { return n.meta.SlotTable() }

// slotTable is the size of the slot table.
func (n *Node) slotTable() int {
	if s := len(n.meta.Map().Slots); s > 0 {
		return s
	}
	return taskstorepb.DefaultSlots
}

// copySlot freezes the slot on the source and copies it to the target.
func (n *Node) copySlot(ctx context.Context, mv *metapb.SlotMove) error {
	slots := uint32(n.slotTable())
	if _, err := n.slotStep(ctx, mv.From, &fsmpb.SlotCommand{Action: fsmpb.SlotCommand_FREEZE, Slot: mv.Slot, Slots: slots, Move: mv.Id, To: mv.To}); err != nil {
		return err
	}
	if err := n.dropSlot(ctx, mv.To, mv); err != nil { // an earlier attempt's part
		return err
	}
	var cur fsm.SlotCursor
	tasks := 0
	for chunk := uint32(0); ; chunk++ {
		ch, err := n.exportSlot(ctx, mv.From, mv, cur)
		if err != nil {
			return err
		}
		c := &fsmpb.SlotCommand{Action: fsmpb.SlotCommand_IMPORT, Slot: mv.Slot, Slots: slots, Move: mv.Id, Chunk: chunk, Records: ch.records}
		if _, err := n.slotStep(ctx, mv.To, c); err != nil {
			return err
		}
		tasks += ch.tasks
		if ch.done {
			n.log.Debug("slot copied", "move", mv.Id, "slot", mv.Slot, "tasks", tasks, "chunks", chunk+1)
			return nil
		}
		cur = ch.next
	}
}

// dropSlot deletes the move's slot from a shard, a bounded number of tasks
// per entry.
func (n *Node) dropSlot(ctx context.Context, shard uint32, mv *metapb.SlotMove) error {
	for {
		res, err := n.slotStep(ctx, shard, &fsmpb.SlotCommand{Action: fsmpb.SlotCommand_DROP, Slot: mv.Slot, Slots: uint32(n.slotTable()),
			Move: mv.Id, Limit: slotDropLimit})
		if err != nil {
			return err
		}
		if res.GetSlot().GetDone() {
			return nil
		}
	}
}

// slotStep proposes one OP_SLOT step on the shard's leader and returns its
// result; a refusal is a *slotRefused.
func (n *Node) slotStep(ctx context.Context, shard uint32, c *fsmpb.SlotCommand) (*fsmpb.Result, error) {
	cmd := &fsmpb.Command{Op: fsmpb.Op_OP_SLOT, Slot: c}
	data, err := fsm.EncodeCommand(cmd)
	if err != nil {
		return nil, err
	}
	req := &peerpb.SlotStepRequest{Shard: shard, Command: data}
	r, err := onLeader(ctx, n, shard,
		func() (*peerpb.SlotStepResponse, error) { return n.slotStepHere(ctx, req) },
		func(ctx context.Context, pc peerpb.PeerClient) (*peerpb.SlotStepResponse, error) {
			return pc.SlotStep(ctx, req)
		})
	var res *fsmpb.Result
	if err == nil {
		res = &fsmpb.Result{}
		err = proto.Unmarshal(r.Result, res)
	}
	if err != nil {
		return nil, err
	}
	if f := res.GetFailure(); f != nil {
		if fsm.KindOf(f) == fsmpb.Failure_SLOT_NEEDS_FORMAT {
			// A shard added a moment ago: its leader raises the format
			// within Tuning.FormatEvery.
			return nil, fmt.Errorf("shard %d: %s: waiting for its leader to raise it", shard, f.Message)
		}
		return nil, &slotRefused{shard: shard, msg: f.Message}
	}
	return res, nil
}

// exportChunk is one chunk of a frozen slot, as read from its shard.
type exportChunk struct {
	records []*fsmpb.SnapshotRecord
	tasks   int
	done    bool
	next    fsm.SlotCursor
}

// exportSlot reads a chunk of the frozen slot from the source's leader.
func (n *Node) exportSlot(ctx context.Context, shard uint32, mv *metapb.SlotMove, cur fsm.SlotCursor) (*exportChunk, error) {
	req := &peerpb.ExportSlotRequest{Shard: shard, Slot: mv.Slot, Slots: uint32(n.slotTable()), Move: mv.Id,
		Phase: int32(cur.Phase), Queue: cur.Queue, Id: cur.ID, MaxBytes: slotChunkBytes}
	r, err := onLeader(ctx, n, shard,
		func() (*peerpb.ExportSlotResponse, error) { return n.exportSlotHere(req) },
		func(ctx context.Context, pc peerpb.PeerClient) (*peerpb.ExportSlotResponse, error) {
			return pc.ExportSlot(ctx, req)
		})
	if err != nil {
		return nil, err
	}
	c := &fsmpb.SlotCommand{}
	if err := proto.Unmarshal(r.Records, c); err != nil {
		return nil, err
	}
	return &exportChunk{records: c.Records, tasks: int(r.Tasks), done: r.Done,
		next: fsm.SlotCursor{Phase: int(r.Phase), Queue: r.Queue, ID: r.Id}}, nil
}

// onShardLeader runs call against the node that leads shard: the replicas
// in turn (the preferred leader first), following the leader a node names.
// call reports whether the node said it does not lead, and whom it names.
func (n *Node) onShardLeader(ctx context.Context, shard uint32, call func(ctx context.Context, addr string) (notLeader bool, hint string, err error)) error {
	cm := n.meta.Map()
	sh := findShard(cm, shard)
	if sh == nil {
		return &NotFoundError{What: "shard", Name: fmt.Sprint(shard)}
	}
	var addrs []string
	if s := n.Shard(shard); s != nil && s.IsLeader() {
		addrs = append(addrs, n.addr)
	}
	for _, r := range append([]string{sh.PreferredLeader}, sh.Replicas...) {
		if node := findNode(cm, r); node != nil && node.Address != "" && !slices.Contains(addrs, node.Address) {
			addrs = append(addrs, node.Address)
		}
	}
	var lastErr error = &NotLeaderError{Shard: shard}
	hint := ""
	for tries := 0; tries < len(addrs)+3 && ctx.Err() == nil; tries++ {
		addr := hint
		hint = ""
		if addr == "" {
			if len(addrs) == 0 {
				break
			}
			addr, addrs = addrs[0], addrs[1:]
		}
		notLeader, h, err := call(ctx, addr)
		switch {
		case err != nil:
			lastErr = fmt.Errorf("%s: %w", addr, err)
		case notLeader:
			hint = h
		default:
			return nil
		}
	}
	return fmt.Errorf("shard %d: no leader took the step: %w", shard, lastErr)
}

// leaderAnswer is a Peer answer that says when the node does not lead.
type leaderAnswer interface {
	GetNotLeader() bool
	GetLeaderAddress() string
}

// onLeader makes a Peer call at the node leading shard (onShardLeader):
// here (this node's own handler) or over gRPC there.
func onLeader[R leaderAnswer](ctx context.Context, n *Node, shard uint32, here func() (R, error),
	there func(context.Context, peerpb.PeerClient) (R, error)) (R, error) {
	var out R
	err := n.onShardLeader(ctx, shard, func(ctx context.Context, addr string) (bool, string, error) {
		var r R
		var err error
		if addr == n.addr {
			r, err = here()
		} else {
			conn, cerr := n.peers.get(addr)
			if cerr != nil {
				return false, "", cerr
			}
			r, err = there(ctx, peerpb.NewPeerClient(conn))
		}
		if err != nil {
			return false, "", err
		}
		if r.GetNotLeader() {
			return true, r.GetLeaderAddress(), nil
		}
		out = r
		return false, "", nil
	})
	return out, err
}

// slotStepHere serves Peer.SlotStep: the step on a shard this node leads.
func (n *Node) slotStepHere(ctx context.Context, req *peerpb.SlotStepRequest) (*peerpb.SlotStepResponse, error) {
	cmd, err := fsm.DecodeCommand(req.Command)
	if err != nil || cmd.Op != fsmpb.Op_OP_SLOT || cmd.Slot == nil {
		return nil, status.Errorf(codes.InvalidArgument, "not a slot step: %v", err)
	}
	s := n.Shard(req.Shard)
	if s == nil || !s.IsLeader() {
		return notLeaderStep(s), nil
	}
	res, err := s.Propose(ctx, cmd)
	var nl *NotLeaderError
	if errors.As(err, &nl) {
		return &peerpb.SlotStepResponse{NotLeader: true, LeaderAddress: nl.LeaderAddress}, nil
	}
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	data, err := proto.Marshal(res)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &peerpb.SlotStepResponse{Result: data}, nil
}

func notLeaderStep(s *Shard) *peerpb.SlotStepResponse {
	r := &peerpb.SlotStepResponse{NotLeader: true}
	if s != nil {
		addr, _ := s.g.raft.LeaderWithID()
		r.LeaderAddress = string(addr)
	}
	return r
}

// exportSlotHere serves Peer.ExportSlot: a chunk of a slot frozen on a
// shard this node leads (its state stopped changing at the freeze, so any
// replica that applied it could answer; the leader has).
func (n *Node) exportSlotHere(req *peerpb.ExportSlotRequest) (*peerpb.ExportSlotResponse, error) {
	s := n.Shard(req.Shard)
	if s == nil || !s.IsLeader() {
		nl := notLeaderStep(s)
		return &peerpb.ExportSlotResponse{NotLeader: true, LeaderAddress: nl.LeaderAddress}, nil
	}
	max := int(req.MaxBytes)
	if max <= 0 || max > slotChunkBytes {
		max = slotChunkBytes
	}
	ch, err := s.machine.ExportSlot(req.Slot, req.Slots, req.Move, fsm.SlotCursor{Phase: int(req.Phase), Queue: req.Queue, ID: req.Id}, max)
	if errors.Is(err, fsm.ErrSlotNotFrozen) {
		return nil, status.Errorf(codes.FailedPrecondition, "shard %d: slot %d: %v (not applied here yet?)", req.Shard, req.Slot, err)
	}
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	data, err := proto.Marshal(&fsmpb.SlotCommand{Records: ch.Records})
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &peerpb.ExportSlotResponse{Records: data, Tasks: uint32(ch.Tasks), Done: ch.Done,
		Phase: int32(ch.Next.Phase), Queue: ch.Next.Queue, Id: ch.Next.ID}, nil
}

// SlotStep implements peerpb.PeerServer.
func (p *peerServer) SlotStep(ctx context.Context, req *peerpb.SlotStepRequest) (*peerpb.SlotStepResponse, error) {
	return p.n.slotStepHere(ctx, req)
}

// ExportSlot implements peerpb.PeerServer.
func (p *peerServer) ExportSlot(_ context.Context, req *peerpb.ExportSlotRequest) (*peerpb.ExportSlotResponse, error) {
	return p.n.exportSlotHere(req)
}
