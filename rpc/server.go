package rpc

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/e1158ecb/taskstore/api/limits"
	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/auth"
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
	log         *slog.Logger
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
		rates: newIntrospection(time.Now), log: log.With("component", "rpc")}
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

// newID returns a leader-chosen task id, 32 hex digits: the shard's clock
// (now, Unix nanoseconds) in milliseconds (48 bits), then 80 random bits. The random bits make it
// unique (the state machine does not check: Insert.id_chosen_by_leader); the
// clock in front makes the ids of tasks inserted together neighbours in the
// state on disk (its task table is ordered by id), so new tasks land past
// the old ones rather than among them and the engine's compactions move
// files instead of rewriting the whole table (fsm/ondisk/DESIGN.md).
func newID(now int64) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now/int64(time.Millisecond))<<16)
	rand.Read(b[6:])
	return hex.EncodeToString(b[:])
}

// groupOf collects the consistency group of a request from every queue it
// names; they must agree.
type groupOf struct{ group, field string }

func (g *groupOf) add(field, queue string) error {
	if queue == "" {
		return nil
	}
	// The name's own rule first: "/x" has an empty group, which must not
	// read as "no queue named".
	if err := taskstorepb.CheckQueue(queue); err != nil {
		return invalid(field, "%v", err)
	}
	grp := taskstorepb.GroupOf(queue)
	if g.group == "" {
		g.group, g.field = grp, field
		return nil
	}
	if grp != g.group {
		return invalid(field, "queue %q is in consistency group %q but %s is in %q: a request may touch one group only", queue, grp, g.field, g.group)
	}
	return nil
}

// availability converts an (at, delay) pair to Unix nanoseconds; 0 when
// neither is set.
func availability(field string, at *timestamppb.Timestamp, delay *durationpb.Duration, now int64) (int64, error) {
	switch {
	case at != nil && delay != nil:
		return 0, invalid(field, "set at or delay, not both")
	case at != nil:
		if err := at.CheckValid(); err != nil {
			return 0, invalid(field+".at", "%v", err)
		}
		// Unix nanoseconds span the years 1678 to 2262; UnixNano wraps
		// outside them. Earlier is just "now"; later cannot be stored.
		if at.Seconds >= math.MaxInt64/int64(time.Second) {
			return 0, invalid(field+".at", "%v is after the year 2262", at.AsTime())
		}
		if at.Seconds <= math.MinInt64/int64(time.Second) {
			return 1, nil
		}
		return max(at.AsTime().UnixNano(), 1), nil
	case delay != nil:
		if err := delay.CheckValid(); err != nil {
			return 0, invalid(field+".delay", "%v", err)
		}
		d := delay.AsDuration()
		if d < 0 {
			return 0, invalid(field+".delay", "must not be negative")
		}
		if int64(d) > math.MaxInt64-now {
			return 0, invalid(field+".delay", "%v ends after the year 2262", d)
		}
		return now + int64(d), nil
	}
	return 0, nil
}

func requestID(cmd *fsmpb.Command, r *taskstorepb.RequestID) {
	if r != nil {
		cmd.ClientId, cmd.Seq = r.ClientId, r.Seq
	}
}

// Modify implements TaskStore.Modify.
func (srv *Server) Modify(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error) {
	res, err := srv.modify(ctx, req)
	return res, toStatus(err)
}

func (srv *Server) modify(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error) {
	// fsm.Validate counts operations too, but only after the command is
	// built: refuse a huge list before converting it.
	if n := len(req.Inserts) + len(req.Changes) + len(req.Deletes) + len(req.Depends); srv.limits.MaxOps > 0 && n > srv.limits.MaxOps {
		return nil, tooMany("request", "operations", n, srv.limits.MaxOps)
	}
	var g groupOf
	for i, in := range req.Inserts {
		if in.Queue == "" {
			return nil, invalid(field("inserts", i, "queue"), "required")
		}
		if err := g.add(field("inserts", i, "queue"), in.Queue); err != nil {
			return nil, err
		}
	}
	for i, c := range req.Changes {
		if err := g.add(field("changes", i, "queue"), c.Queue); err != nil {
			return nil, err
		}
		if err := g.add(field("changes", i, "new_queue"), c.NewQueue); err != nil {
			return nil, err
		}
	}
	for i, r := range req.Deletes {
		if err := g.add(field("deletes", i, "queue"), r.Queue); err != nil {
			return nil, err
		}
	}
	for i, r := range req.Depends {
		if err := g.add(field("depends", i, "queue"), r.Queue); err != nil {
			return nil, err
		}
	}
	claim, err := modifyClaim(&g, req)
	if err != nil {
		return nil, err
	}
	if g.group == "" {
		if len(req.Inserts)+len(req.Changes)+len(req.Deletes)+len(req.Depends) == 0 && claim == nil {
			return nil, invalid("request", "empty transaction")
		}
		return nil, invalid("queue", "no queue named: give the queue of at least one referenced task so the request can be routed to its consistency group")
	}
	shard, err := srv.shards.ShardFor(g.group)
	if err != nil {
		return nil, err
	}
	now := shard.Now()
	m := &fsmpb.Modify{Group: g.group, Claimant: req.Claimant}
	if p, ok := auth.FromContext(ctx); ok && p.Role == auth.RoleClient && p.Prefixes != nil && len(req.Changes)+len(req.Deletes)+len(req.Depends) > 0 {
		// The policy checked the queues the request names; the tasks it
		// names by id are checked where their queues are known: in the
		// state machine, as the entry applies.
		m.Scope = p.Prefixes
	}
	controls := false // an insert needs FormatQueueControls
	headers := false  // an insert or a change needs FormatHeaders
	for i, in := range req.Inserts {
		at, err := availability(field("inserts", i, ""), in.At, in.Delay, now)
		if err != nil {
			return nil, err
		}
		id, chosen := in.Id, in.Id == ""
		if chosen {
			id = newID(now)
		}
		m.Inserts = append(m.Inserts, &fsmpb.Insert{Id: id, Queue: in.Queue, At: at, Priority: in.Priority, Key: in.Key,
			Value: in.Value, Attempt: in.Attempt, Err: in.Err, IfAbsent: in.IfAbsent, Held: in.Held,
			DedupWindow: in.DedupWindow.AsDuration().Nanoseconds(), IdChosenByLeader: chosen, Headers: in.Headers})
		if in.DedupWindow != nil && in.DedupWindow.CheckValid() != nil {
			return nil, invalid(field("inserts", i, "dedup_window"), "not a valid duration")
		}
		controls = controls || in.Held || in.DedupWindow != nil
		headers = headers || len(in.Headers) > 0
	}
	if controls {
		if err := needFormat(ctx, shard, fsm.FormatQueueControls, "a held insert or a dedup window"); err != nil {
			return nil, err
		}
	}
	for i, c := range req.Changes {
		at, err := availability(field("changes", i, ""), c.At, c.Delay, now)
		if err != nil {
			return nil, err
		}
		m.Changes = append(m.Changes, &fsmpb.Change{Id: c.Id, Version: c.Version, Queue: c.NewQueue, At: at, Value: c.Value,
			Priority: c.Priority, Attempt: c.Attempt, Err: c.Err, KeepClaim: c.KeepClaim, Headers: c.Headers, ClearHeaders: c.ClearHeaders})
		headers = headers || len(c.Headers) > 0 || c.ClearHeaders
	}
	if headers {
		if err := needFormat(ctx, shard, fsm.FormatHeaders, "task headers"); err != nil {
			return nil, err
		}
	}
	for _, r := range req.Deletes {
		m.Deletes = append(m.Deletes, &fsmpb.Ref{Id: r.Id, Version: r.Version})
	}
	for _, r := range req.Depends {
		m.Depends = append(m.Depends, &fsmpb.Ref{Id: r.Id, Version: r.Version})
	}
	cmd := &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: m}
	m.MaxAnswerBytes = srv.answerBudget()
	if claim != nil {
		claim.MaxBytes = m.MaxAnswerBytes
		cmd.Op, m.Claim = fsmpb.Op_OP_MODIFY_CLAIM, claim
	}
	requestID(cmd, req.Request)
	if err := fsm.Validate(cmd, srv.limits); err != nil {
		return nil, err
	}
	res, err := shard.Propose(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if res.Failure != nil {
		if !res.Replayed && fsm.KindOf(res.Failure) != fsmpb.Failure_MOVED {
			srv.metrics.refusal(res.Failure)
		}
		var holders []string
		for _, e := range res.Failure.Errors {
			if e.Category == fsmpb.RefError_INSERT_DUPLICATE_KEY && e.ExistingId != "" {
				holders = append(holders, e.ExistingId)
			}
		}
		return nil, &refusedError{failure: res.Failure, deleted: deletedHolders(ctx, shard, g.group, holders)}
	}
	mr := res.GetModify()
	if !res.Replayed { // a retry's answer: counted when it was applied
		srv.metrics.modified(g.group, req, mr)
		srv.rates.modified(req, mr)
	}
	resp := &taskstorepb.ModifyResponse{Inserted: tasksToAPI(mr.GetInserted()), Changed: tasksToAPI(mr.GetChanged()), Coalesced: mr.GetCoalesced()}
	if len(resp.Coalesced) > 0 {
		holders := make([]string, 0, len(resp.Coalesced))
		for _, i := range resp.Coalesced {
			holders = append(holders, resp.Inserted[i].Id)
		}
		if deleted := deletedHolders(ctx, shard, g.group, holders); len(deleted) > 0 {
			for _, i := range resp.Coalesced {
				if deleted[resp.Inserted[i].Id] {
					resp.CoalescedDeleted = append(resp.CoalescedDeleted, i)
				}
			}
		}
	}
	// A task named by many if_absent inserts goes out in full once.
	taskstorepb.CompactInserted(resp)
	if claim != nil {
		resp.Claimed = srv.claimed(g.group, mr.GetClaim(), res.Replayed)
	}
	return resp, srv.fits("Modify", resp)
}

// modifyClaim checks the claim part of a Modify by a Claim's rules (and adds
// its queues to the request's group) and converts it; nil without one.
func modifyClaim(g *groupOf, req *taskstorepb.ModifyRequest) (*fsmpb.Claim, error) {
	c := req.Claim
	if c == nil {
		return nil, nil
	}
	if len(c.Queues) == 0 {
		return nil, invalid("claim.queues", "name at least one queue")
	}
	if len(c.Queues) > taskstorepb.MaxClaimQueues {
		return nil, tooMany("claim.queues", "queues", len(c.Queues), taskstorepb.MaxClaimQueues)
	}
	for i, q := range c.Queues {
		if q == "" {
			return nil, invalid(field("claim.queues", i, ""), "empty queue name")
		}
		if err := g.add(field("claim.queues", i, ""), q); err != nil {
			return nil, err
		}
	}
	if req.Claimant == "" {
		return nil, invalid("claimant", "required with a claim: say who is claiming")
	}
	lease := DefaultLease
	if c.Lease != nil {
		if err := c.Lease.CheckValid(); err != nil {
			return nil, invalid("claim.lease", "%v", err)
		}
		lease = c.Lease.AsDuration()
	}
	return &fsmpb.Claim{Claimant: req.Claimant, Queues: c.Queues, Lease: int64(lease), Limit: max(c.Limit, 1)}, nil
}

// claimed counts what a claim (of a Claim, or of a Modify's claim part)
// took, unless its answer was replayed to a retry, and converts it for the
// answer.
func (srv *Server) claimed(group string, res *fsmpb.ClaimResult, replayed bool) []*taskstorepb.Task {
	tasks := res.GetTasks()
	out := tasksToAPI(tasks)
	if replayed {
		return out
	}
	if len(tasks) > 0 {
		label := srv.metrics.groups.label(group)
		srv.metrics.claimed.WithLabelValues(label).Add(float64(len(tasks)))
		if n := res.GetExpiredLeases(); n > 0 {
			srv.metrics.leaseExpired.WithLabelValues(label).Add(float64(n))
		}
	}
	srv.rates.claimed(out)
	return out
}

// Claim implements TaskStore.Claim.
func (srv *Server) Claim(ctx context.Context, req *taskstorepb.ClaimRequest) (*taskstorepb.ClaimResponse, error) {
	res, err := srv.claim(ctx, req)
	return res, toStatus(err)
}

func (srv *Server) claim(ctx context.Context, req *taskstorepb.ClaimRequest) (*taskstorepb.ClaimResponse, error) {
	if len(req.Queues) == 0 {
		return nil, invalid("queues", "name at least one queue")
	}
	if len(req.Queues) > taskstorepb.MaxClaimQueues {
		return nil, tooMany("queues", "queues", len(req.Queues), taskstorepb.MaxClaimQueues)
	}
	var g groupOf
	for i, q := range req.Queues {
		if q == "" {
			return nil, invalid(field("queues", i, ""), "empty queue name")
		}
		if err := g.add(field("queues", i, ""), q); err != nil {
			return nil, err
		}
	}
	if req.Claimant == "" {
		return nil, invalid("claimant", "required: say who is claiming")
	}
	lease := DefaultLease
	if req.Lease != nil {
		if err := req.Lease.CheckValid(); err != nil {
			return nil, invalid("lease", "%v", err)
		}
		lease = req.Lease.AsDuration()
	}
	var wait time.Duration
	if req.Wait != nil {
		if err := req.Wait.CheckValid(); err != nil {
			return nil, invalid("wait", "%v", err)
		}
		if wait = req.Wait.AsDuration(); wait < 0 || wait > MaxWait {
			return nil, invalid("wait", "%v is outside [0, %v]", wait, MaxWait)
		}
	}
	limit := req.Limit
	if limit == 0 {
		limit = 1
	}
	cmd := &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Claim: &fsmpb.Claim{Claimant: req.Claimant, Queues: req.Queues, Lease: int64(lease), Limit: limit,
		MaxBytes: srv.answerBudget()}}
	requestID(cmd, req.Request)
	if err := fsm.Validate(cmd, srv.limits); err != nil {
		return nil, err
	}
	shard, err := srv.shards.ShardFor(g.group)
	if err != nil {
		return nil, err
	}
	res, err := shard.Claim(ctx, cmd, wait)
	if err != nil {
		return nil, err
	}
	if res.Failure != nil {
		return nil, &refusedError{failure: res.Failure}
	}
	resp := &taskstorepb.ClaimResponse{Tasks: srv.claimed(g.group, res.GetClaim(), res.Replayed)}
	if len(resp.Tasks) == 0 {
		resp.EmptyReason = emptyClaimReason(ctx, shard, req.Queues)
	}
	return resp, srv.fits("Claim", resp)
}

// deletedHolders returns which of ids, the tasks that hold keys a Modify
// found taken, no task of group has now: deleted within their key's dedup
// window, which keeps the key reserved. It reads this replica's state
// after the Modify applied (no log entry); nil when none or on an error.
func deletedHolders(ctx context.Context, shard Shard, group string, ids []string) map[string]bool {
	if len(ids) == 0 {
		return nil
	}
	var out map[string]bool
	err := shard.Read(ctx, true, func(m *fsm.Machine) error {
		live := map[string]bool{}
		for _, t := range m.Get(ids) {
			if taskstorepb.GroupOf(t.Queue) == group {
				live[t.Id] = true
			}
		}
		for _, id := range ids {
			if !live[id] {
				if out == nil {
					out = map[string]bool{}
				}
				out[id] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil
	}
	return out
}

// emptyClaimReason says why a claim of queues that took nothing may have
// found nothing although they hold tasks: a queue paused, or at (or over)
// its concurrency limit; "" when none is. It reads this replica's state
// after the claim (which it has applied, or read, as leader): a claim
// answered empty costs no log entry, and neither does its reason.
func emptyClaimReason(ctx context.Context, shard Shard, queues []string) string {
	var why []string
	err := shard.Read(ctx, true, func(m *fsm.Machine) error {
		for i, name := range queues {
			if slices.Contains(queues[:i], name) {
				continue
			}
			// The queue itself sorts first among those it prefixes.
			for _, q := range m.Queues(name, 1) {
				if q.Name == name {
					if w := taskstorepb.QueueHoldReason(q.Name, q.Paused, q.MaxClaimed, q.Claimed); w != "" {
						why = append(why, w)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		return ""
	}
	return strings.Join(why, "; ")
}

// answerHeadroom is what the answer budget keeps back from the send limit
// for what fsm.AnswerBytes does not count (the response's own fields).
const answerHeadroom = 64 << 10

// answerBudget is the bound on a committed answer's tasks that the state
// machine applies (Claim.max_bytes, Modify.max_answer_bytes): a claim takes
// no more tasks than fit, a transaction whose echo would not fit is refused
// before it commits. So nothing is committed that the node cannot send.
func (srv *Server) answerBudget() uint64 {
	return uint64(max(srv.maxResponse-answerHeadroom, 1))
}

// fits is the last guard of "never report failed for something that
// happened": an answer to a committed request that is over the send limit
// anyway (which the budget should make impossible) would reach the caller
// as ResourceExhausted, which means "not applied". It is answered as an
// unknown outcome instead.
func (srv *Server) fits(op string, resp proto.Message) error {
	if n := proto.Size(resp); n > srv.maxResponse {
		srv.log.Error("a committed request's answer is over the send limit", "op", op, "bytes", n, "limit", srv.maxResponse)
		return fmt.Errorf("%w: the request was applied but its answer (%d bytes) is over the node's limit of %d bytes; read the tasks back with Tasks", cluster.ErrUnknownOutcome, n, srv.maxResponse)
	}
	return nil
}

// readShard finds the shard a read addresses.
func (srv *Server) readShard(shardID uint32, queue string) (Shard, error) {
	switch {
	case shardID != 0:
		return srv.shards.ShardByID(shardID)
	case taskstorepb.CheckQueue(queue) != nil:
		return nil, invalid("queue", "%v", taskstorepb.CheckQueue(queue))
	case queue != "":
		return srv.shards.ShardFor(taskstorepb.GroupOf(queue))
	default:
		return nil, invalid("queue", "give a queue or a shard")
	}
}

// Tasks implements TaskStore.Tasks.
func (srv *Server) Tasks(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error) {
	res, err := srv.tasks(ctx, req)
	return res, toStatus(err)
}

func (srv *Server) tasks(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error) {
	if len(req.Ids) > taskstorepb.MaxRequestIDs {
		return nil, tooMany("ids", "ids", len(req.Ids), taskstorepb.MaxRequestIDs)
	}
	f, err := srv.listFilter(req)
	if err != nil {
		return nil, err
	}
	shard, err := srv.readShard(req.Shard, req.Queue)
	if err != nil {
		return nil, err
	}
	var table []uint32
	if st, ok := srv.shards.(slotTabler); ok && req.Queue == "" && len(req.Ids) > 0 {
		table = st.SlotTable() // a read every shard answers: say which slots
	}
	var res *taskstorepb.TasksResponse
	err = shard.Read(ctx, req.Stale, func(m *fsm.Machine) (err error) {
		if req.Queue != "" && !m.ReadsGroup(taskstorepb.GroupOf(req.Queue)) {
			return movedRead(shard.ID(), req.Queue)
		}
		res, err = srv.readTasks(m, req, f, table, shard.ID())
		return err
	})
	return res, err
}

// movedRead refuses a read of a queue whose slot the shard does not serve
// (imported, not yet active; or moved away): Unavailable, which clients
// retry after refreshing their routing table.
func movedRead(shard uint32, queue string) error {
	return &movedError{msg: fmt.Sprintf("%s: shard %d does not serve the slot of queue %q now (it is moving or moved); retry", fsm.SlotMoved, shard, queue)}
}

func (srv *Server) readTasks(m *fsm.Machine, req *taskstorepb.TasksRequest, f fsm.ListFilter, table []uint32, shard uint32) (*taskstorepb.TasksResponse, error) {
	if len(req.Ids) > 0 {
		// An id named twice is answered once, and the answer must fit one
		// message: 1000 ids of 1 MiB values would otherwise make the node
		// encode a gigabyte before gRPC refused to send it.
		ids := slices.Clone(req.Ids)
		slices.Sort(ids)
		ids = slices.Compact(ids)
		var out []*taskstorepb.Task
		var n uint64
		budget := srv.answerBudget()
		found, served := []*fsmpb.Task(nil), []byte(nil)
		if len(table) > 0 {
			found, served = m.GetServed(ids, table, shard)
		} else {
			found = m.Get(ids)
		}
		for _, t := range found {
			if req.Queue != "" && t.Queue != req.Queue {
				continue
			}
			if req.OmitValues {
				t.Value = nil
			}
			if n += fsm.AnswerBytes(t); n > budget {
				return nil, &fsm.ValidationError{Field: "ids", Kind: fsm.ErrTooLarge,
					Rule: fmt.Sprintf("the tasks named take more than the answer limit of %d bytes: ask for fewer ids, or set omit_values", budget)}
			}
			out = append(out, taskToAPI(t))
		}
		return &taskstorepb.TasksResponse{Tasks: out, ServedSlots: served}, nil
	}
	if req.Queue == "" {
		return nil, invalid("queue", "required to list tasks (or give ids)")
	}
	limit := int(req.Limit)
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	ts, next, err := m.ListFiltered(req.Queue, req.PageToken, limit, f, req.OmitValues, srv.answerBudget())
	if err != nil {
		return nil, invalid("page_token", "%v", err)
	}
	return &taskstorepb.TasksResponse{Tasks: tasksToAPI(ts), NextPageToken: next}, nil
}

// listFilter converts and checks a listing's filters. They filter a queue
// listing; with ids they are refused rather than ignored.
func (srv *Server) listFilter(req *taskstorepb.TasksRequest) (fsm.ListFilter, error) {
	f := fsm.ListFilter{Claimed: req.Claimed, Claimant: req.Claimant, KeyPrefix: req.KeyPrefix, MinAttempt: req.MinAttempt, ErrContains: req.ErrContains, Headers: req.Headers}
	if err := fsm.ValidateHeaders("headers", req.Headers); err != nil {
		return f, err
	}
	switch req.State {
	case taskstorepb.TaskState_TASK_STATE_UNSPECIFIED:
	case taskstorepb.TaskState_TASK_STATE_AVAILABLE:
		f.State = fsm.Available
	case taskstorepb.TaskState_TASK_STATE_CLAIMED:
		f.State = fsm.Claimed
	case taskstorepb.TaskState_TASK_STATE_DELAYED:
		f.State = fsm.Delayed
	default:
		return f, invalid("state", "unknown state %d", int32(req.State))
	}
	l := srv.limits.WithDefaults()
	for _, c := range []struct {
		field, v string
		max      int
	}{{"claimant", f.Claimant, l.MaxNameBytes}, {"key_prefix", f.KeyPrefix, l.MaxNameBytes}, {"err_contains", f.ErrContains, l.MaxErrBytes}} {
		if len(c.v) > c.max {
			return f, invalid(c.field, "%d bytes exceeds the limit of %d", len(c.v), c.max)
		}
	}
	listing := f
	listing.Claimed = nil // the older filter, which a lookup by ids has always ignored
	if len(req.Ids) > 0 && listing.Any() {
		return f, invalid("ids", "state, claimant, key_prefix, min_attempt, err_contains and headers filter a queue listing, not a lookup by ids")
	}
	return f, nil
}

// Queues implements TaskStore.Queues.
func (srv *Server) Queues(ctx context.Context, req *taskstorepb.QueuesRequest) (*taskstorepb.QueuesResponse, error) {
	res, err := srv.queues(ctx, req)
	return res, toStatus(err)
}

func (srv *Server) queues(ctx context.Context, req *taskstorepb.QueuesRequest) (*taskstorepb.QueuesResponse, error) {
	shards, err := srv.listedShards(req.Shard, req.Stale)
	if err != nil {
		return nil, err
	}
	out := &taskstorepb.QueuesResponse{}
	for _, s := range shards {
		var queues []fsm.QueueStats
		err := s.Read(ctx, req.Stale, func(m *fsm.Machine) error {
			queues = m.Queues(req.Prefix, int(req.Limit))
			return nil
		})
		if err != nil {
			if req.Shard != 0 {
				return nil, err
			}
			continue // lost leadership since: another node answers for it
		}
		// Ages are measured against the serving node's time, not the
		// machine's clock, which only moves when a command is applied.
		clock := s.Now()
		for _, q := range queues {
			qs := &taskstorepb.QueueStats{Name: q.Name, Total: q.Total, Available: q.Available, Claimed: q.Claimed, Delayed: q.Delayed, Shard: s.ID(),
				Paused: q.Paused, MaxClaimed: q.MaxClaimed}
			if q.Policy != nil {
				qs.Policy = apiPolicy(q.Policy)
			}
			if q.OldestAvailableAt != 0 {
				qs.OldestAvailableAge = durationpb.New(time.Duration(max(clock-q.OldestAvailableAt, 0)))
			}
			srv.rates.fill(qs)
			out.Queues = append(out.Queues, qs)
		}
	}
	return out, nil
}

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

// PauseQueue implements TaskStore.PauseQueue.
func (srv *Server) PauseQueue(ctx context.Context, req *taskstorepb.QueuePauseRequest) (*taskstorepb.QueuePauseResponse, error) {
	res, err := srv.pause(ctx, req, true)
	return res, toStatus(err)
}

// ResumeQueue implements TaskStore.ResumeQueue.
func (srv *Server) ResumeQueue(ctx context.Context, req *taskstorepb.QueuePauseRequest) (*taskstorepb.QueuePauseResponse, error) {
	res, err := srv.pause(ctx, req, false)
	return res, toStatus(err)
}

func (srv *Server) pause(ctx context.Context, req *taskstorepb.QueuePauseRequest, paused bool) (*taskstorepb.QueuePauseResponse, error) {
	if req.Queue == "" {
		return nil, invalid("queue", "required")
	}
	cmd := &fsmpb.Command{Op: fsmpb.Op_OP_PAUSE, Pause: &fsmpb.Pause{Queue: req.Queue, Paused: paused}}
	shard, err := srv.queueShard(ctx, req.Queue, cmd, req.Request, fsm.FormatQueueControls, "pausing a queue")
	if err != nil {
		return nil, err
	}
	res, err := proposeOn(ctx, shard, cmd)
	if err != nil {
		return nil, err
	}
	was := res.GetPause().GetWasPaused()
	if !res.Replayed && was != paused {
		verb := "queue resumed"
		if paused {
			verb = "queue paused: it hands out no claims until resumed"
		}
		srv.log.Info(verb, "queue", req.Queue)
	}
	return &taskstorepb.QueuePauseResponse{WasPaused: was}, nil
}

// SetQueueLimit implements TaskStore.SetQueueLimit.
func (srv *Server) SetQueueLimit(ctx context.Context, req *taskstorepb.QueueLimitRequest) (*taskstorepb.QueueLimitResponse, error) {
	res, err := srv.setLimit(ctx, req)
	return res, toStatus(err)
}

func (srv *Server) setLimit(ctx context.Context, req *taskstorepb.QueueLimitRequest) (*taskstorepb.QueueLimitResponse, error) {
	if req.Queue == "" {
		return nil, invalid("queue", "required")
	}
	cmd := &fsmpb.Command{Op: fsmpb.Op_OP_LIMIT, Limit: &fsmpb.QueueLimit{Queue: req.Queue, MaxClaimed: req.MaxClaimed}}
	shard, err := srv.queueShard(ctx, req.Queue, cmd, req.Request, fsm.FormatQueueControls, "a queue limit")
	if err != nil {
		return nil, err
	}
	res, err := proposeOn(ctx, shard, cmd)
	if err != nil {
		return nil, err
	}
	prev := res.GetLimit().GetPrevious()
	if !res.Replayed && prev != req.MaxClaimed {
		srv.log.Info("queue concurrency limit set", "queue", req.Queue, "max_claimed", req.MaxClaimed, "previous", prev)
	}
	return &taskstorepb.QueueLimitResponse{Previous: prev}, nil
}

// SetQueuePolicy implements TaskStore.SetQueuePolicy.
func (srv *Server) SetQueuePolicy(ctx context.Context, req *taskstorepb.QueuePolicyRequest) (*taskstorepb.QueuePolicyResponse, error) {
	res, err := srv.setPolicy(ctx, req)
	return res, toStatus(err)
}

func (srv *Server) setPolicy(ctx context.Context, req *taskstorepb.QueuePolicyRequest) (*taskstorepb.QueuePolicyResponse, error) {
	if req.Queue == "" {
		return nil, invalid("queue", "required")
	}
	p := req.GetPolicy()
	cmd := &fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Policy: &fsmpb.QueuePolicy{Queue: req.Queue, MaxClaims: p.GetMaxClaims(), DeadLetter: p.GetDeadLetter()}}
	shard, err := srv.queueShard(ctx, req.Queue, cmd, req.Request, fsm.FormatPolicies, "a queue policy")
	if err != nil {
		return nil, err
	}
	res, err := proposeOn(ctx, shard, cmd)
	if err != nil {
		return nil, err
	}
	prev := res.GetPolicy().GetPrevious()
	if !res.Replayed {
		srv.log.Info("queue policy set", "queue", req.Queue, "max_claims", p.GetMaxClaims(), "dead_letter", p.GetDeadLetter(),
			"previous_max_claims", prev.GetMaxClaims(), "previous_dead_letter", prev.GetDeadLetter())
	}
	resp := &taskstorepb.QueuePolicyResponse{}
	if prev != nil {
		resp.Previous = apiPolicy(prev)
	}
	return resp, nil
}

// apiPolicy is a state machine's queue policy as the API shows it.
func apiPolicy(p *fsmpb.QueuePolicy) *taskstorepb.QueuePolicy {
	return &taskstorepb.QueuePolicy{MaxClaims: p.MaxClaims, DeadLetter: p.DeadLetter}
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

// Purge implements TaskStore.Purge.
func (srv *Server) Purge(ctx context.Context, req *taskstorepb.PurgeRequest) (*taskstorepb.PurgeResponse, error) {
	res, err := srv.purge(ctx, req)
	return res, toStatus(err)
}

func (srv *Server) purge(ctx context.Context, req *taskstorepb.PurgeRequest) (*taskstorepb.PurgeResponse, error) {
	if req.Queue == "" {
		return nil, invalid("queue", "required")
	}
	cmd := &fsmpb.Command{Op: fsmpb.Op_OP_PURGE, Purge: &fsmpb.Purge{Queue: req.Queue}}
	shard, err := srv.queueShard(ctx, req.Queue, cmd, req.Request, 0, "")
	if err != nil {
		return nil, err
	}
	res, err := proposeOn(ctx, shard, cmd)
	if err != nil {
		return nil, err
	}
	deleted := res.GetPurge().GetDeleted()
	if !res.Replayed {
		srv.metrics.deleted.WithLabelValues(srv.metrics.groups.label(taskstorepb.GroupOf(req.Queue))).Add(float64(deleted))
		srv.log.Info("queue purged", "queue", req.Queue, "deleted", deleted)
	}
	return &taskstorepb.PurgeResponse{Deleted: deleted}, nil
}
