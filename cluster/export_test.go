package cluster

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
func (n *Node) PretendMaxStateFormat(f uint32) { n.formatCap.Store(&f) }

// SnapshotMeta takes a snapshot of the node's copy of the meta group: a
// restart then starts from the map it holds.
func (n *Node) SnapshotMeta() error { return n.metaGroup.raft.Snapshot().Error() }
