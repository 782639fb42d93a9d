package statuspage

import (
	"context"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// divergedFake reports shard 1's replica on b as diverged and shard 2's
// replicas as disagreeing.
type divergedFake struct{ fake }

func (divergedFake) Status(ctx context.Context, localOnly bool) *taskstorepb.StatusResponse {
	return &taskstorepb.StatusResponse{
		Node:  "a",
		Nodes: []*taskstorepb.NodeStatus{{Id: "a", State: "member", Health: "alive"}, {Id: "b", State: "member", Health: "alive"}, {Id: "c", State: "member", Health: "alive"}},
		Shards: []*taskstorepb.ShardStatus{
			{Id: 1, Leader: "a", Term: 3, Replicas: []string{"a", "b", "c"}, ReplicaStatus: []*taskstorepb.ReplicaStatus{
				{Node: "a", Role: "leader", AppliedIndex: 50},
				{Node: "b", Role: "diverged", Divergence: &taskstorepb.Divergence{Index: 42, Majority: []string{"a", "c"}}},
				{Node: "c", Role: "follower", AppliedIndex: 50},
			}},
			{Id: 2, Leader: "a", Term: 3, Replicas: []string{"a", "b"}, ReplicaStatus: []*taskstorepb.ReplicaStatus{
				{Node: "a", Role: "leader", AppliedIndex: 9, Disagreement: "at index 7 no digest is held by a majority"},
				{Node: "b", Role: "follower", AppliedIndex: 9},
			}},
		},
	}
}

// The overview says loudly which replica diverged and how to repair it.
func TestOverviewShowsDivergedReplicas(t *testing.T) {
	h := New(divergedFake{}, fake{})
	code, body := fetch(t, h, "/")
	for _, want := range []string{
		`<b>Diverged replicas:</b> shard 1 on b.`, `taskctl shard rebuild SHARD --node NODE`,
		`<span class="badge bad">diverged</span> <small class="muted">at index 42; majority a,c</small>`,
		`<b>Replicas disagree</b> with no majority: shard 2 (seen by a).`,
		`<span class="badge bad" title="at index 7 no digest is held by a majority">replicas disagree</span>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %s", want)
		}
	}
	if code != 200 || t.Failed() {
		t.Fatalf("overview %d:\n%s", code, body)
	}
	// A healthy cluster shows no alert.
	if _, body := fetch(t, New(fake{}, fake{}), "/"); strings.Contains(body, "Diverged replicas") || strings.Contains(body, "Replicas disagree") {
		t.Fatal("healthy overview shows a divergence alert")
	}
}

// deadNodeFake has one member dead (c), one node removed (d) and one
// waiting to be added (e); shard 1's replica on c does not report.
type deadNodeFake struct{ fake }

func (deadNodeFake) Status(ctx context.Context, localOnly bool) *taskstorepb.StatusResponse {
	return &taskstorepb.StatusResponse{
		Node: "a",
		Nodes: []*taskstorepb.NodeStatus{{Id: "a", State: "member", Health: "alive"}, {Id: "b", State: "member", Health: "alive"},
			{Id: "c", State: "member", Health: "dead"}, {Id: "d", State: "removed", Health: "alive"}, {Id: "e", State: "waiting", Health: "alive"}},
		Shards: []*taskstorepb.ShardStatus{
			{Id: 1, Leader: "a", Term: 3, Replicas: []string{"a", "b", "c"}, ReplicaStatus: []*taskstorepb.ReplicaStatus{
				{Node: "a", Role: "leader", AppliedIndex: 50}, {Node: "b", Role: "follower", AppliedIndex: 50}}},
			{Id: 2, Leader: "b", Term: 3, Replicas: []string{"a", "b"}, ReplicaStatus: []*taskstorepb.ReplicaStatus{
				{Node: "a", Role: "follower", AppliedIndex: 9}, {Node: "b", Role: "leader", AppliedIndex: 9}}},
		},
	}
}

// With a member dead, the overview counts only members as nodes and says
// plainly which shards lost redundancy (it read "Nodes
// alive 3 of 5" and "8 of 8 shards with a leader, lag 0").
func TestOverviewShowsUnderReplicatedShards(t *testing.T) {
	code, body := fetch(t, New(deadNodeFake{}, fake{}), "/")
	for _, want := range []string{
		`<b>Under-replicated:</b> shard 1 (2 of 3 replicas healthy).`, `taskctl node remove NODE --force`,
		`Members alive</div><div class="v">2 <small>of 3</small>`,
		`Fully replicated</div><div class="v">1 <small>of 2</small>`,
		`1 removed, not shown (taskctl node list --all)`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %s", want)
		}
	}
	if strings.Contains(body, "<b>d</b>") {
		t.Error("the removed node d is listed")
	}
	if code != 200 || t.Failed() {
		t.Fatalf("overview %d:\n%s", code, body)
	}
}
