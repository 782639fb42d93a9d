package cluster

import (
	"context"
	"time"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/fsm"
)

// formatLoop raises the state format of the shards this node leads once
// every replica's node can apply it (RaiseFormat), looking every
// Tuning.FormatEvery; once every shard is raised a look costs a read per
// local shard.
func (n *Node) formatLoop() {
	every := n.cfg.Tuning.FormatEvery
	if every == 0 {
		every = DefaultTuning().FormatEvery
	}
	if every < 0 {
		return // raised by hand only (tests of an upgrade)
	}
	for n.sleep(every) {
		for _, s := range n.LocalShards() {
			ctx, cancel := context.WithTimeout(context.Background(), n.cfg.Tuning.ApplyTimeout)
			if _, err := n.RaiseFormat(ctx, s); err != nil {
				n.log.Debug("raise state format", "shard", s.id, "err", err)
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
	target := n.maxStateFormat()
	if !s.IsLeader() || s.machine.Format() >= target {
		return false, nil
	}
	if ok, err := n.replicasApply(ctx, s, target); !ok || err != nil {
		return false, err
	}
	if _, err := s.Propose(ctx, fsm.SetFormatCommand(target)); err != nil {
		return false, err
	}
	n.log.Info("raised the shard's state format: every replica's binary applies it", "shard", s.id, "format", target)
	return true, nil
}

// maxStateFormat is the highest state format this node applies (and says
// so in its report).
func (n *Node) maxStateFormat() uint32 {
	if p := n.formatCap.Load(); p != nil {
		return *p
	}
	return fsm.MaxFormat
}

// appliesFormat asks srv's node whether its binary applies format f.
func (n *Node) appliesFormat(ctx context.Context, srv raft.Server, f uint32) bool {
	r := n.askReport(ctx, string(srv.Address))
	return r.GetNode() == string(srv.ID) && r.GetMaxStateFormat() >= f
}

// replicasApply reports whether every other replica of the shard's group,
// voter or not, runs a binary that applies format f.
func (n *Node) replicasApply(ctx context.Context, s *Shard, f uint32) (bool, error) {
	c := s.g.raft.GetConfiguration()
	if err := c.Error(); err != nil {
		return false, err
	}
	for _, srv := range c.Configuration().Servers {
		if string(srv.ID) == n.cfg.ID {
			continue
		}
		if !n.appliesFormat(ctx, srv, f) {
			return false, nil
		}
	}
	return true, nil
}

// raiseFormatOnElection raises the format of a shard that holds no task
// yet, as its newly elected leader and before it serves a request: a
// cluster (or shard) bootstrapped by this binary then follows the newest
// format's rules from its first request (ids unique per consistency group,
// not per shard) rather than from formatLoop's next look, about a second
// later. The same check as RaiseFormat guards it: every replica's binary
// must apply the format, so a rolling upgrade still waits for its last
// node. A replica that does not answer within a second leaves the raise
// to formatLoop. Tuning.FormatEvery < 0 turns it off with the loop.
func (n *Node) raiseFormatOnElection(s *Shard) {
	target := n.maxStateFormat()
	if n.cfg.Tuning.FormatEvery < 0 || s.machine.Format() >= target || s.machine.TaskCount() > 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if ok, err := n.replicasApply(ctx, s, target); !ok || err != nil {
		return
	}
	cmd := fsm.SetFormatCommand(target)
	cmd.Now = s.Now()
	data, err := fsm.EncodeCommand(cmd)
	if err != nil {
		n.log.Warn("raise a new shard's state format", "shard", s.id, "err", err)
		return
	}
	// Not through Propose: the leader is not ready for requests yet, and
	// this entry is what it commits before it is.
	err, stopped := awaitFuture(ctx, s.stop, s.g.raft.Apply(data, time.Second))
	if stopped != nil {
		return
	}
	if err != nil {
		n.log.Debug("raise a new shard's state format on election", "shard", s.id, "err", err)
		return
	}
	n.log.Info("raised the shard's state format: every replica's binary applies it", "shard", s.id, "format", target, "new_shard", true)
}
