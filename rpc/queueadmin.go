package rpc

import (
	"context"
	"math"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

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
	var retain time.Duration
	if r := p.GetRetain(); r != nil {
		if err := r.CheckValid(); err != nil || r.AsDuration() < 0 {
			return nil, invalid("policy.retain", "not a duration of 0 or more")
		}
		retain = r.AsDuration()
	}
	interval, burst, err := rateOf(p)
	if err != nil {
		return nil, err
	}
	cmd := &fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Policy: &fsmpb.QueuePolicy{Queue: req.Queue, MaxClaims: p.GetMaxClaims(), DeadLetter: p.GetDeadLetter(),
		Retain: int64(retain), RateInterval: interval, Burst: burst}}
	minFormat, what := fsm.FormatPolicies, "a queue policy"
	switch {
	case interval > 0:
		minFormat, what = fsm.FormatRate, "a queue policy's rate"
	case retain > 0:
		minFormat, what = fsm.FormatRetention, "a queue policy's retention"
	}
	shard, err := srv.queueShard(ctx, req.Queue, cmd, req.Request, minFormat, what)
	if err != nil {
		return nil, err
	}
	res, err := proposeOn(ctx, shard, cmd)
	if err != nil {
		return nil, err
	}
	prev := res.GetPolicy().GetPrevious()
	if !res.Replayed {
		srv.log.Info("queue policy set", "queue", req.Queue, "max_claims", p.GetMaxClaims(), "dead_letter", p.GetDeadLetter(), "retain", retain,
			"rate_interval", time.Duration(interval), "burst", burst,
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
	ap := &taskstorepb.QueuePolicy{MaxClaims: p.MaxClaims, DeadLetter: p.DeadLetter}
	if p.Retain > 0 {
		ap.Retain = durationpb.New(time.Duration(p.Retain))
	}
	if p.RateInterval > 0 {
		ap.Rate, ap.Burst = float64(time.Second)/float64(p.RateInterval), p.Burst
	}
	return ap
}

// rateOf is a policy's rate as the state machine keeps it: the nanoseconds
// between two tokens (0: no rate) and the burst, a tenth of a second's
// tokens (at least 1) when the request gives none.
func rateOf(p *taskstorepb.QueuePolicy) (interval int64, burst uint32, err error) {
	r := p.GetRate()
	switch {
	case r == 0:
		if p.GetBurst() != 0 {
			return 0, 0, invalid("policy.burst", "needs a rate")
		}
		return 0, 0, nil
	case math.IsNaN(r) || r < 0 || math.IsInf(r, 0):
		return 0, 0, invalid("policy.rate", "not a number of tasks a second of 0 or more")
	}
	iv := math.Round(float64(time.Second) / r)
	if iv < 1 || iv > float64(fsm.MaxRateInterval) {
		return 0, 0, invalid("policy.rate", "%g a second is outside one an hour to one a nanosecond", r)
	}
	burst = p.GetBurst()
	if burst == 0 {
		burst = uint32(max(1, math.Ceil(r/10)))
	}
	if burst > fsm.MaxBurst {
		return 0, 0, invalid("policy.burst", "%d is over the most of %d", burst, fsm.MaxBurst)
	}
	return int64(iv), burst, nil
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
