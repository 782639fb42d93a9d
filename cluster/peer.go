package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/cluster/peerpb"
	"github.com/e1158ecb/taskstore/fsm"
)

// Nodes decide promotion, leadership hand-off, replica agreement, their own
// removal and their clock's health from what their peers report. They ask
// through the internal Peer service (cluster/peerpb), not the public
// Admin.Status: the public answer is shaped for operators and may change,
// and node-to-node decisions should not move with it. A peer that does not
// serve Peer (an older version, mid-upgrade) is asked Admin.Status and its
// answer converted (reportFromStatus); that fallback can go once no
// supported version lacks Peer.

// RegisterPeer adds the Peer service of n to s. The node's gRPC server
// (rpc) calls it beside the public services.
func (n *Node) RegisterPeer(s grpc.ServiceRegistrar) {
	peerpb.RegisterPeerServer(s, &peerServer{n: n})
}

type peerServer struct {
	peerpb.UnimplementedPeerServer
	n *Node
}

func (p *peerServer) Report(context.Context, *peerpb.ReportRequest) (*peerpb.NodeReport, error) {
	return p.n.report(), nil
}

func (p *peerServer) WipeReplica(_ context.Context, req *peerpb.WipeReplicaRequest) (*peerpb.WipeReplicaResponse, error) {
	if req.Node != p.n.cfg.ID {
		return nil, status.Errorf(codes.FailedPrecondition, "this is node %s, not %s", p.n.cfg.ID, req.Node)
	}
	if err := p.n.WipeReplica(req.Shard); err != nil {
		// As rpc answers the public calls: a refusal is FailedPrecondition,
		// so the leader's caller (taskctl shard rebuild) sees ErrRefused.
		code := codes.Internal
		if errors.Is(err, ErrRefused) {
			code = codes.FailedPrecondition
		}
		return nil, status.Error(code, err.Error())
	}
	return &peerpb.WipeReplicaResponse{}, nil
}

func (p *peerServer) Clock(context.Context, *peerpb.ClockRequest) (*peerpb.ClockResponse, error) {
	return &peerpb.ClockResponse{Now: p.n.cfg.Clock().UnixNano()}, nil
}

// report describes this node and its replicas for a peer.
func (n *Node) report() *peerpb.NodeReport {
	cm := n.meta.Map()
	// The gossip address: the map's, else what gossip advertises (a
	// --gossip of ":7201" is no address to dial), else the flag.
	r := &peerpb.NodeReport{Node: n.cfg.ID, GossipAddress: n.cfg.GossipAddr, DiskLow: n.DiskLow(), MaxStateFormat: n.format.max()}
	if m, ok := n.gossip.snapshot()[n.cfg.ID]; ok && m.GossipAddress != "" {
		r.GossipAddress = m.GossipAddress
	}
	for _, node := range cm.GetNodes() {
		r.Members = append(r.Members, &peerpb.Member{Id: node.Id, State: node.Membership})
		if node.Id == n.cfg.ID && node.GossipAddress != "" {
			r.GossipAddress = node.GossipAddress
		}
	}
	for _, s := range n.LocalShards() {
		r.Replicas = append(r.Replicas, replicaReport(s.id, s.g.raft, n.cfg.ID, s.machine))
	}
	n.mu.RLock()
	for id := range n.diverged {
		if n.shards[id] == nil {
			r.Replicas = append(r.Replicas, &peerpb.Replica{Shard: id, Role: RoleDiverged, Diverged: true})
		}
	}
	n.mu.RUnlock()
	slices.SortFunc(r.Replicas, func(a, b *peerpb.Replica) int { return int(a.Shard) - int(b.Shard) })
	return r
}

// replicaReport reads one local replica's Raft state and checkpoints.
func replicaReport(id uint32, r *raft.Raft, self string, m *fsm.Machine) *peerpb.Replica {
	_, leader := r.LeaderWithID()
	rep := &peerpb.Replica{Shard: id, Leader: string(leader), Role: replicaRole(r, self), AppliedIndex: r.AppliedIndex()}
	cps, onDisk := peerCheckpoints(m)
	if onDisk {
		rep.DiskCheckpoints = cps
	} else {
		rep.Checkpoints = cps
	}
	return rep
}

// peerCheckpoints lists a replica's checkpoints for a peer, and whether
// they are of a state on disk (fsm.Checkpoint.OnDisk: a replica's are all
// of one kind, since a Restore clears them).
func peerCheckpoints(m *fsm.Machine) (_ []*peerpb.Checkpoint, onDisk bool) {
	var out []*peerpb.Checkpoint
	for _, cp := range m.Checkpoints() {
		out = append(out, &peerpb.Checkpoint{Index: cp.Index, Digest: cp.Digest[:]})
		onDisk = cp.OnDisk
	}
	return out, onDisk
}

// replicaRole names this replica's part in its Raft group, as Status shows
// it: leader, follower, candidate, nonvoter or shutdown.
func replicaRole(r *raft.Raft, self string) string {
	role := "follower"
	switch r.State() {
	case raft.Leader:
		role = "leader"
	case raft.Candidate:
		role = "candidate"
	case raft.Shutdown:
		role = "shutdown"
	}
	if f := r.GetConfiguration(); f.Error() == nil {
		for _, srv := range f.Configuration().Servers {
			if string(srv.ID) == self && srv.Suffrage == raft.Nonvoter {
				role = "nonvoter"
			}
		}
	}
	return role
}

// legacyPeerMemo is how long a peer that answered Peer with Unimplemented
// is asked the public calls directly, before Peer is tried again (it may
// have been upgraded).
const legacyPeerMemo = 5 * time.Minute

// peerClient asks the other nodes through Peer, falling back to
// Admin.Status for a node that does not serve it (an older version).
type peerClient struct {
	pool *connPool
	log  *slog.Logger
	// noPeer: peer address -> when it answered the Peer service with
	// Unimplemented (an older version); see legacy.
	noPeer sync.Map
}

// legacy reports whether addr answered Peer with Unimplemented lately.
func (c *peerClient) legacy(addr string) bool {
	v, ok := c.noPeer.Load(addr)
	return ok && time.Since(v.(time.Time)) < legacyPeerMemo
}

func (c *peerClient) noteLegacy(addr string, legacy bool) {
	if legacy {
		c.noPeer.Store(addr, time.Now())
	}
}

// report asks the node at addr for its report; nil if it does not answer.
func (c *peerClient) report(ctx context.Context, addr string) *peerpb.NodeReport {
	conn, err := c.pool.get(addr)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, legacy, err := fetchReport(ctx, conn, c.legacy(addr))
	c.noteLegacy(addr, legacy)
	if err != nil {
		c.log.Debug("peer report", "addr", addr, "err", err)
		return nil
	}
	return r
}

// clock asks the node at addr for its clock (Unix nanoseconds).
func (c *peerClient) clock(ctx context.Context, addr string) (int64, error) {
	conn, err := c.pool.get(addr)
	if err != nil {
		return 0, err
	}
	now, legacy, err := fetchClock(ctx, conn, c.legacy(addr))
	c.noteLegacy(addr, legacy)
	return now, err
}

// fetchReport asks Peer.Report, or Admin.Status of a node without Peer
// (legacy: known not to serve it). It says whether it had to fall back.
func fetchReport(ctx context.Context, conn grpc.ClientConnInterface, legacy bool) (*peerpb.NodeReport, bool, error) {
	if !legacy {
		r, err := peerpb.NewPeerClient(conn).Report(ctx, &peerpb.ReportRequest{})
		if status.Code(err) != codes.Unimplemented {
			return r, false, err
		}
	}
	st, err := taskstorepb.NewAdminClient(conn).Status(ctx, &taskstorepb.StatusRequest{LocalOnly: true})
	if err != nil {
		return nil, true, err
	}
	return reportFromStatus(st), true, nil
}

// fetchClock asks Peer.Clock, or Admin.Status of a node without Peer. The
// first sample of an older peer includes the refused call in its round
// trip; the memo (peerClient.legacy) keeps the rest to one call.
func fetchClock(ctx context.Context, conn grpc.ClientConnInterface, legacy bool) (int64, bool, error) {
	if !legacy {
		c, err := peerpb.NewPeerClient(conn).Clock(ctx, &peerpb.ClockRequest{})
		if status.Code(err) != codes.Unimplemented {
			return c.GetNow(), false, err
		}
	}
	st, err := taskstorepb.NewAdminClient(conn).Status(ctx, &taskstorepb.StatusRequest{ClockOnly: true})
	if err != nil {
		return 0, true, err
	}
	if st.GetNow() == nil {
		return 0, true, status.Error(codes.Unavailable, "the node's Status carries no clock")
	}
	return st.GetNow().AsTime().UnixNano(), true, nil
}

// wipeRemote tells node (at conn) to delete its diverged replica of shard:
// Peer.WipeReplica, or for a node without Peer the public RebuildReplica
// with wipe set and the forwarded mark, which is how older leaders asked.
func wipeRemote(ctx context.Context, conn grpc.ClientConnInterface, shard uint32, node string) error {
	_, err := peerpb.NewPeerClient(conn).WipeReplica(ctx, &peerpb.WipeReplicaRequest{Shard: shard, Node: node})
	if status.Code(err) != codes.Unimplemented {
		return err
	}
	ctx = metadata.AppendToOutgoingContext(ctx, ForwardedKey, "1")
	_, err = taskstorepb.NewAdminClient(conn).RebuildReplica(ctx, &taskstorepb.RebuildReplicaRequest{Shard: shard, Node: node, Wipe: true})
	return err
}

// reportFromStatus converts the public local-only Status of a node that
// does not serve Peer.
func reportFromStatus(st *taskstorepb.StatusResponse) *peerpb.NodeReport {
	if st == nil {
		return nil
	}
	r := &peerpb.NodeReport{Node: st.Node}
	for _, node := range st.Nodes {
		for state, name := range nodeStateNames {
			if node.State == name {
				r.Members = append(r.Members, &peerpb.Member{Id: node.Id, State: state})
			}
		}
		if node.Id == st.Node {
			r.GossipAddress, r.DiskLow = node.GossipAddress, node.DiskLow
		}
	}
	for _, ss := range st.Shards {
		for _, rs := range ss.ReplicaStatus {
			if rs.Node != st.Node {
				continue
			}
			rep := &peerpb.Replica{Shard: ss.Id, Leader: ss.Leader, Role: rs.Role, AppliedIndex: rs.AppliedIndex, Diverged: rs.Divergence != nil}
			for _, cp := range rs.Checkpoints {
				if cp.OnDisk {
					rep.DiskCheckpoints = append(rep.DiskCheckpoints, &peerpb.Checkpoint{Index: cp.Index, Digest: cp.Digest})
				} else {
					rep.Checkpoints = append(rep.Checkpoints, &peerpb.Checkpoint{Index: cp.Index, Digest: cp.Digest})
				}
			}
			r.Replicas = append(r.Replicas, rep)
		}
	}
	return r
}

// replicaOf returns the report's entry for a shard, or nil.
func replicaOf(r *peerpb.NodeReport, shard uint32) *peerpb.Replica {
	for _, rep := range r.GetReplicas() {
		if rep.Shard == shard {
			return rep
		}
	}
	return nil
}

// memberState returns how the report's node sees member id's state.
func memberState(r *peerpb.NodeReport, id string) (state metapb.NodeState, ok bool) {
	for _, m := range r.GetMembers() {
		if m.Id == id {
			return m.State, true
		}
	}
	return 0, false
}

// CatchUp waits until this node's replica of shard has applied what the
// replica at addr (the shard's leader) had applied when asked: a write
// made through the leader is then visible in this node's stale reads (the
// status page shows what its action did). It gives up with ctx, or at once
// when this node has no replica or the leader does not answer.
func (n *Node) CatchUp(ctx context.Context, shard uint32, addr string) error {
	s := n.Shard(shard)
	if s == nil {
		return fmt.Errorf("shard %d: %w", shard, ErrUnknownShard)
	}
	rep := replicaOf(n.peerc.report(ctx, addr), shard)
	if rep == nil {
		return fmt.Errorf("shard %d: no report from %s", shard, addr)
	}
	return waitApplied(ctx, n.stop, s.Raft().AppliedIndex, rep.AppliedIndex)
}
