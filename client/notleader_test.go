package client

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// TestNotLeaderNamesNoBlankLeader: a node that hosts no replica of a shard
// (or whose replica diverged) points at a replica, not at a leader, and its
// NotLeader detail carries no leader id; the error must not read "leader is
// <blank> at ADDR".
func TestNotLeaderNamesNoBlankLeader(t *testing.T) {
	st, err := status.New(codes.Unavailable, "shard 3: no replica on this node; n2 at 127.0.0.1:7002 has one and knows the leader").
		WithDetails(&taskstorepb.NotLeader{Shard: 3, LeaderAddress: "127.0.0.1:7002"})
	if err != nil {
		t.Fatal(err)
	}
	msg := decode("Modify", "127.0.0.1:7001", st.Err()).Error()
	if strings.Contains(msg, "  ") || strings.Contains(msg, "is  at") || !strings.Contains(msg, "127.0.0.1:7002") {
		t.Fatalf("pointed at a replica: %q", msg)
	}
	st, _ = status.New(codes.Unavailable, "not the leader").WithDetails(&taskstorepb.NotLeader{Shard: 3, LeaderId: "n2", LeaderAddress: "127.0.0.1:7002"})
	if msg := decode("Modify", "127.0.0.1:7001", st.Err()).Error(); !strings.Contains(msg, "leader is n2 at 127.0.0.1:7002") {
		t.Fatalf("a known leader: %q", msg)
	}
}
