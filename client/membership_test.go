package client_test

import (
	"testing"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// TestPlacementSettledSaysWhatMoves pins the progress lines a drain or a
// join prints. A member that gains a replica is not "joining": the line
// used to say "n1 has not joined yet" of a node in the cluster for hours.
func TestPlacementSettledSaysWhatMoves(t *testing.T) {
	shard := func(replicas []string, status ...*taskstorepb.ReplicaStatus) *taskstorepb.StatusResponse {
		return &taskstorepb.StatusResponse{Shards: []*taskstorepb.ShardStatus{{Id: 3, Replicas: replicas, ReplicaStatus: status}}}
	}
	voter := func(n string) *taskstorepb.ReplicaStatus { return &taskstorepb.ReplicaStatus{Node: n, Role: "voter"} }
	for _, tc := range []struct {
		name string
		st   *taskstorepb.StatusResponse
		ok   bool
		what string
	}{
		{"settled", shard([]string{"n1", "n2"}, voter("n1"), voter("n2")), true, ""},
		{"replica being added", shard([]string{"n1", "n2"}, voter("n2")), false, "shard 3: a replica is being added on n1 (it joins as a non-voter)"},
		{"catching up", shard([]string{"n1", "n2"}, voter("n2"), &taskstorepb.ReplicaStatus{Node: "n1", Role: "nonvoter"}), false, "shard 3: n1 is catching up (a non-voter until it has the log; then it is promoted to vote)"},
		{"old replica left", shard([]string{"n2"}, voter("n2"), voter("n4")), false, "shard 3: the replica on n4 is being removed (it retires once its removal from the shard's group is committed)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, what := client.PlacementSettled(tc.st)
			if ok != tc.ok || what != tc.what {
				t.Fatalf("PlacementSettled = %v, %q; want %v, %q", ok, what, tc.ok, tc.what)
			}
		})
	}
}
