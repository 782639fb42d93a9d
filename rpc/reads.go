package rpc

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

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
