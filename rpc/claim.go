package rpc

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

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
