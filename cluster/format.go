package cluster

import (
	"context"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/fsm"
)

// formatLoop raises the state format of the shards this node leads once
// every replica's node can apply it (RaiseFormat), looking every
// Tuning.FormatEvery; once every shard is raised a look costs a read per
// local shard.
func (n *Node) formatLoop() {
	every := n.cfg.Tuning.FormatEvery
	if every <= 0 {
		every = DefaultTuning().FormatEvery
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
	f := s.g.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return false, err
	}
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) == n.cfg.ID {
			continue
		}
		if !n.appliesFormat(ctx, srv, target) {
			return false, nil
		}
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
