package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/cluster/peerpb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// shardLeaders makes Peer calls at the node that leads a shard: this node
// through its own handler, another over gRPC. The slot mover and the
// control plane's slot loads reach the shards through it.
type shardLeaders struct {
	meta  *metaFSM
	addr  string // this node's
	local func(id uint32) *Shard
	peers *connPool
}

func (n *Node) shardLeaders() shardLeaders {
	return shardLeaders{meta: n.meta, addr: n.addr, local: n.Shard, peers: n.peers}
}

// on runs call against the node that leads shard: the replicas in turn
// (the preferred leader first), following the leader a node names. call
// reports whether the node said it does not lead, and whom it names.
func (l shardLeaders) on(ctx context.Context, shard uint32, call func(ctx context.Context, addr string) (notLeader bool, hint string, err error)) error {
	cm := l.meta.Map()
	sh := control.FindShard(cm, shard)
	if sh == nil {
		return &NotFoundError{What: "shard", Name: fmt.Sprint(shard)}
	}
	var addrs []string
	if s := l.local(shard); s != nil && s.IsLeader() {
		addrs = append(addrs, l.addr)
	}
	for _, r := range append([]string{sh.PreferredLeader}, sh.Replicas...) {
		if node := control.FindNode(cm, r); node != nil && node.Address != "" && !slices.Contains(addrs, node.Address) {
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

// onLeader makes a Peer call at the node leading shard (shardLeaders.on):
// here (this node's own handler, given the local replica) or over gRPC
// there.
func onLeader[R leaderAnswer](ctx context.Context, l shardLeaders, shard uint32, here func(*Shard) (R, error),
	there func(context.Context, peerpb.PeerClient) (R, error)) (R, error) {
	var out R
	err := l.on(ctx, shard, func(ctx context.Context, addr string) (bool, string, error) {
		var r R
		var err error
		if addr == l.addr {
			r, err = here(l.local(shard))
		} else {
			conn, cerr := l.peers.get(addr)
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

// slotStep proposes one OP_SLOT step on the shard's leader and returns its
// result; a refusal is a *slotRefused.
func (l shardLeaders) slotStep(ctx context.Context, shard uint32, c *fsmpb.SlotCommand) (*fsmpb.Result, error) {
	cmd := &fsmpb.Command{Op: fsmpb.Op_OP_SLOT, Slot: c}
	data, err := fsm.EncodeCommand(cmd)
	if err != nil {
		return nil, err
	}
	req := &peerpb.SlotStepRequest{Shard: shard, Command: data}
	r, err := onLeader(ctx, l, shard,
		func(s *Shard) (*peerpb.SlotStepResponse, error) { return slotStepOn(ctx, s, req) },
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
func (l shardLeaders) exportSlot(ctx context.Context, shard uint32, mv *metapb.SlotMove, slots uint32, cur fsm.SlotCursor) (*exportChunk, error) {
	req := &peerpb.ExportSlotRequest{Shard: shard, Slot: mv.Slot, Slots: slots, Move: mv.Id,
		Phase: int32(cur.Phase), Queue: cur.Queue, Id: cur.ID, MaxBytes: slotChunkBytes}
	r, err := onLeader(ctx, l, shard,
		func(s *Shard) (*peerpb.ExportSlotResponse, error) { return exportSlotOn(s, req) },
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

// slotLoad asks each shard's leader how many tasks its slots hold; a shard
// that does not answer is left out (the plan then balances by count).
func (l shardLeaders) slotLoad(ctx context.Context, cm *metapb.ClusterMap) map[uint32]uint64 {
	out := map[uint32]uint64{}
	for _, sh := range cm.Shards {
		req := &peerpb.SlotLoadRequest{Shard: sh.Id}
		r, err := onLeader(ctx, l, sh.Id,
			func(s *Shard) (*peerpb.SlotLoadResponse, error) { return slotLoadOn(s, slotCount(cm)) },
			func(ctx context.Context, pc peerpb.PeerClient) (*peerpb.SlotLoadResponse, error) {
				return pc.SlotLoad(ctx, req)
			})
		if err != nil {
			continue
		}
		for s, t := range r.Tasks {
			if int(s) < len(cm.Slots) && cm.Slots[s] == sh.Id {
				out[s] = t
			}
		}
	}
	return out
}

// slotStepOn serves Peer.SlotStep: the step on a shard this node leads
// (s: the local replica, or nil).
func slotStepOn(ctx context.Context, s *Shard, req *peerpb.SlotStepRequest) (*peerpb.SlotStepResponse, error) {
	cmd, err := fsm.DecodeCommand(req.Command)
	if err != nil || cmd.Op != fsmpb.Op_OP_SLOT || cmd.Slot == nil {
		return nil, status.Errorf(codes.InvalidArgument, "not a slot step: %v", err)
	}
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

// exportSlotOn serves Peer.ExportSlot: a chunk of a slot frozen on a shard
// this node leads (its state stopped changing at the freeze, so any
// replica that applied it could answer; the leader has).
func exportSlotOn(s *Shard, req *peerpb.ExportSlotRequest) (*peerpb.ExportSlotResponse, error) {
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

// slotLoadOn serves Peer.SlotLoad: the tasks of each slot of a shard this
// node leads, under a table of slots slots.
func slotLoadOn(s *Shard, slots uint32) (*peerpb.SlotLoadResponse, error) {
	if s == nil || !s.IsLeader() {
		nl := notLeaderStep(s)
		return &peerpb.SlotLoadResponse{NotLeader: true, LeaderAddress: nl.LeaderAddress}, nil
	}
	out := &peerpb.SlotLoadResponse{Tasks: map[uint32]uint64{}}
	for slot, t := range s.machine.SlotTasks(slots) {
		out.Tasks[slot] = uint64(t)
	}
	return out, nil
}

// SlotStep implements peerpb.PeerServer.
func (p *peerServer) SlotStep(ctx context.Context, req *peerpb.SlotStepRequest) (*peerpb.SlotStepResponse, error) {
	return slotStepOn(ctx, p.n.Shard(req.Shard), req)
}

// ExportSlot implements peerpb.PeerServer.
func (p *peerServer) ExportSlot(_ context.Context, req *peerpb.ExportSlotRequest) (*peerpb.ExportSlotResponse, error) {
	return exportSlotOn(p.n.Shard(req.Shard), req)
}

// SlotLoad implements peerpb.PeerServer.
func (p *peerServer) SlotLoad(_ context.Context, req *peerpb.SlotLoadRequest) (*peerpb.SlotLoadResponse, error) {
	if req.Shard == MetaGroupID {
		return nil, status.Error(codes.InvalidArgument, "the meta group holds no slots")
	}
	return slotLoadOn(p.n.Shard(req.Shard), slotCount(p.n.meta.Map()))
}
