package cluster

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster/peerpb"
	"github.com/e1158ecb/taskstore/fsm"
)

// formatGate raises the state format of the shards this node leads once
// every replica's node can apply it.
type formatGate struct {
	self string
	// every is Tuning.FormatEvery (< 0: raised by hand only); timeout is
	// Tuning.ApplyTimeout.
	every, timeout time.Duration
	log            *slog.Logger
	// report asks the node at an address for its report (peerClient).
	report func(ctx context.Context, addr string) *peerpb.NodeReport
	// local lists the replicas hosted here.
	local func() []*Shard
	// cap, when set (tests), is the highest state format this node says
	// it applies instead of fsm.MaxFormat: a node of an older binary.
	cap atomic.Pointer[uint32]
}

// loop raises the state format of the shards this node leads once every
// replica's node can apply it (raise), looking every Tuning.FormatEvery
// until stop closes; once every shard is raised a look costs a read per
// local shard.
func (f *formatGate) loop(stop <-chan struct{}) {
	every := f.every
	if every == 0 {
		every = DefaultTuning().FormatEvery
	}
	if every < 0 {
		return // raised by hand only (tests of an upgrade)
	}
	for sleepUntil(stop, every) {
		for _, s := range f.local() {
			ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
			if _, err := f.raise(ctx, s); err != nil {
				f.log.Debug("raise state format", "shard", s.id, "err", err)
			}
			cancel()
		}
	}
}

// RaiseFormat proposes OP_SET_FORMAT(fsm.MaxFormat) on a shard this replica
// leads when its format is lower and every other replica of the group,
// voter or not, reports (Peer.Report) a binary that applies it. It reports
// whether it proposed. In a rolling upgrade nothing switches until the last
// node runs the new binary: a node that does not answer, or answers as an
// older version, holds the switch back. Once raised, a node of an older
// binary cannot join the group (it refuses the entry and the snapshot).
func (n *Node) RaiseFormat(ctx context.Context, s *Shard) (bool, error) {
	return n.format.raise(ctx, s)
}

func (f *formatGate) raise(ctx context.Context, s *Shard) (bool, error) {
	target := f.max()
	if !s.IsLeader() || s.machine.Format() >= target {
		return false, nil
	}
	if ok, err := f.replicasApply(ctx, s, target); !ok || err != nil {
		return false, err
	}
	if _, err := s.Propose(ctx, fsm.SetFormatCommand(target)); err != nil {
		return false, err
	}
	f.log.Info("raised the shard's state format: every replica's binary applies it", "shard", s.id, "format", target)
	return true, nil
}

// max is the highest state format this node applies (and says so in its
// report).
func (f *formatGate) max() uint32 {
	if p := f.cap.Load(); p != nil {
		return *p
	}
	return fsm.MaxFormat
}

// appliesFormat asks srv's node whether its binary applies format v.
func (f *formatGate) appliesFormat(ctx context.Context, srv raft.Server, v uint32) bool {
	r := f.report(ctx, string(srv.Address))
	return r.GetNode() == string(srv.ID) && r.GetMaxStateFormat() >= v
}

// replicasApply reports whether every other replica of the shard's group,
// voter or not, runs a binary that applies format v.
func (f *formatGate) replicasApply(ctx context.Context, s *Shard, v uint32) (bool, error) {
	c := s.g.raft.GetConfiguration()
	if err := c.Error(); err != nil {
		return false, err
	}
	for _, srv := range c.Configuration().Servers {
		if string(srv.ID) == f.self {
			continue
		}
		if !f.appliesFormat(ctx, srv, v) {
			return false, nil
		}
	}
	return true, nil
}

// onElection raises the format of a shard that holds no task yet, as its
// newly elected leader and before it serves a request: a cluster (or
// shard) bootstrapped by this binary then follows the newest format's
// rules from its first request (ids unique per consistency group, not per
// shard) rather than from loop's next look, about a second later. The
// same check as raise guards it: every replica's binary must apply the
// format, so a rolling upgrade still waits for its last node. A replica
// that does not answer within a second leaves the raise to loop.
// Tuning.FormatEvery < 0 turns it off with the loop.
func (f *formatGate) onElection(s *Shard) {
	target := f.max()
	if f.every < 0 || s.machine.Format() >= target || s.machine.TaskCount() > 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if ok, err := f.replicasApply(ctx, s, target); !ok || err != nil {
		return
	}
	cmd := fsm.SetFormatCommand(target)
	cmd.Now = s.Now()
	data, err := fsm.EncodeCommand(cmd)
	if err != nil {
		f.log.Warn("raise a new shard's state format", "shard", s.id, "err", err)
		return
	}
	// Not through Propose: the leader is not ready for requests yet, and
	// this entry is what it commits before it is.
	err, stopped := awaitFuture(ctx, s.stop, s.g.raft.Apply(data, time.Second))
	if stopped != nil {
		return
	}
	if err != nil {
		f.log.Debug("raise a new shard's state format on election", "shard", s.id, "err", err)
		return
	}
	f.log.Info("raised the shard's state format: every replica's binary applies it", "shard", s.id, "format", target, "new_shard", true)
}
