package cluster

import "testing"

// A node must never tell a client that the leader is itself (clients were sent back to the node that had just refused them while
// its leadership transfer was in progress).
func TestLeaderHintNeverNamesThisNode(t *testing.T) {
	if h := leaderHint("n1", 3, "n1", "127.0.0.1:7001"); h.LeaderID != "" || h.LeaderAddress != "" {
		t.Fatalf("hint to itself: %+v", h)
	}
	if h := leaderHint("n1", 3, "n2", "127.0.0.1:7002"); h.LeaderID != "n2" || h.LeaderAddress != "127.0.0.1:7002" || h.Shard != 3 {
		t.Fatalf("hint to another node lost: %+v", h)
	}
}
