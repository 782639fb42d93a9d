// Package clienttest runs a fake Taskstore cluster in process, for tests of
// code that uses the client package (the client itself, taskctl). Every node
// is a real gRPC server on a loopback port serving TaskStore and Admin; the
// state is one in-memory map per shard, shared by all nodes, with a leader per
// shard that the test chooses. Nodes that do not lead a shard answer like real
// nodes: Unavailable with a NotLeader detail naming the leader.
//
// The fake keeps the API's contract where clients can observe it (versions,
// every offending reference of a refused transaction, exactly-once request
// ids, claim order, leases, waiting claims, a Modify's claim) but not
// durability or Raft.
// Hooks inject failures before or after a request is applied.
package clienttest

import (
	"cmp"
	"context"
	"fmt"
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
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
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
	mu     sync.Mutex // guards everything below
	nodes  []*Node
	slots  []uint32
	shards map[uint32]*shard
	epoch  uint64
	hook   Hook
	calls  []Call
	nextID int
}

// Node is one fake node.
type Node struct {
	ID   string
	Addr string
	c    *Cluster
	srv  *grpc.Server
}

type shard struct {
	id       uint32
	leader   string
	replicas []string
	tasks    map[string]*taskstorepb.Task
	sessions map[string]*session
	term     uint64
}

type session struct {
	seq  uint64
	resp proto.Message
	err  error
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
		c.shards[uint32(i)] = &shard{id: uint32(i), leader: ids[(i-1)%nodes], replicas: ids,
			tasks: make(map[string]*taskstorepb.Task), sessions: make(map[string]*session), term: 1}
	}
	for _, id := range ids {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n := &Node{ID: id, Addr: lis.Addr().String(), c: c, srv: grpc.NewServer()}
		s := &server{n: n}
		taskstorepb.RegisterTaskStoreServer(n.srv, s)
		taskstorepb.RegisterAdminServer(n.srv, s)
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
		if t, ok := s.tasks[id]; ok {
			return proto.Clone(t).(*taskstorepb.Task)
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
		n += len(s.tasks)
	}
	return n
}

func (c *Cluster) addr(node string) string {
	if n := c.Node(node); n != nil {
		return n.Addr
	}
	return ""
}

// server serves one node.
type server struct {
	taskstorepb.UnimplementedTaskStoreServer
	taskstorepb.UnimplementedAdminServer
	n *Node
}

// handle records the call, runs the hooks around fn.
func handle[Req proto.Message, Resp any](s *server, method string, req Req, fn func() (Resp, error)) (Resp, error) {
	var zero Resp
	c := s.n.c
	c.mu.Lock()
	c.calls = append(c.calls, Call{Node: s.n.ID, Method: method, Req: proto.Clone(req)})
	hook := c.hook
	c.mu.Unlock()
	if hook != nil {
		if err := hook(s.n.ID, method, req, Before); err != nil {
			return zero, err
		}
	}
	resp, err := fn()
	if err != nil {
		return zero, err
	}
	if hook != nil {
		if err := hook(s.n.ID, method, req, After); err != nil {
			return zero, err
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

// leadLocked returns the shard if this node leads it, or the NotLeader error.
func (s *server) leadLocked(id uint32) (*shard, error) {
	sh := s.n.c.shards[id]
	if sh == nil {
		return nil, status.Errorf(codes.NotFound, "shard %d not found", id)
	}
	if sh.leader != s.n.ID {
		return nil, NotLeader(id, sh.leader, s.n.c.addr(sh.leader))
	}
	return sh, nil
}

func groupCheck(queues ...string) (string, error) {
	group := ""
	for _, q := range queues {
		if q == "" {
			continue
		}
		g := taskstorepb.GroupOf(q)
		if group == "" {
			group = g
		} else if g != group {
			return "", status.Errorf(codes.InvalidArgument, "queue %q is not in consistency group %q", q, group)
		}
	}
	if group == "" {
		return "", status.Error(codes.InvalidArgument, "no queue named")
	}
	return group, nil
}

// session returns the stored answer of a repeated request id, or records
// that the request is new.
func sessionLocked(sh *shard, rid *taskstorepb.RequestID) (*session, bool, error) {
	if rid == nil || rid.ClientId == "" {
		return nil, false, nil
	}
	ss := sh.sessions[rid.ClientId]
	if ss != nil && rid.Seq == ss.seq {
		return ss, true, nil
	}
	if ss != nil && rid.Seq < ss.seq {
		return nil, false, status.Errorf(codes.FailedPrecondition, "stale sequence number %d < %d", rid.Seq, ss.seq)
	}
	ss = &session{seq: rid.Seq}
	sh.sessions[rid.ClientId] = ss
	return ss, false, nil
}

func availability(at *timestamppb.Timestamp, delay *durationpb.Duration, now time.Time) (time.Time, bool) {
	switch {
	case at != nil:
		return at.AsTime(), true
	case delay != nil:
		return now.Add(delay.AsDuration()), true
	}
	return now, false
}

func (s *server) Modify(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error) {
	return handle(s, "Modify", req, func() (*taskstorepb.ModifyResponse, error) {
		var queues []string
		for _, in := range req.Inserts {
			if in.Queue == "" {
				return nil, status.Error(codes.InvalidArgument, "inserts: queue required")
			}
			queues = append(queues, in.Queue)
		}
		for _, ch := range req.Changes {
			queues = append(queues, ch.Queue, ch.NewQueue)
		}
		for _, r := range append(slices.Clone(req.Deletes), req.Depends...) {
			queues = append(queues, r.Queue)
		}
		if cl := req.Claim; cl != nil {
			if len(cl.Queues) == 0 || req.Claimant == "" {
				return nil, status.Error(codes.InvalidArgument, "claim: queues and claimant required")
			}
			queues = append(queues, cl.Queues...)
		}
		group, err := groupCheck(queues...)
		if err != nil {
			return nil, err
		}
		c := s.n.c
		c.mu.Lock()
		defer c.mu.Unlock()
		sh, err := s.leadLocked(c.slots[taskstorepb.SlotOf(group, Slots)])
		if err != nil {
			return nil, err
		}
		ss, repeat, err := sessionLocked(sh, req.Request)
		if err != nil {
			return nil, err
		}
		if repeat {
			if ss.err != nil {
				return nil, ss.err
			}
			return ss.resp.(*taskstorepb.ModifyResponse), nil
		}
		resp, err := c.modifyLocked(sh, req)
		if ss != nil {
			ss.resp, ss.err = resp, err
		}
		return resp, err
	})
}

func (c *Cluster) modifyLocked(sh *shard, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error) {
	now := time.Now()
	var errs []*taskstorepb.RefError
	claimed := func(t *taskstorepb.Task) bool {
		return t.Claimant != "" && t.Claimant != req.Claimant && t.At.AsTime().After(now)
	}
	check := func(id string, version uint64, missing, stale taskstorepb.RefError_Category, mutate bool) {
		t, ok := sh.tasks[id]
		switch {
		case !ok:
			errs = append(errs, &taskstorepb.RefError{Category: missing, Id: id, Version: version})
		case t.Version != version:
			errs = append(errs, &taskstorepb.RefError{Category: stale, Id: id, Version: version, CurrentVersion: t.Version, Queue: t.Queue})
		case mutate && claimed(t):
			errs = append(errs, &taskstorepb.RefError{Category: taskstorepb.RefError_CLAIMED, Id: id, Version: version,
				CurrentVersion: t.Version, Queue: t.Queue, Claimant: t.Claimant, LeaseUntil: t.At})
		}
	}
	for _, ch := range req.Changes {
		check(ch.Id, ch.Version, taskstorepb.RefError_CHANGE_MISSING, taskstorepb.RefError_CHANGE_STALE, true)
	}
	for _, r := range req.Deletes {
		check(r.Id, r.Version, taskstorepb.RefError_DELETE_MISSING, taskstorepb.RefError_DELETE_STALE, true)
	}
	for _, r := range req.Depends {
		check(r.Id, r.Version, taskstorepb.RefError_DEPEND_MISSING, taskstorepb.RefError_DEPEND_STALE, false)
	}
	resp := &taskstorepb.ModifyResponse{}
	var fresh []*taskstorepb.TaskInsert
	for i, in := range req.Inserts {
		if in.Id != "" {
			if _, ok := sh.tasks[in.Id]; ok {
				errs = append(errs, &taskstorepb.RefError{Category: taskstorepb.RefError_INSERT_DUPLICATE_ID, Id: in.Id, Queue: in.Queue})
				continue
			}
		}
		if in.Key != "" {
			if t := keyHolder(sh, in.Queue, in.Key); t != nil {
				if in.IfAbsent {
					resp.Coalesced = append(resp.Coalesced, uint32(i))
					continue
				}
				errs = append(errs, &taskstorepb.RefError{Category: taskstorepb.RefError_INSERT_DUPLICATE_KEY, Id: in.Id,
					Queue: in.Queue, Key: in.Key, ExistingId: t.Id})
				continue
			}
		}
		fresh = append(fresh, in)
	}
	if len(errs) > 0 {
		st := status.New(codes.FailedPrecondition, fmt.Sprintf("transaction refused: %d offending reference(s)", len(errs)))
		st, _ = st.WithDetails(&taskstorepb.ModifyError{Errors: errs})
		return nil, st.Err()
	}
	ts := timestamppb.New(now)
	for _, in := range req.Inserts {
		if !slices.Contains(fresh, in) {
			resp.Inserted = append(resp.Inserted, proto.Clone(keyHolder(sh, in.Queue, in.Key)).(*taskstorepb.Task))
			continue
		}
		id := in.Id
		if id == "" {
			c.nextID++
			id = fmt.Sprintf("t%04d", c.nextID)
		}
		at, _ := availability(in.At, in.Delay, now)
		t := &taskstorepb.Task{Id: id, Version: 1, Queue: in.Queue, At: timestamppb.New(at), Priority: in.Priority, Key: in.Key,
			Value: in.Value, Created: ts, Modified: ts, Attempt: in.Attempt, Err: in.Err}
		sh.tasks[id] = t
		resp.Inserted = append(resp.Inserted, proto.Clone(t).(*taskstorepb.Task))
	}
	for _, ch := range req.Changes {
		t := sh.tasks[ch.Id]
		t.Version++
		t.Modified = ts
		if ch.NewQueue != "" {
			t.Queue = ch.NewQueue
		}
		if at, ok := availability(ch.At, ch.Delay, now); ok {
			t.At = timestamppb.New(at)
		}
		if ch.Value != nil {
			t.Value = ch.Value
		}
		if ch.Priority != nil {
			t.Priority = *ch.Priority
		}
		if ch.Attempt != nil {
			t.Attempt = *ch.Attempt
		}
		if ch.Err != nil {
			t.Err = *ch.Err
		}
		if !ch.KeepClaim {
			t.Claimant = ""
		}
		resp.Changed = append(resp.Changed, proto.Clone(t).(*taskstorepb.Task))
	}
	for _, r := range req.Deletes {
		delete(sh.tasks, r.Id)
	}
	if cl := req.Claim; cl != nil {
		lease := 30 * time.Second
		if cl.Lease != nil {
			lease = cl.Lease.AsDuration()
		}
		resp.Claimed = claimLocked(sh, req.Claimant, cl.Queues, max(int(cl.Limit), 1), lease)
	}
	return resp, nil
}

// claimLocked claims up to limit available tasks of queues, best first.
func claimLocked(sh *shard, claimant string, queues []string, limit int, lease time.Duration) []*taskstorepb.Task {
	now := time.Now()
	var out []*taskstorepb.Task
	for _, t := range sortedLocked(sh, queues...) {
		if len(out) == limit {
			break
		}
		if t.At.AsTime().After(now) {
			continue
		}
		t.Version++
		t.Claimant = claimant
		t.At = timestamppb.New(now.Add(lease))
		t.Claims++
		t.Modified = timestamppb.New(now)
		out = append(out, proto.Clone(t).(*taskstorepb.Task))
	}
	return out
}

func keyHolder(sh *shard, queue, key string) *taskstorepb.Task {
	if key == "" {
		return nil
	}
	for _, t := range sh.tasks {
		if t.Queue == queue && t.Key == key {
			return t
		}
	}
	return nil
}

// sortedLocked returns the tasks of the queues, best first (priority, at, id).
func sortedLocked(sh *shard, queues ...string) []*taskstorepb.Task {
	var out []*taskstorepb.Task
	for _, t := range sh.tasks {
		if slices.Contains(queues, t.Queue) {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b *taskstorepb.Task) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), a.At.AsTime().Compare(b.At.AsTime()), cmp.Compare(a.Id, b.Id))
	})
	return out
}

func (s *server) Claim(ctx context.Context, req *taskstorepb.ClaimRequest) (*taskstorepb.ClaimResponse, error) {
	return handle(s, "Claim", req, func() (*taskstorepb.ClaimResponse, error) {
		if len(req.Queues) == 0 || req.Claimant == "" {
			return nil, status.Error(codes.InvalidArgument, "claim: queues and claimant required")
		}
		group, err := groupCheck(req.Queues...)
		if err != nil {
			return nil, err
		}
		wait := req.Wait.AsDuration()
		end := time.Now().Add(wait)
		for {
			resp, err := s.claimOnce(group, req)
			if err != nil || len(resp.Tasks) > 0 || wait <= 0 || !time.Now().Before(end) {
				return resp, err
			}
			select {
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
}

func (s *server) claimOnce(group string, req *taskstorepb.ClaimRequest) (*taskstorepb.ClaimResponse, error) {
	c := s.n.c
	c.mu.Lock()
	defer c.mu.Unlock()
	sh, err := s.leadLocked(c.slots[taskstorepb.SlotOf(group, Slots)])
	if err != nil {
		return nil, err
	}
	if rid := req.Request; rid != nil {
		if ss := sh.sessions[rid.ClientId]; ss != nil && ss.seq == rid.Seq {
			return ss.resp.(*taskstorepb.ClaimResponse), nil
		}
	}
	lease := 30 * time.Second
	if req.Lease != nil {
		lease = req.Lease.AsDuration()
	}
	resp := &taskstorepb.ClaimResponse{Tasks: claimLocked(sh, req.Claimant, req.Queues, max(int(req.Limit), 1), lease)}
	if len(resp.Tasks) > 0 {
		if ss, _, err := sessionLocked(sh, req.Request); err != nil {
			return nil, err
		} else if ss != nil {
			ss.resp = resp
		}
	}
	return resp, nil
}

func (s *server) Tasks(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error) {
	return handle(s, "Tasks", req, func() (*taskstorepb.TasksResponse, error) {
		c := s.n.c
		c.mu.Lock()
		defer c.mu.Unlock()
		id := req.Shard
		switch {
		case id != 0:
		case req.Queue != "":
			id = c.slots[taskstorepb.SlotOf(taskstorepb.GroupOf(req.Queue), Slots)]
		default:
			return nil, status.Error(codes.InvalidArgument, "queue: give a queue or a shard")
		}
		sh, err := s.leadLocked(id)
		if err != nil {
			return nil, err
		}
		out := &taskstorepb.TasksResponse{}
		if len(req.Ids) > 0 {
			for _, id := range req.Ids {
				if t, ok := sh.tasks[id]; ok && (req.Queue == "" || t.Queue == req.Queue) {
					out.Tasks = append(out.Tasks, proto.Clone(t).(*taskstorepb.Task))
				}
			}
			return out, nil
		}
		if req.Queue == "" {
			return nil, status.Error(codes.InvalidArgument, "queue: required to list tasks")
		}
		all := sortedLocked(sh, req.Queue)
		start := 0
		if req.PageToken != "" {
			if start, err = strconv.Atoi(req.PageToken); err != nil || start < 0 || start > len(all) {
				return nil, status.Error(codes.InvalidArgument, "page_token: bad")
			}
		}
		limit := int(req.Limit)
		if limit <= 0 {
			limit = 100
		}
		for i := start; i < len(all) && i < start+limit; i++ {
			out.Tasks = append(out.Tasks, proto.Clone(all[i]).(*taskstorepb.Task))
		}
		if start+limit < len(all) {
			out.NextPageToken = strconv.Itoa(start + limit)
		}
		return out, nil
	})
}

func (s *server) Queues(ctx context.Context, req *taskstorepb.QueuesRequest) (*taskstorepb.QueuesResponse, error) {
	return handle(s, "Queues", req, func() (*taskstorepb.QueuesResponse, error) {
		c := s.n.c
		c.mu.Lock()
		defer c.mu.Unlock()
		var shards []*shard
		if req.Shard != 0 {
			sh, err := s.leadLocked(req.Shard)
			if err != nil {
				return nil, err
			}
			shards = append(shards, sh)
		} else {
			for _, sh := range c.shards {
				if sh.leader == s.n.ID {
					shards = append(shards, sh)
				}
			}
		}
		now := time.Now()
		out := &taskstorepb.QueuesResponse{}
		for _, sh := range shards {
			stats := map[string]*taskstorepb.QueueStats{}
			for _, t := range sh.tasks {
				if !strings.HasPrefix(t.Queue, req.Prefix) {
					continue
				}
				q := stats[t.Queue]
				if q == nil {
					q = &taskstorepb.QueueStats{Name: t.Queue, Shard: sh.id}
					stats[t.Queue] = q
				}
				q.Total++
				at := t.At.AsTime()
				switch {
				case at.After(now) && t.Claimant != "":
					q.Claimed++
				case at.After(now):
					q.Delayed++
				default:
					q.Available++
					if age := now.Sub(at); q.OldestAvailableAge == nil || age > q.OldestAvailableAge.AsDuration() {
						q.OldestAvailableAge = durationpb.New(age)
					}
				}
			}
			for _, q := range stats {
				out.Queues = append(out.Queues, q)
			}
		}
		slices.SortFunc(out.Queues, func(a, b *taskstorepb.QueueStats) int { return cmp.Compare(a.Name, b.Name) })
		if req.Limit > 0 && len(out.Queues) > int(req.Limit) {
			out.Queues = out.Queues[:req.Limit]
		}
		return out, nil
	})
}

func (s *server) Time(ctx context.Context, req *taskstorepb.TimeRequest) (*taskstorepb.TimeResponse, error) {
	return handle(s, "Time", req, func() (*taskstorepb.TimeResponse, error) {
		return &taskstorepb.TimeResponse{Now: timestamppb.Now()}, nil
	})
}

func (s *server) Status(ctx context.Context, req *taskstorepb.StatusRequest) (*taskstorepb.StatusResponse, error) {
	return handle(s, "Status", req, func() (*taskstorepb.StatusResponse, error) {
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
				idx := uint64(10 + len(sh.tasks))
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
	})
}

func (s *server) Routing(ctx context.Context, req *taskstorepb.RoutingRequest) (*taskstorepb.RoutingResponse, error) {
	return handle(s, "Routing", req, func() (*taskstorepb.RoutingResponse, error) {
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
	})
}

func (s *server) TransferLeader(ctx context.Context, req *taskstorepb.TransferLeaderRequest) (*taskstorepb.TransferLeaderResponse, error) {
	return handle(s, "TransferLeader", req, func() (*taskstorepb.TransferLeaderResponse, error) {
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
	})
}

func (s *server) Purge(ctx context.Context, req *taskstorepb.PurgeRequest) (*taskstorepb.PurgeResponse, error) {
	return handle(s, "Purge", req, func() (*taskstorepb.PurgeResponse, error) {
		if req.Queue == "" {
			return nil, status.Error(codes.InvalidArgument, "queue: required")
		}
		c := s.n.c
		c.mu.Lock()
		defer c.mu.Unlock()
		sh, err := s.leadLocked(c.slots[taskstorepb.SlotOf(taskstorepb.GroupOf(req.Queue), Slots)])
		if err != nil {
			return nil, err
		}
		var n uint64
		for id, t := range sh.tasks {
			if t.Queue == req.Queue {
				delete(sh.tasks, id)
				n++
			}
		}
		return &taskstorepb.PurgeResponse{Deleted: n}, nil
	})
}
