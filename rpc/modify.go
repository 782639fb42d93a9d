package rpc

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"math"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/auth"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

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
