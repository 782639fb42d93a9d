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
