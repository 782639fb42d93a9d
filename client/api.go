package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// Aliases of the API's messages, so that most callers need only this package.
type (
	Task       = taskstorepb.Task
	QueueStats = taskstorepb.QueueStats
	RefError   = taskstorepb.RefError
)

// Modify applies a transaction atomically on the shard that owns its
// consistency group. A refused transaction returns a *DependencyError that
// lists every offending reference. The request id (set unless req has one)
// is the same for every attempt, so a retry after an unknown outcome never
// applies twice. An empty Claimant is the Client's. req is not modified.
//
// With req.Claim the same request, and the same log entry, then claims up
// to req.Claim.Limit tasks of req.Claim.Queues (the transaction's
// consistency group) for the claimant, like a Claim that does not wait:
// ModifyResponse.Claimed holds them, empty when none was available or the
// transaction was refused. A worker that commits a task and wants the next
// one pays one round trip and one log entry instead of two.
func (c *Client) Modify(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error) {
	return c.modify(ctx, req, false)
}

// modifyGroup is the consistency group of the first queue a transaction
// names; the cluster checks that the others agree. A first queue whose
// name breaks the name rule is refused with the nodes' words.
func modifyGroup(req *taskstorepb.ModifyRequest) (string, error) {
	group := func(q string) (string, error) {
		if err := taskstorepb.CheckQueue(q); err != nil {
			return "", err
		}
		return taskstorepb.GroupOf(q), nil
	}
	for _, in := range req.Inserts {
		if in.Queue != "" {
			return group(in.Queue)
		}
	}
	for _, ch := range req.Changes {
		if q := cmp.Or(ch.Queue, ch.NewQueue); q != "" {
			return group(q)
		}
	}
	for _, refs := range [][]*taskstorepb.TaskRef{req.Deletes, req.Depends} {
		for _, r := range refs {
			if r.Queue != "" {
				return group(r.Queue)
			}
		}
	}
	for _, q := range req.GetClaim().GetQueues() {
		if q != "" {
			return group(q)
		}
	}
	return "", nil
}

// Claim takes up to req.Limit (default 1) available tasks from req.Queues
// under a lease. The queues may belong to several consistency groups: each
// group is asked in the order its first queue appears, without waiting,
// until the limit is reached; if none had a task and req.Wait is set, the
// groups are then asked in turn with a waiting claim each (a single group
// waits the whole time; several share it in slices of at most a second), so
// a claim never takes more than the limit. The wait is clamped so that an
// empty result, not a deadline error, comes back before ctx's deadline. An
// empty Claimant is the Client's. A request id given in req is used only when
// the queues form one group.
func (c *Client) Claim(ctx context.Context, req *taskstorepb.ClaimRequest) (*taskstorepb.ClaimResponse, error) {
	if len(req.Queues) == 0 {
		return nil, fmt.Errorf("claim: name at least one queue: %w", ErrInvalid)
	}
	limit := max(req.Limit, 1)
	wait := req.Wait.AsDuration()
	if req.Wait == nil || wait < 0 {
		wait = 0
	}
	if dl, ok := ctx.Deadline(); ok && wait > 0 {
		left := time.Until(dl)
		wait = min(wait, left-min(left/10, time.Second))
		wait = max(wait, 0)
	}
	var groups [][]string // queues by group, in order of first appearance
	if c.opts.proxyOnly {
		groups = [][]string{req.Queues} // the proxy splits them
	} else {
		index := map[string]int{}
		for _, q := range req.Queues {
			g := taskstorepb.GroupOf(q)
			i, ok := index[g]
			if !ok {
				i = len(groups)
				index[g] = i
				groups = append(groups, nil)
			}
			groups[i] = append(groups[i], q)
		}
	}
	if len(groups) > 1 && req.Request != nil {
		return nil, fmt.Errorf("claim: a request id needs queues of one consistency group: %w", ErrInvalid)
	}
	one := func(queues []string, limit uint32, wait time.Duration) (*taskstorepb.ClaimResponse, error) {
		r := &taskstorepb.ClaimRequest{Claimant: cmp.Or(req.Claimant, c.opts.claimant), Queues: queues,
			Lease: req.Lease, Limit: limit, Request: req.Request}
		return c.claimGroup(ctx, r, wait)
	}
	if len(groups) == 1 {
		resp, err := one(groups[0], limit, wait)
		if resp == nil {
			resp = &taskstorepb.ClaimResponse{}
		}
		return resp, err
	}
	// Several groups: the tasks of each, and, when none was claimed, why
	// each group's queues handed out nothing (ClaimResponse.empty_reason).
	var out []*taskstorepb.Task
	var why []string
	empty := func() *taskstorepb.ClaimResponse {
		return &taskstorepb.ClaimResponse{EmptyReason: strings.Join(why, "; ")}
	}
	for _, qs := range groups {
		resp, err := one(qs, limit-uint32(len(out)), 0)
		out = append(out, resp.GetTasks()...)
		if r := resp.GetEmptyReason(); r != "" && !slices.Contains(why, r) {
			why = append(why, r)
		}
		if err != nil {
			return &taskstorepb.ClaimResponse{Tasks: out}, err
		}
		if len(out) >= int(limit) {
			break
		}
	}
	if len(out) > 0 {
		return &taskstorepb.ClaimResponse{Tasks: out}, nil
	}
	if wait == 0 {
		return empty(), nil
	}
	end := time.Now().Add(wait)
	for i := 0; ; i++ {
		left := time.Until(end)
		if left <= 0 {
			return empty(), nil
		}
		resp, err := one(groups[i%len(groups)], limit, min(left, time.Second))
		if err != nil || len(resp.GetTasks()) > 0 {
			return &taskstorepb.ClaimResponse{Tasks: resp.GetTasks()}, err
		}
	}
}

// claimGroup claims from queues of one group. Every attempt carries the same
// request id and the wait that is left, so a retry neither claims twice nor
// waits longer than asked.
func (c *Client) claimGroup(ctx context.Context, req *taskstorepb.ClaimRequest, wait time.Duration) (*taskstorepb.ClaimResponse, error) {
	if req.Request == nil {
		var release func()
		req.Request, release = c.nextRequestID()
		defer release()
	}
	group := ""
	if !c.opts.proxyOnly {
		group = taskstorepb.GroupOf(req.Queues[0])
	}
	end := time.Now().Add(wait)
	var resp *taskstorepb.ClaimResponse
	err := c.call(ctx, "Claim", target{group: group}, wait, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		r := req
		if wait > 0 {
			r = &taskstorepb.ClaimRequest{Claimant: req.Claimant, Queues: req.Queues, Lease: req.Lease, Limit: req.Limit,
				Request: req.Request, Wait: durationpb.New(max(time.Until(end), 0))}
		}
		resp, err = taskstorepb.NewTaskStoreClient(cc).Claim(ctx, r)
		return err
	})
	return resp, err
}

// Tasks reads tasks: a page of req.Queue, or the tasks with req.Ids. Ids
// without a queue or shard are looked up on every shard (each at its leader)
// and the results merged.
func (c *Client) Tasks(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error) {
	if req.Queue == "" && req.Shard == 0 && len(req.Ids) > 0 && !c.opts.proxyOnly {
		l := &idLookup{rt: &c.rt, tasks: c.Tasks, base: c.opts.backoffBase, most: c.opts.backoffMax}
		return l.run(ctx, req)
	}
	t := target{shard: req.Shard}
	if req.Shard == 0 {
		if req.Queue == "" && !c.opts.proxyOnly {
			return nil, fmt.Errorf("tasks: give a queue, ids or a shard: %w", ErrInvalid)
		}
		t.group = taskstorepb.GroupOf(req.Queue)
	}
	var resp *taskstorepb.TasksResponse
	err := c.call(ctx, "Tasks", t, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).Tasks(ctx, req)
		return err
	})
	return resp, err
}

// idLookup asks every shard for a list of ids (Tasks without a queue or a
// shard) through tasks, each at its leader.
type idLookup struct {
	rt         *router
	tasks      func(context.Context, *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error)
	base, most time.Duration // the pause between passes (WithBackoff)
}

// run asks every shard for req.Ids, and answers only when every shard did. A shard that failed may hold a task the others do not (it
// would be reported absent) or another group's task with an id the others
// found (ids are unique within a group only: Get would take one copy for
// the only one, and a delete by id alone would act on it), so the shards'
// errors are returned instead.
func (l *idLookup) run(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error) {
	bound := l.base
	for {
		out, complete, err := l.once(ctx, req)
		if err != nil {
			return nil, err
		}
		if complete {
			order := make(map[string]int, len(req.Ids))
			for i, id := range req.Ids {
				if _, ok := order[id]; !ok {
					order[id] = i
				}
			}
			slices.SortStableFunc(out.Tasks, func(a, b *taskstorepb.Task) int { return cmp.Compare(order[a.Id], order[b.Id]) })
			return out, nil
		}
		// A slot moved between the shards' answers: a task of it may be
		// missing, or there twice. Ask again with a fresh routing table.
		l.rt.markStale()
		if !pause(ctx, &bound, l.most) {
			return nil, fmt.Errorf("tasks: a slot kept moving between the shards' answers: %w: %w", ErrUnavailable, ctx.Err())
		}
	}
}

// once asks every shard once and reports whether the answers cover
// every hash slot exactly once (TasksResponse.served_slots; answers of
// nodes that predate slot moves carry none and are taken as they are).
func (l *idLookup) once(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, bool, error) {
	out := &taskstorepb.TasksResponse{}
	var mu sync.Mutex
	var errs []error
	var served [][]byte
	legacy := false
	l.rt.eachShard(ctx, func(ctx context.Context, shard uint32) {
		r := proto.CloneOf(req) // filters included: a node refuses them with ids
		r.Shard = shard
		resp, err := l.tasks(ctx, r)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("shard %d: %w", shard, err))
			return
		}
		out.Tasks = append(out.Tasks, resp.Tasks...)
		if len(resp.ServedSlots) == 0 {
			legacy = true
		}
		served = append(served, resp.ServedSlots)
	}, &errs)
	if len(errs) > 0 {
		return nil, false, errors.Join(errs...)
	}
	if legacy {
		return out, true, nil
	}
	t, err := l.rt.current(ctx)
	if err != nil {
		return nil, false, err
	}
	return out, coversOnce(served, len(t.slots)), nil
}

// coversOnce reports whether the bitmaps together set each of the first
// slots bits exactly once.
func coversOnce(maps [][]byte, slots int) bool {
	if len(maps) == 0 || slots == 0 {
		return false
	}
	for s := 0; s < slots; s++ {
		n := 0
		for _, m := range maps {
			if s/8 < len(m) && m[s/8]&(1<<(s%8)) != 0 {
				n++
			}
		}
		if n != 1 {
			return false
		}
	}
	return true
}

// eachShard runs fn for every shard of the routing table concurrently. An
// error getting the table is appended to errs.
func (r *router) eachShard(ctx context.Context, fn func(ctx context.Context, shard uint32), errs *[]error) {
	ids, err := r.shardIDs(ctx)
	if err != nil {
		*errs = append(*errs, err)
		return
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() { fn(ctx, id) })
	}
	wg.Wait()
}

// Queues lists queues with their counts. With req.Shard unset every shard
// is asked at its leader and the results merged, sorted by name, and cut to
// req.Limit.
func (c *Client) Queues(ctx context.Context, req *taskstorepb.QueuesRequest) (*taskstorepb.QueuesResponse, error) {
	if req.Shard == 0 && !c.opts.proxyOnly {
		out := &taskstorepb.QueuesResponse{}
		var mu sync.Mutex
		var errs []error
		c.rt.eachShard(ctx, func(ctx context.Context, shard uint32) {
			r := &taskstorepb.QueuesRequest{Prefix: req.Prefix, Shard: shard, Limit: req.Limit, Stale: req.Stale}
			resp, err := c.Queues(ctx, r)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("shard %d: %w", shard, err))
			} else {
				out.Queues = append(out.Queues, resp.Queues...)
			}
		}, &errs)
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		slices.SortFunc(out.Queues, func(a, b *taskstorepb.QueueStats) int { return cmp.Compare(a.Name, b.Name) })
		if req.Limit > 0 && len(out.Queues) > int(req.Limit) {
			out.Queues = out.Queues[:req.Limit]
		}
		return out, nil
	}
	var resp *taskstorepb.QueuesResponse
	err := c.call(ctx, "Queues", target{shard: req.Shard}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).Queues(ctx, req)
		return err
	})
	return resp, err
}

// Time returns the clock of a node.
func (c *Client) Time(ctx context.Context) (time.Time, error) {
	var resp *taskstorepb.TimeResponse
	err := c.call(ctx, "Time", target{anyNode: true}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewTaskStoreClient(cc).Time(ctx, &taskstorepb.TimeRequest{})
		return err
	})
	if err != nil {
		return time.Time{}, err
	}
	return resp.Now.AsTime(), nil
}

// Status describes the cluster's nodes and shards, as one node sees it.
func (c *Client) Status(ctx context.Context, req *taskstorepb.StatusRequest) (*taskstorepb.StatusResponse, error) {
	if req == nil {
		req = &taskstorepb.StatusRequest{}
	}
	var resp *taskstorepb.StatusResponse
	err := c.call(ctx, "Status", target{anyNode: true}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewAdminClient(cc).Status(ctx, req)
		return err
	})
	return resp, err
}

// Routing reads the routing table from a node and, unless the Client is
// proxy-only, routes by it from then on.
func (c *Client) Routing(ctx context.Context) (*taskstorepb.RoutingResponse, error) {
	var resp *taskstorepb.RoutingResponse
	err := c.call(ctx, "Routing", target{anyNode: true}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewAdminClient(cc).Routing(ctx, &taskstorepb.RoutingRequest{})
		return err
	})
	if err == nil && !c.opts.proxyOnly && len(resp.Slots) > 0 {
		c.rt.apply(resp)
	}
	return resp, err
}

// TransferLeader moves a shard's leadership, to req.To or, when empty, to a
// replica the shard's leader picks. The request goes to the current leader.
// If req.To already leads (before the call, or when a retry finds it), that
// is success.
func (c *Client) TransferLeader(ctx context.Context, req *taskstorepb.TransferLeaderRequest) (*taskstorepb.TransferLeaderResponse, error) {
	if req.Shard == 0 {
		return nil, fmt.Errorf("transfer leader: name a shard: %w", ErrInvalid)
	}
	var resp *taskstorepb.TransferLeaderResponse
	t := target{shard: req.Shard}
	if c.opts.proxyOnly {
		t = target{anyNode: true}
	} else if req.To != "" && leaderOf(c.Routing(ctx))(req.Shard) == req.To {
		return &taskstorepb.TransferLeaderResponse{Leader: req.To}, nil // nothing to move
	}
	err := c.call(ctx, "TransferLeader", t, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = taskstorepb.NewAdminClient(cc).TransferLeader(ctx, req)
		if st, ok := status.FromError(err); ok && req.To != "" {
			for _, d := range st.Details() {
				if nl, ok := d.(*taskstorepb.NotLeader); ok && nl.LeaderId == req.To {
					resp, err = &taskstorepb.TransferLeaderResponse{Leader: nl.LeaderId}, nil
				}
			}
		}
		return err
	})
	if err == nil && resp.Leader == "" && !c.opts.proxyOnly {
		// The old leader may answer before it learns who won.
		resp.Leader = cmp.Or(req.To, leaderOf(c.Routing(ctx))(req.Shard))
	}
	return resp, err
}

// leaderOf answers, from a routing table read afresh, the id of a shard's
// leader ("" when unknown or the read failed).
func leaderOf(rt *taskstorepb.RoutingResponse, err error) func(shard uint32) string {
	return func(shard uint32) string {
		if err != nil {
			return ""
		}
		for _, s := range rt.Shards {
			if s.Id == shard {
				return s.LeaderId
			}
		}
		return ""
	}
}
