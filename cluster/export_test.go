package cluster

import (
	"time"

	dto "github.com/prometheus/client_model/go"
)

// HoldLeadershipWatch stalls the shard's leadership watcher between
// receiving a LeaderCh signal and acting on it, until release is called.
func (s *Shard) HoldLeadershipWatch() (release func()) {
	s.watchHold.Lock()
	return s.watchHold.Unlock
}

// ReportFromStatus is the conversion a node uses for a peer that does not
// serve Peer.
var ReportFromStatus = reportFromStatus

// PretendMaxStateFormat makes the node report, and raise shards to, at
// most format f, as a node of an older binary would.
func PretendMaxStateFormat(n *Node, f uint32) { n.format.cap.Store(&f) }

// SnapshotMeta takes a snapshot of the node's copy of the meta group: a
// restart then starts from the map it holds.
func SnapshotMeta(n *Node) error { return n.metaGroup.raft.Snapshot().Error() }

// HoldProposals makes the shard's writes queue as if entries were waiting
// to be appended, once none is, until release is called: release proposes
// what queued, as the append of an entry does.
func (s *Shard) HoldProposals() (release func()) {
	_, _, most := s.tuning.coalesceLimits()
	for {
		s.co.mu.Lock()
		if s.co.inflight == 0 {
			s.co.inflight = most
			s.co.mu.Unlock()
			return func() {
				s.co.mu.Lock()
				s.co.inflight--
				s.takeLocked()
			}
		}
		s.co.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
}

// QueuedProposals is how many writes wait behind the entry in flight,
// not counting those whose callers gave up.
func (s *Shard) QueuedProposals() int {
	s.co.mu.Lock()
	defer s.co.mu.Unlock()
	n := 0
	for _, p := range s.co.queue {
		if p.state.Load() == pendingQueued {
			n++
		}
	}
	return n
}

// ProposedRequests is how many commands the shard proposed as leader and
// saw complete (taskstore_shard_proposed_requests_total).
func (s *Shard) ProposedRequests() float64 {
	if s.proposedRequests == nil {
		return 0
	}
	var m dto.Metric
	if err := s.proposedRequests.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// EmptyClaims is how many claims the shard answered empty without a log
// entry (taskstore_shard_empty_claims_total).
func (s *Shard) EmptyClaims() float64 {
	if s.emptyClaims == nil {
		return 0
	}
	var m dto.Metric
	if err := s.emptyClaims.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
