package proxy

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// The handlers below forward through the client, which routes by
// consistency group, follows leader hints, refreshes the routing table and
// retries what is safe. The proxy adds three things:
//
//  1. A retry budget for callers without a deadline (withBudget).
//  2. Requests the client would refuse itself because they cannot be
//     routed (no queue, an empty queue name, an unknown shard, no claimant)
//     go to any node as they are, so that the caller gets the node's own
//     error, word for word.
//  3. Errors are turned back into the status the node answered with
//     (toStatus).

// maxWait is the longest claim wait a node accepts (rpc.MaxWait; a test
// keeps the two equal without linking the node's code into the proxy).
const maxWait = 5 * time.Minute

// withBudget bounds a request whose caller set no deadline: the client
// retries until its context ends, and a proxy must answer eventually.
// extra is a waiting claim's wait.
func (s *Server) withBudget(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.budget+max(extra, 0))
}

// anyNode sends req to any node unchanged and returns its answer.
func anyNode[Resp any](ctx context.Context, s *Server, op string, fn func(ctx context.Context, cc *grpc.ClientConn) (Resp, error)) (Resp, error) {
	var resp Resp
	err := s.c.CallAnyNode(ctx, op, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = fn(ctx, cc)
		return err
	})
	return resp, err
}

// groupless reports a queue name that names no consistency group ("/x":
// the text before its first '/' is empty). No shard owns it, so routing by
// it would retry until the budget ran out; such requests go to any node,
// which refuses them with its own rule and message.
func groupless(q string) bool { return q != "" && taskstorepb.GroupOf(q) == "" }

// modifyGroupless reports a transaction that names a groupless queue.
func modifyGroupless(req *taskstorepb.ModifyRequest) bool {
	for _, in := range req.Inserts {
		if groupless(in.Queue) {
			return true
		}
	}
	for _, ch := range req.Changes {
		if groupless(ch.Queue) || groupless(ch.NewQueue) {
			return true
		}
	}
	for _, refs := range [][]*taskstorepb.TaskRef{req.Deletes, req.Depends} {
		for _, r := range refs {
			if groupless(r.Queue) {
				return true
			}
		}
	}
	return slices.ContainsFunc(req.GetClaim().GetQueues(), groupless)
}

// namesQueue reports whether a transaction names a queue the client can
// route by.
func namesQueue(req *taskstorepb.ModifyRequest) bool {
	for _, in := range req.Inserts {
		if in.Queue != "" {
			return true
		}
	}
	for _, ch := range req.Changes {
		if ch.Queue != "" || ch.NewQueue != "" {
			return true
		}
	}
	for _, refs := range [][]*taskstorepb.TaskRef{req.Deletes, req.Depends} {
		for _, r := range refs {
			if r.Queue != "" {
				return true
			}
		}
	}
	return slices.ContainsFunc(req.GetClaim().GetQueues(), func(q string) bool { return q != "" })
}

// knownShard reports whether the routing table has shard id, reading the
// table again before saying no (the shard may be new). When the table cannot
// be read it says yes, and the forwarded call reports the outage.
func (s *Server) knownShard(ctx context.Context, id uint32) bool {
	ids, err := s.c.ShardIDs(ctx)
	if err != nil || slices.Contains(ids, id) {
		return true
	}
	rt, err := s.c.Routing(ctx)
	if err != nil {
		return true
	}
	for _, sh := range rt.Shards {
		if sh.Id == id {
			return true
		}
	}
	return false
}

// Modify implements TaskStore.Modify. The caller's request id goes through
// unchanged; without one, the client's own id makes the proxy's retries
// safe.
func (s *Server) Modify(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error) {
	return s.modify(ctx, req, true)
}

// Defaults of Config.ProduceInflightPerStream and ProduceInflight.
const (
	DefaultProduceInflightPerStream = 1024
	DefaultProduceInflight          = 8192
)

// Produce implements TaskStore.Produce: each item is forwarded as the
// Modify it is (request id, deadline, the caller's principal), over the
// proxy's own Produce stream to the leader of the item's group (one per
// node and caller), so that the items of all of a caller's messages that
// go to one node travel together; each is answered alone. The items in
// flight are bounded (Config.ProduceInflight): the stream is read no
// further until one is answered.
func (s *Server) Produce(stream taskstorepb.TaskStore_ProduceServer) error {
	return taskstorepb.ServeProduceBounded(stream, taskstorepb.MaxResponseBytes-64<<10, s.produce, func(ctx context.Context, it *taskstorepb.ProduceItem) *taskstorepb.ProduceAnswer {
		if it.Modify == nil {
			return taskstorepb.FailedAnswer(it.Id, status.Error(codes.InvalidArgument, "modify: required"))
		}
		resp, err := s.modify(ctx, it.Modify, true)
		if err != nil {
			return taskstorepb.FailedAnswer(it.Id, err)
		}
		return &taskstorepb.ProduceAnswer{Id: it.Id, Modify: resp}
	})
}

// modify forwards a Modify, over the client's Produce stream when
// streamed.
func (s *Server) modify(ctx context.Context, req *taskstorepb.ModifyRequest, streamed bool) (resp *taskstorepb.ModifyResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	switch {
	case !namesQueue(req) || modifyGroupless(req):
		resp, err = anyNode(bctx, s, "Modify", func(ctx context.Context, cc *grpc.ClientConn) (*taskstorepb.ModifyResponse, error) {
			return taskstorepb.NewTaskStoreClient(cc).Modify(ctx, req)
		})
	case streamed:
		resp, err = s.c.ModifyStreamed(bctx, req)
		// The client filled in repeated tasks' values: send each once again.
		taskstorepb.CompactInserted(resp)
	default:
		resp, err = s.c.Modify(bctx, req)
		taskstorepb.CompactInserted(resp)
	}
	return resp, s.toStatus(ctx, "Modify", err)
}

// Claim implements TaskStore.Claim. Unlike a node, the proxy accepts queues
// of several consistency groups: their shards are tried in turn, as the Go
// client does.
func (s *Server) Claim(ctx context.Context, req *taskstorepb.ClaimRequest) (resp *taskstorepb.ClaimResponse, err error) {
	groups := map[string]bool{}
	for _, q := range req.Queues {
		groups[taskstorepb.GroupOf(q)] = true
	}
	if req.Claimant == "" && len(groups) > 1 {
		return nil, status.Error(codes.InvalidArgument, "claimant: required: say who is claiming")
	}
	var wait time.Duration
	badWait := req.Wait != nil && (!req.Wait.IsValid() || req.Wait.AsDuration() < 0 || req.Wait.AsDuration() > maxWait)
	if req.Wait != nil && !badWait {
		wait = req.Wait.AsDuration()
	}
	bctx, cancel := s.withBudget(ctx, wait)
	defer cancel()
	if len(req.Queues) == 0 || slices.Contains(req.Queues, "") || slices.ContainsFunc(req.Queues, groupless) || req.Claimant == "" || badWait {
		// The node checks these before routing: any node answers. (The
		// client would shorten a long wait to the deadline instead.)
		resp, err = anyNode(bctx, s, "Claim", func(ctx context.Context, cc *grpc.ClientConn) (*taskstorepb.ClaimResponse, error) {
			return taskstorepb.NewTaskStoreClient(cc).Claim(ctx, req)
		})
		return resp, s.toStatus(ctx, "Claim", err)
	}
	if len(groups) > 1 && req.Request != nil {
		// One request id cannot serve several shards' claims (a shard
		// would answer a second round of a waiting claim from its record
		// of the first), so each group's claim gets the client's own id.
		// The proxy's retries stay safe; a caller's retry of the whole
		// claim may take other tasks, and those of the first attempt come
		// back when their lease runs out.
		r := proto.CloneOf(req)
		r.Request = nil
		req = r
	}
	resp, err = s.c.Claim(bctx, req)
	if err != nil && len(resp.GetTasks()) > 0 {
		// A claim over several groups failed on a later shard after an
		// earlier one gave tasks: they are leased to the caller now, so
		// return them rather than strand them until the lease runs out.
		s.log.Debug("claim: returning tasks claimed before an error", "tasks", len(resp.Tasks), "err", err)
		return &taskstorepb.ClaimResponse{Tasks: resp.Tasks}, nil
	}
	return resp, s.toStatus(ctx, "Claim", err)
}

// Tasks implements TaskStore.Tasks. Ids without a queue or shard are looked
// up on every shard.
func (s *Server) Tasks(ctx context.Context, req *taskstorepb.TasksRequest) (resp *taskstorepb.TasksResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	if req.Shard != 0 && !s.knownShard(bctx, req.Shard) || req.Shard == 0 && (req.Queue == "" && len(req.Ids) == 0 || groupless(req.Queue)) {
		resp, err = anyNode(bctx, s, "Tasks", func(ctx context.Context, cc *grpc.ClientConn) (*taskstorepb.TasksResponse, error) {
			return taskstorepb.NewTaskStoreClient(cc).Tasks(ctx, req)
		})
	} else {
		resp, err = s.c.Tasks(bctx, req)
	}
	return resp, s.toStatus(ctx, "Tasks", err)
}

// Queues implements TaskStore.Queues. Without a shard every shard is asked
// at its leader.
func (s *Server) Queues(ctx context.Context, req *taskstorepb.QueuesRequest) (resp *taskstorepb.QueuesResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	if req.Shard != 0 && !s.knownShard(bctx, req.Shard) {
		resp, err = anyNode(bctx, s, "Queues", func(ctx context.Context, cc *grpc.ClientConn) (*taskstorepb.QueuesResponse, error) {
			return taskstorepb.NewTaskStoreClient(cc).Queues(ctx, req)
		})
	} else {
		resp, err = s.c.Queues(bctx, req)
	}
	return resp, s.toStatus(ctx, "Queues", err)
}

// Time implements TaskStore.Time: a node's clock.
func (s *Server) Time(ctx context.Context, req *taskstorepb.TimeRequest) (resp *taskstorepb.TimeResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	now, err := s.c.Time(bctx)
	if err != nil {
		return nil, s.toStatus(ctx, "Time", err)
	}
	return &taskstorepb.TimeResponse{Now: timestamppb.New(now)}, nil
}

// Purge implements TaskStore.Purge. The caller's request id goes through
// unchanged; without one, the client's own id makes the proxy's retries
// safe.
func (s *Server) Purge(ctx context.Context, req *taskstorepb.PurgeRequest) (resp *taskstorepb.PurgeResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	purge := func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).Purge(ctx, req)
		return err
	}
	switch {
	case req.Queue == "" || groupless(req.Queue):
		err = s.c.CallAnyNode(bctx, "Purge", purge)
	case req.Request != nil:
		err = s.c.CallGroup(bctx, "Purge", taskstorepb.GroupOf(req.Queue), purge)
	default:
		var n uint64
		n, err = s.c.Purge(bctx, req.Queue)
		resp = &taskstorepb.PurgeResponse{Deleted: n}
	}
	if err != nil {
		return nil, s.toStatus(ctx, "Purge", err)
	}
	return resp, nil
}

// PauseQueue implements TaskStore.PauseQueue; request ids as in Purge.
func (s *Server) PauseQueue(ctx context.Context, req *taskstorepb.QueuePauseRequest) (*taskstorepb.QueuePauseResponse, error) {
	return s.setPaused(ctx, "PauseQueue", req)
}

// ResumeQueue implements TaskStore.ResumeQueue; request ids as in Purge.
func (s *Server) ResumeQueue(ctx context.Context, req *taskstorepb.QueuePauseRequest) (*taskstorepb.QueuePauseResponse, error) {
	return s.setPaused(ctx, "ResumeQueue", req)
}

func (s *Server) setPaused(ctx context.Context, method string, req *taskstorepb.QueuePauseRequest) (resp *taskstorepb.QueuePauseResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	call := func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		ts := taskstorepb.NewTaskStoreClient(cc)
		if method == "PauseQueue" {
			resp, err = ts.PauseQueue(ctx, req)
		} else {
			resp, err = ts.ResumeQueue(ctx, req)
		}
		return err
	}
	switch {
	case req.Queue == "" || groupless(req.Queue):
		err = s.c.CallAnyNode(bctx, method, call)
	case req.Request != nil:
		err = s.c.CallGroup(bctx, method, taskstorepb.GroupOf(req.Queue), call)
	default:
		var was bool
		if method == "PauseQueue" {
			was, err = s.c.PauseQueue(bctx, req.Queue)
		} else {
			was, err = s.c.ResumeQueue(bctx, req.Queue)
		}
		resp = &taskstorepb.QueuePauseResponse{WasPaused: was}
	}
	if err != nil {
		return nil, s.toStatus(ctx, method, err)
	}
	return resp, nil
}

// SetQueuePolicy implements TaskStore.SetQueuePolicy; request ids as in Purge.
func (s *Server) SetQueuePolicy(ctx context.Context, req *taskstorepb.QueuePolicyRequest) (resp *taskstorepb.QueuePolicyResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	call := func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).SetQueuePolicy(ctx, req)
		return err
	}
	switch {
	case req.Queue == "" || groupless(req.Queue):
		err = s.c.CallAnyNode(bctx, "SetQueuePolicy", call)
	case req.Request != nil:
		err = s.c.CallGroup(bctx, "SetQueuePolicy", taskstorepb.GroupOf(req.Queue), call)
	default:
		var prev *taskstorepb.QueuePolicy
		prev, err = s.c.SetQueuePolicy(bctx, req.Queue, req.Policy)
		resp = &taskstorepb.QueuePolicyResponse{Previous: prev}
	}
	if err != nil {
		return nil, s.toStatus(ctx, "SetQueuePolicy", err)
	}
	return resp, nil
}

// SetQueueLimit implements TaskStore.SetQueueLimit; request ids as in Purge.
func (s *Server) SetQueueLimit(ctx context.Context, req *taskstorepb.QueueLimitRequest) (resp *taskstorepb.QueueLimitResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	call := func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).SetQueueLimit(ctx, req)
		return err
	}
	switch {
	case req.Queue == "" || groupless(req.Queue):
		err = s.c.CallAnyNode(bctx, "SetQueueLimit", call)
	case req.Request != nil:
		err = s.c.CallGroup(bctx, "SetQueueLimit", taskstorepb.GroupOf(req.Queue), call)
	default:
		var prev uint32
		prev, err = s.c.SetQueueLimit(bctx, req.Queue, req.MaxClaimed)
		resp = &taskstorepb.QueueLimitResponse{Previous: prev}
	}
	if err != nil {
		return nil, s.toStatus(ctx, "SetQueueLimit", err)
	}
	return resp, nil
}

// PutSchedule implements TaskStore.PutSchedule; request ids as in Purge.
func (s *Server) PutSchedule(ctx context.Context, req *taskstorepb.PutScheduleRequest) (resp *taskstorepb.PutScheduleResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	queue := req.GetSchedule().GetQueue()
	call := func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).PutSchedule(ctx, req)
		return err
	}
	switch {
	case queue == "" || groupless(queue):
		err = s.c.CallAnyNode(bctx, "PutSchedule", call)
	case req.Request != nil:
		err = s.c.CallGroup(bctx, "PutSchedule", taskstorepb.GroupOf(queue), call)
	default:
		var stored *taskstorepb.Schedule
		var replaced bool
		stored, replaced, err = s.c.PutSchedule(bctx, req.Schedule)
		resp = &taskstorepb.PutScheduleResponse{Schedule: stored, Replaced: replaced}
	}
	if err != nil {
		return nil, s.toStatus(ctx, "PutSchedule", err)
	}
	return resp, nil
}

// DeleteSchedule implements TaskStore.DeleteSchedule; request ids as in
// Purge.
func (s *Server) DeleteSchedule(ctx context.Context, req *taskstorepb.DeleteScheduleRequest) (resp *taskstorepb.DeleteScheduleResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	call := func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).DeleteSchedule(ctx, req)
		return err
	}
	switch {
	case req.Queue == "" || groupless(req.Queue):
		err = s.c.CallAnyNode(bctx, "DeleteSchedule", call)
	case req.Request != nil:
		err = s.c.CallGroup(bctx, "DeleteSchedule", taskstorepb.GroupOf(req.Queue), call)
	default:
		var deleted bool
		deleted, err = s.c.DeleteSchedule(bctx, req.Name, req.Queue)
		resp = &taskstorepb.DeleteScheduleResponse{Deleted: deleted}
	}
	if err != nil {
		return nil, s.toStatus(ctx, "DeleteSchedule", err)
	}
	return resp, nil
}

// Schedules implements TaskStore.Schedules: every shard's, through the
// client's fan-out.
func (s *Server) Schedules(ctx context.Context, req *taskstorepb.SchedulesRequest) (resp *taskstorepb.SchedulesResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	if req.Shard != 0 && !s.knownShard(bctx, req.Shard) {
		resp, err = anyNode(bctx, s, "Schedules", func(ctx context.Context, cc *grpc.ClientConn) (*taskstorepb.SchedulesResponse, error) {
			return taskstorepb.NewTaskStoreClient(cc).Schedules(ctx, req)
		})
	} else {
		resp, err = s.c.Schedules(bctx, req)
	}
	return resp, s.toStatus(ctx, "Schedules", err)
}

// Status implements Admin.Status: any node's view of the cluster.
func (s *Server) Status(ctx context.Context, req *taskstorepb.StatusRequest) (resp *taskstorepb.StatusResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	resp, err = s.c.Status(bctx, req)
	return resp, s.toStatus(ctx, "Status", err)
}

// Routing implements Admin.Routing: the cluster's table, with the nodes'
// addresses (a Go client given a proxy's address and told to route directly
// goes to the nodes from then on). The proxy routes by the answer too.
func (s *Server) Routing(ctx context.Context, req *taskstorepb.RoutingRequest) (resp *taskstorepb.RoutingResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	resp, err = s.c.Routing(bctx)
	return resp, s.toStatus(ctx, "Routing", err)
}

// TransferLeader implements Admin.TransferLeader, sent to the shard's
// current leader.
func (s *Server) TransferLeader(ctx context.Context, req *taskstorepb.TransferLeaderRequest) (resp *taskstorepb.TransferLeaderResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	if req.Shard == 0 || !s.knownShard(bctx, req.Shard) {
		resp, err = anyNode(bctx, s, "TransferLeader", func(ctx context.Context, cc *grpc.ClientConn) (*taskstorepb.TransferLeaderResponse, error) {
			return taskstorepb.NewAdminClient(cc).TransferLeader(ctx, req)
		})
	} else {
		resp, err = s.c.TransferLeader(bctx, req)
	}
	return resp, s.toStatus(ctx, "TransferLeader", err)
}

// AddNode implements Admin.AddNode: any node hands it to the meta leader.
func (s *Server) AddNode(ctx context.Context, req *taskstorepb.AddNodeRequest) (resp *taskstorepb.AddNodeResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	resp, err = anyNode(bctx, s, "AddNode", func(ctx context.Context, cc *grpc.ClientConn) (*taskstorepb.AddNodeResponse, error) {
		return taskstorepb.NewAdminClient(cc).AddNode(ctx, req)
	})
	return resp, s.toStatus(ctx, "AddNode", err)
}

// RemoveNode implements Admin.RemoveNode: any node hands it to the meta
// leader.
func (s *Server) RemoveNode(ctx context.Context, req *taskstorepb.RemoveNodeRequest) (resp *taskstorepb.RemoveNodeResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	resp, err = anyNode(bctx, s, "RemoveNode", func(ctx context.Context, cc *grpc.ClientConn) (*taskstorepb.RemoveNodeResponse, error) {
		return taskstorepb.NewAdminClient(cc).RemoveNode(ctx, req)
	})
	return resp, s.toStatus(ctx, "RemoveNode", err)
}

// RebuildReplica implements Admin.RebuildReplica: any node hands it to the
// shard's leader.
func (s *Server) RebuildReplica(ctx context.Context, req *taskstorepb.RebuildReplicaRequest) (resp *taskstorepb.RebuildReplicaResponse, err error) {
	bctx, cancel := s.withBudget(ctx, 0)
	defer cancel()
	resp, err = anyNode(bctx, s, "RebuildReplica", func(ctx context.Context, cc *grpc.ClientConn) (*taskstorepb.RebuildReplicaResponse, error) {
		return taskstorepb.NewAdminClient(cc).RebuildReplica(ctx, req)
	})
	return resp, s.toStatus(ctx, "RebuildReplica", err)
}

// Backup implements Admin.Backup: the copy of a shard streams from a
// caught-up follower the leader redirects the proxy's client to, else from
// the leader (the cluster map from the meta leader), through the proxy, one
// chunk at a time: the proxy holds at most a chunk and what gRPC's flow
// control lets it queue for the caller. The caller's principal travels to
// the node, which checks the admin role as for a direct call.
func (s *Server) Backup(req *taskstorepb.BackupRequest, stream grpc.ServerStreamingServer[taskstorepb.BackupChunk]) error {
	ctx := stream.Context()
	if req.Shard != 0 && !s.knownShard(ctx, req.Shard) {
		return status.Errorf(codes.NotFound, "shard %d does not exist", req.Shard)
	}
	r := &backupRelay{stream: stream}
	_, err := s.c.BackupStream(ctx, req.Shard, func(info *taskstorepb.BackupInfo) { r.info = info }, r)
	if err == nil {
		err = r.flush()
	}
	return s.toStatus(ctx, "Backup", err)
}

// backupRelay sends what the copy's stream writes to the caller, the
// copy's info with the first bytes.
type backupRelay struct {
	stream grpc.ServerStreamingServer[taskstorepb.BackupChunk]
	info   *taskstorepb.BackupInfo
	sent   bool
}

func (r *backupRelay) Write(p []byte) (int, error) {
	if err := r.stream.Send(&taskstorepb.BackupChunk{Info: r.info, Data: p}); err != nil {
		return 0, fmt.Errorf("proxy: send the copy to the caller: %w", err)
	}
	r.info, r.sent = nil, true
	return len(p), nil
}

// flush sends the info of a copy that had no bytes (none has).
func (r *backupRelay) flush() error {
	if r.sent || r.info == nil {
		return nil
	}
	return r.stream.Send(&taskstorepb.BackupChunk{Info: r.info})
}
