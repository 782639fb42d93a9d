package rpc

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/e1158ecb/taskstore/api/limits"
	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/internal/serving"
)

// Request defaults and bounds that are not state machine limits.
const (
	DefaultLease = 30 * time.Second
	MaxWait      = 5 * time.Minute
)

// Server implements the TaskStore and Admin services on a node. It is safe
// for concurrent use.
type Server struct {
	taskstorepb.UnimplementedTaskStoreServer
	taskstorepb.UnimplementedAdminServer

	node *cluster.Node
	// shards serves the task API (a node's shards, or clienttest's).
	shards Shards
	limits fsm.Limits
	// maxResponse is the largest answer the node's gRPC server sends
	// (Limits.MaxResponseBytes): claims and transactions are bounded so that
	// a committed one can always be answered.
	maxResponse int
	health      *health.Server
	metrics     *apiMetrics
	rates       *introspection
	// produce bounds the Produce items in flight, per stream and across
	// the node's streams (SetProduceInflight).
	produce *taskstorepb.Inflight
	log     *slog.Logger
	// copyRefusal (tests only, export_test.go) runs before this node, as a
	// follower asked for a backup's copy, takes it; an error refuses.
	copyRefusal atomic.Pointer[func(context.Context) error]
}

// NewServer returns the services of node; reg (may be nil) receives the
// API counters.
func NewServer(node *cluster.Node, reg prometheus.Registerer, log *slog.Logger) *Server {
	srv := NewTaskStore(nodeShards{node}, reg, log)
	srv.node = node
	return srv
}

// SetLimits applies a node's limits: the largest answer its gRPC server
// sends and what a command may carry. Call it before the server is
// registered; zero fields take limits.DefaultServer's.
func (srv *Server) SetLimits(l limits.Server) {
	srv.maxResponse = l.WithDefaults().MaxResponseBytes
	srv.limits = l.Commands.WithDefaults()
}

// NewTaskStore returns a server of the task API (TaskStore) alone over
// shards: what client/clienttest runs in process. Its Admin methods and
// Register need a node; register it with taskstorepb.RegisterTaskStore.
func NewTaskStore(shards Shards, reg prometheus.Registerer, log *slog.Logger) *Server {
	return &Server{shards: shards, limits: fsm.DefaultLimits, maxResponse: taskstorepb.MaxResponseBytes, health: health.NewServer(), metrics: newAPIMetrics(reg),
		rates: newIntrospection(time.Now), log: log.With("component", "rpc"),
		produce: taskstorepb.NewInflight(DefaultProduceInflightPerStream, DefaultProduceInflight)}
}

// Defaults of the node's Produce in-flight bounds (SetProduceInflight): the
// proxy's, so that a proxy's stream to a node is held back at the node no
// sooner than the proxy holds back its own callers.
const (
	DefaultProduceInflightPerStream = 1024
	DefaultProduceInflight          = 8192
)

// SetProduceInflight bounds the Produce items in flight on one stream
// (perStream) and across all of the node's streams (total); <= 0 takes the
// default. At a bound a stream is read no further until one of its items
// is answered, so a client that streams faster than the shard commits is
// held back by the stream's flow control, not queued in the node's memory.
// Call it before the server serves.
func (srv *Server) SetProduceInflight(perStream, total int) {
	if perStream <= 0 {
		perStream = DefaultProduceInflightPerStream
	}
	if total <= 0 {
		total = DefaultProduceInflight
	}
	srv.produce = taskstorepb.NewInflight(perStream, total)
}

// Register adds TaskStore, Admin, the nodes' internal Peer service,
// grpc.health.v1 and reflection to s.
func (srv *Server) Register(s *grpc.Server) {
	taskstorepb.RegisterTaskStore(s, srv)
	taskstorepb.RegisterAdmin(s, srv)
	srv.node.RegisterPeer(s)
	healthpb.RegisterHealthServer(s, srv.health)
	reflection.Register(s)
}

// SetServing flips gRPC health for every service (NOT_SERVING while
// draining on shutdown).
func (srv *Server) SetServing(ok bool) { serving.SetServing(srv.health, ok) }

// Time implements TaskStore.Time.
func (srv *Server) Time(ctx context.Context, req *taskstorepb.TimeRequest) (*taskstorepb.TimeResponse, error) {
	return &taskstorepb.TimeResponse{Now: timestamppb.New(srv.shards.Clock())}, nil
}

// Status implements Admin.Status. A node that is leaving the cluster asks
// a member instead: its own map may be stale.
func (srv *Server) Status(ctx context.Context, req *taskstorepb.StatusRequest) (*taskstorepb.StatusResponse, error) {
	if req.ClockOnly {
		return &taskstorepb.StatusResponse{Node: srv.node.ID(), Now: timestamppb.New(srv.node.Clock())}, nil
	}
	if member, fctx, ok := srv.askMember(ctx, req.LocalOnly); ok {
		return member.Status(fctx, req)
	}
	return srv.node.Status(ctx, req.LocalOnly), nil
}

// Routing implements Admin.Routing; a leaving node asks a member.
func (srv *Server) Routing(ctx context.Context, req *taskstorepb.RoutingRequest) (*taskstorepb.RoutingResponse, error) {
	if member, fctx, ok := srv.askMember(ctx, false); ok {
		return member.Routing(fctx, req)
	}
	// Not the snapshot's table of a node that just started.
	if err := srv.node.AwaitMeta(ctx); err != nil {
		return nil, toStatus(err)
	}
	rt := srv.node.Routing()
	if len(rt.Slots) == 0 {
		return nil, toStatus(cluster.ErrNotReady)
	}
	return rt, nil
}

// TransferLeader implements Admin.TransferLeader.
func (srv *Server) TransferLeader(ctx context.Context, req *taskstorepb.TransferLeaderRequest) (*taskstorepb.TransferLeaderResponse, error) {
	leader, err := srv.node.TransferLeader(ctx, req.Shard, req.To)
	if err != nil {
		return nil, toStatus(err)
	}
	return &taskstorepb.TransferLeaderResponse{Leader: leader}, nil
}

func field(list string, i int, name string) string {
	f := list + "[" + strconv.Itoa(i) + "]"
	if name != "" {
		f += "." + name
	}
	return f
}

// queueShard readies cmd, a command about one queue, for its shard: the
// request id, the edge's validation, the shard of the queue's group, and,
// when minFormat > 0, the shard's state format (needFormat; what names the
// feature in the refusal).
func (srv *Server) queueShard(ctx context.Context, queue string, cmd *fsmpb.Command, rid *taskstorepb.RequestID, minFormat uint32, what string) (Shard, error) {
	requestID(cmd, rid)
	if err := fsm.Validate(cmd, srv.limits); err != nil {
		return nil, err
	}
	shard, err := srv.shards.ShardFor(taskstorepb.GroupOf(queue))
	if err != nil {
		return nil, err
	}
	if minFormat > 0 {
		if err := needFormat(ctx, shard, minFormat, what); err != nil {
			return nil, err
		}
	}
	return shard, nil
}

// proposeOn proposes cmd on shard; a command the state machine refused is
// a *refusedError.
func proposeOn(ctx context.Context, shard Shard, cmd *fsmpb.Command) (*fsmpb.Result, error) {
	res, err := shard.Propose(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if res.Failure != nil {
		return nil, &refusedError{failure: res.Failure}
	}
	return res, nil
}

// listedShards are the shards a listing reads: the one named, else those
// this node leads (or, stale, every local replica).
func (srv *Server) listedShards(id uint32, stale bool) ([]Shard, error) {
	if id != 0 {
		s, err := srv.readShard(id, "")
		if err != nil {
			return nil, err
		}
		return []Shard{s}, nil
	}
	var shards []Shard
	for _, s := range srv.shards.LocalShards() {
		if stale || s.IsLeader() {
			shards = append(shards, s)
		}
	}
	return shards, nil
}

// needFormat refuses what a shard below state format f cannot take yet:
// some replica's node runs a binary that would stop at it (mid-upgrade; the
// shard's leader raises the format once every replica's node applies it,
// cluster/DESIGN.md "State formats"). The leader's machine is read without
// a barrier: a format is never lowered, so a stale read only refuses what a
// retry a moment later accepts.
func needFormat(ctx context.Context, shard Shard, f uint32, what string) error {
	var have uint32
	if err := shard.Read(ctx, true, func(m *fsm.Machine) error { have = m.Format(); return nil }); err != nil {
		return err
	}
	if have < f {
		return &upgradingError{what: what, shard: shard.ID(), have: have, need: f}
	}
	return nil
}
