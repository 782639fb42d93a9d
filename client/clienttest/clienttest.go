// Package clienttest runs a fake Taskstore cluster in process, for tests of
// code that uses the client package (the client itself, taskctl). Every node
// is a real gRPC server on a loopback port. Its TaskStore service is the
// node's own (rpc.NewTaskStore) over one real state machine (fsm.Machine)
// per shard, shared by all nodes, so requests are checked, translated,
// applied and answered by the same code as on a node: versions, refusals
// with every offending reference, exactly-once request ids, claim order,
// leases, keys, waiting claims, a Modify's claim. What is fake is the
// cluster around it: there is no Raft and no durability, every shard is on
// every node, and the test chooses each shard's leader. Nodes that do not
// lead a shard answer like real nodes: Unavailable with a NotLeader detail
// naming the leader. Admin (Status, Routing, TransferLeader) is simulated.
// Hooks inject failures before or after a request is applied.
package clienttest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/rpc"
)

// Slots is the size of the fake's hash-slot table; slot i belongs to shard
// i%shards + 1.
const Slots = 64

// Phase says when a Hook runs: before the request is handled, or after it
// was applied (an error then replaces the response: the outcome is unknown to
// the client).
type Phase int

const (
	Before Phase = iota
	After
)

// Hook sees every request a node receives; a non-nil error is returned to
// the client instead of handling it (Before) or instead of the response
// (After).
type Hook func(node, method string, req proto.Message, phase Phase) error

// Call is one request a node received.
type Call struct {
	Node   string
	Method string
	Req    proto.Message
}

// Cluster is a fake cluster. Its methods are safe for concurrent use.
type Cluster struct {
	mu     sync.Mutex // guards everything below but the machines
	nodes  []*Node
	slots  []uint32
	shards map[uint32]*shard
	epoch  uint64
	hook   Hook
	calls  []Call
}

// Node is one fake node.
type Node struct {
	ID   string
	Addr string
	c    *Cluster
	srv  *grpc.Server
}

// shard is one shard's state: a real state machine and the fake's choice
// of leader.
type shard struct {
	id       uint32
	leader   string
	replicas []string
	term     uint64

	applyMu sync.Mutex // orders proposals: one log index each
	index   uint64
	m       *fsm.Machine
}

// New starts a cluster of n nodes (n1..nN) and the given number of shards,
// every shard replicated on every node, shard i led by node (i-1)%n+1. It
// stops when the test ends.
func New(t testing.TB, nodes, shards int) *Cluster {
	t.Helper()
	c := &Cluster{shards: make(map[uint32]*shard), epoch: 1}
	for i := range Slots {
		c.slots = append(c.slots, uint32(i%shards+1))
	}
	var ids []string
	for i := 1; i <= nodes; i++ {
		ids = append(ids, "n"+strconv.Itoa(i))
	}
	for i := 1; i <= shards; i++ {
		m := fsm.New(fsm.Options{})
		// A cluster whose nodes all run this version raises its shards to
		// the newest state format within seconds of starting.
		m.ApplyCommand(1, fsm.SetFormatCommand(fsm.MaxFormat))
		c.shards[uint32(i)] = &shard{id: uint32(i), leader: ids[(i-1)%nodes], replicas: ids, term: 1, m: m}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, id := range ids {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n := &Node{ID: id, Addr: lis.Addr().String(), c: c}
		n.srv = grpc.NewServer(grpc.ChainUnaryInterceptor(n.intercept))
		taskstorepb.RegisterTaskStore(n.srv, rpc.NewTaskStore(nodeShards{n}, nil, log))
		taskstorepb.RegisterAdminServer(n.srv, &admin{n: n})
		go n.srv.Serve(lis)
		c.nodes = append(c.nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.srv.Stop()
		}
	})
	return c
}

// Addrs returns the nodes' addresses, comma-separated.
func (c *Cluster) Addrs() string {
	var a []string
	for _, n := range c.nodes {
		a = append(a, n.Addr)
	}
	return strings.Join(a, ",")
}

// Nodes returns the nodes.
func (c *Cluster) Nodes() []*Node { return slices.Clone(c.nodes) }

// Node returns the node with id, or nil.
func (c *Cluster) Node(id string) *Node {
	for _, n := range c.nodes {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// Stop stops the node's server: connections to it fail.
func (n *Node) Stop() { n.srv.Stop() }

// ShardOf returns the shard that owns queue's consistency group.
func (c *Cluster) ShardOf(queue string) uint32 {
	return c.slots[taskstorepb.SlotOf(taskstorepb.GroupOf(queue), Slots)]
}

// Leader returns the id of the node that leads shard ("" for none).
func (c *Cluster) Leader(shard uint32) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shards[shard].leader
}

// SetLeader makes node lead shard; "" leaves the shard without a leader
// (every node answers NotLeader without an address).
func (c *Cluster) SetLeader(shard uint32, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.shards[shard]
	s.leader = node
	s.term++
}

// SetHook installs h (nil removes it).
func (c *Cluster) SetHook(h Hook) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hook = h
}

// Calls returns every request received so far.
func (c *Cluster) Calls() []Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

// CallsTo returns the requests of one method, in order.
func (c *Cluster) CallsTo(method string) []Call {
	var out []Call
	for _, call := range c.Calls() {
		if call.Method == method {
			out = append(out, call)
		}
	}
	return out
}

// Task returns a copy of the task with id, from any shard, or nil.
func (c *Cluster) Task(id string) *taskstorepb.Task {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.shards {
		if ts := s.m.Get([]string{id}); len(ts) > 0 {
			return rpc.TaskToAPI(ts[0])
		}
	}
	return nil
}

// Count returns how many tasks the cluster holds.
func (c *Cluster) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.shards {
		n += s.m.TaskCount()
	}
	return n
}

func (c *Cluster) addr(node string) string {
	if n := c.Node(node); n != nil {
		return n.Addr
	}
	return ""
}

// intercept records every call and runs the hook around it.
func (n *Node) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
	msg, _ := req.(proto.Message)
	c := n.c
	c.mu.Lock()
	if msg != nil {
		c.calls = append(c.calls, Call{Node: n.ID, Method: method, Req: proto.Clone(msg)})
	}
	hook := c.hook
	c.mu.Unlock()
	if hook != nil {
		if err := hook(n.ID, method, msg, Before); err != nil {
			return nil, err
		}
	}
	resp, err := handler(ctx, req)
	if err != nil {
		return nil, err
	}
	if hook != nil {
		if err := hook(n.ID, method, msg, After); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// NotLeader returns the error a node gives for a shard it does not lead.
func NotLeader(shard uint32, leaderID, leaderAddr string) error {
	st := status.New(codes.Unavailable, fmt.Sprintf("shard %d: not the leader", shard))
	st, _ = st.WithDetails(&taskstorepb.NotLeader{Shard: shard, LeaderId: leaderID, LeaderAddress: leaderAddr})
	return st.Err()
}

// nodeShards is one node's view of the shards, for its TaskStore service.
type nodeShards struct{ n *Node }

func (ns nodeShards) ShardFor(group string) (rpc.Shard, error) {
	return ns.ShardByID(ns.n.c.slots[taskstorepb.SlotOf(group, Slots)])
}

func (ns nodeShards) ShardByID(id uint32) (rpc.Shard, error) {
	ns.n.c.mu.Lock()
	defer ns.n.c.mu.Unlock()
	sh := ns.n.c.shards[id]
	if sh == nil {
		return nil, fmt.Errorf("%w: %d", cluster.ErrUnknownShard, id)
	}
	return nodeShard{ns.n, sh}, nil
}

func (ns nodeShards) LocalShards() []rpc.Shard {
	c := ns.n.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []rpc.Shard
	for id := uint32(1); int(id) <= len(c.shards); id++ {
		out = append(out, nodeShard{ns.n, c.shards[id]})
	}
	return out
}

func (ns nodeShards) Clock() time.Time { return time.Now() }

// nodeShard is one shard as one node serves it.
type nodeShard struct {
	n  *Node
	sh *shard
}

func (s nodeShard) ID() uint32 { return s.sh.id }

// Now is the wall clock, never behind the machine's clock.
func (s nodeShard) Now() int64 { return max(time.Now().UnixNano(), s.sh.m.Clock()) }

func (s nodeShard) IsLeader() bool { return s.leads() == nil }

// leads is nil if the node leads the shard, else the NotLeader error.
func (s nodeShard) leads() error {
	c := s.n.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.sh.leader == s.n.ID {
		return nil
	}
	return &cluster.NotLeaderError{Shard: s.sh.id, LeaderID: s.sh.leader, LeaderAddress: c.addr(s.sh.leader)}
}

// Propose applies cmd at the next log index, as a committed entry would.
func (s nodeShard) Propose(ctx context.Context, cmd *fsmpb.Command) (*fsmpb.Result, error) {
	if err := s.leads(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.sh.applyMu.Lock()
	defer s.sh.applyMu.Unlock()
	cmd.Now = s.Now()
	s.sh.index++
	return s.sh.m.ApplyCommand(s.sh.index, cmd), nil
}

// Claim proposes the claim until it takes a task or wait ends.
func (s nodeShard) Claim(ctx context.Context, cmd *fsmpb.Command, wait time.Duration) (*fsmpb.Result, error) {
	end := time.Now().Add(wait)
	for {
		res, err := s.Propose(ctx, proto.Clone(cmd).(*fsmpb.Command))
		if err != nil || res.Failure != nil || len(res.GetClaim().GetTasks()) > 0 || !time.Now().Before(end) {
			return res, err
		}
		select {
		case <-ctx.Done():
			return res, nil // as a node: a wait cut short claimed nothing
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Read runs fn on the machine; unless stale, only on the leader.
func (s nodeShard) Read(ctx context.Context, stale bool, fn func(*fsm.Machine) error) error {
	if !stale {
		if err := s.leads(); err != nil {
			return err
		}
	}
	return fn(s.sh.m)
}

// admin serves the simulated Admin service of one node.
type admin struct {
	taskstorepb.UnimplementedAdminServer
	n *Node
}

// leadLocked returns the shard if this node leads it, or the NotLeader error.
func (s *admin) leadLocked(id uint32) (*shard, error) {
	sh := s.n.c.shards[id]
	if sh == nil {
		return nil, status.Errorf(codes.NotFound, "shard %d not found", id)
	}
	if sh.leader != s.n.ID {
		return nil, NotLeader(id, sh.leader, s.n.c.addr(sh.leader))
	}
	return sh, nil
}

func (s *admin) Status(ctx context.Context, req *taskstorepb.StatusRequest) (*taskstorepb.StatusResponse, error) {
	c := s.n.c
	c.mu.Lock()
	defer c.mu.Unlock()
	out := &taskstorepb.StatusResponse{Node: s.n.ID}
	ids := slices.Sorted(func(yield func(uint32) bool) {
		for id := range c.shards {
			if !yield(id) {
				return
			}
		}
	})
	for _, n := range c.nodes {
		ns := &taskstorepb.NodeStatus{Id: n.ID, Address: n.Addr, State: "member", Health: "alive"}
		for _, id := range ids {
			sh := c.shards[id]
			if slices.Contains(sh.replicas, n.ID) {
				ns.Shards = append(ns.Shards, id)
			}
			if sh.leader == n.ID {
				ns.Leads = append(ns.Leads, id)
			}
		}
		out.Nodes = append(out.Nodes, ns)
	}
	for _, id := range ids {
		sh := c.shards[id]
		ss := &taskstorepb.ShardStatus{Id: id, Leader: sh.leader, Term: sh.term, Replicas: slices.Clone(sh.replicas)}
		for _, r := range sh.replicas {
			role := "follower"
			if r == sh.leader {
				role = "leader"
			}
			idx := uint64(10 + sh.m.TaskCount())
			ss.ReplicaStatus = append(ss.ReplicaStatus, &taskstorepb.ReplicaStatus{Node: r, Role: role,
				CommitIndex: idx, AppliedIndex: idx, LastIndex: idx})
		}
		for _, owner := range c.slots {
			if owner == id {
				ss.Slots++
			}
		}
		out.Shards = append(out.Shards, ss)
	}
	return out, nil
}

func (s *admin) Routing(ctx context.Context, req *taskstorepb.RoutingRequest) (*taskstorepb.RoutingResponse, error) {
	c := s.n.c
	c.mu.Lock()
	defer c.mu.Unlock()
	out := &taskstorepb.RoutingResponse{Slots: slices.Clone(c.slots), Epoch: c.epoch}
	for id := uint32(1); int(id) <= len(c.shards); id++ {
		sh := c.shards[id]
		sr := &taskstorepb.ShardRoute{Id: id, LeaderId: sh.leader}
		for _, r := range sh.replicas {
			sr.Replicas = append(sr.Replicas, &taskstorepb.Replica{Id: r, Address: c.addr(r)})
		}
		sr.LeaderAddress = c.addr(sh.leader)
		out.Shards = append(out.Shards, sr)
	}
	return out, nil
}

func (s *admin) TransferLeader(ctx context.Context, req *taskstorepb.TransferLeaderRequest) (*taskstorepb.TransferLeaderResponse, error) {
	c := s.n.c
	c.mu.Lock()
	defer c.mu.Unlock()
	sh, err := s.leadLocked(req.Shard)
	if err != nil {
		return nil, err
	}
	to := req.To
	if to == "" {
		i := slices.Index(sh.replicas, sh.leader)
		to = sh.replicas[(i+1)%len(sh.replicas)]
	}
	if !slices.Contains(sh.replicas, to) {
		return nil, status.Errorf(codes.NotFound, "node %q not found", to)
	}
	sh.leader = to
	sh.term++
	return &taskstorepb.TransferLeaderResponse{Leader: to}, nil
}
