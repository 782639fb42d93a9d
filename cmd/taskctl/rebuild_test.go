package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// status shows a diverged replica, replicas that disagree, a shard with
// fewer healthy replicas than placed and a shard without a leader in the
// shard's STATE column; a healthy shard says ok.
func TestShardTableShowsDivergence(t *testing.T) {
	var out bytes.Buffer
	err := printShards(&out, []*taskstorepb.ShardStatus{
		{Id: 1, Leader: "n1", Term: 3, Replicas: []string{"n1", "n2", "n3"}, ReplicaStatus: []*taskstorepb.ReplicaStatus{
			{Node: "n1", Role: "leader", CommitIndex: 50, AppliedIndex: 50},
			{Node: "n2", Role: "diverged", Divergence: &taskstorepb.Divergence{Index: 42}},
			{Node: "n3", Role: "follower", CommitIndex: 50, AppliedIndex: 50},
		}},
		{Id: 2, Leader: "n2", Term: 3, ReplicaStatus: []*taskstorepb.ReplicaStatus{
			{Node: "n2", Role: "leader", Disagreement: "at index 7 ..."},
		}},
		{Id: 3, Leader: "n3", Term: 3, ReplicaStatus: []*taskstorepb.ReplicaStatus{{Node: "n3", Role: "leader"}}},
		// n2 is down: no report from it.
		{Id: 4, Leader: "n3", Term: 3, Replicas: []string{"n1", "n2", "n3"}, ReplicaStatus: []*taskstorepb.ReplicaStatus{
			{Node: "n3", Role: "leader"}, {Node: "n1", Role: "follower"}}},
		// No leader (e.g. elections under way): never ok, even with every
		// replica reporting in.
		{Id: 5, Term: 4, Replicas: []string{"n1"}, ReplicaStatus: []*taskstorepb.ReplicaStatus{{Node: "n1", Role: "follower"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	if !strings.Contains(lines[0], "STATE") || !strings.HasSuffix(strings.TrimSpace(lines[1]), "DIVERGED:n2 UNDER-REPLICATED(2/3)") ||
		!strings.HasSuffix(strings.TrimSpace(lines[4]), "UNDER-REPLICATED(2/3)") ||
		!strings.HasSuffix(strings.TrimSpace(lines[5]), " NO-LEADER") ||
		!strings.HasSuffix(strings.TrimSpace(lines[2]), "REPLICAS-DISAGREE(seen by n2)") || !strings.HasSuffix(strings.TrimSpace(lines[3]), "ok") {
		t.Fatalf("shard table:\n%s", out.String())
	}
}

func TestShardRebuildNeedsANodeAndTeaches(t *testing.T) {
	if r := runOffline(t, "shard", "rebuild", "3"); r.code == 0 || !strings.Contains(r.stderr, "--node is required") {
		t.Fatalf("rebuild without --node: %+v", r)
	}
	if r := runOffline(t, "shard", "rebuild", "x", "--node", "n2"); r.code == 0 || !strings.Contains(r.stderr, "want a shard id") {
		t.Fatalf("rebuild of shard x: %+v", r)
	}
	r := runOffline(t, "shard", "rebuild", "--help")
	for _, want := range []string{"diverged", "removes NODE's replica", "non-voter", "vote twice", "taskctl shard rebuild 3 --node n2"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("rebuild --help lacks %q:\n%s", want, r.stdout)
		}
	}
}

// node list and status leave removed nodes out; --all keeps them.
func TestCurrentNodesLeaveOutRemoved(t *testing.T) {
	nodes := []*taskstorepb.NodeStatus{{Id: "n1", State: "member"}, {Id: "n2", State: "removed"}, {Id: "n3", State: "draining"}, {Id: "n4", State: "waiting"}}
	var ids []string
	for _, n := range currentNodes(nodes) {
		ids = append(ids, n.Id)
	}
	if strings.Join(ids, ",") != "n1,n3,n4" || len(nodes) != 4 {
		t.Fatalf("current nodes %v (of %d), want n1,n3,n4 and the input untouched", ids, len(nodes))
	}
	if r := runOffline(t, "node", "list", "--help"); !strings.Contains(r.stdout, "--all") {
		t.Fatalf("node list --help lacks --all:\n%s", r.stdout)
	}
}

// An unknown subcommand of a group fails (exit 1) and says so; the group
// alone prints its help.
func TestUnknownSubcommandFails(t *testing.T) {
	for _, args := range [][]string{{"queue", "frob"}, {"shard", "lst"}, {"task", "frob", "x"}} {
		r := runOffline(t, args...)
		if r.code == 0 || !strings.Contains(r.stderr, "unknown command \""+args[1]+"\"") {
			t.Errorf("taskctl %v: %+v", args, r)
		}
	}
	if r := runOffline(t, "shard", "lst"); !strings.Contains(r.stderr, "did you mean list?") {
		t.Errorf("taskctl shard lst suggests nothing: %+v", r)
	}
	if r := runOffline(t, "queue"); r.code != 0 || !strings.Contains(r.stdout, "Available Commands") {
		t.Errorf("taskctl queue: %+v", r)
	}
}

// Why a claim found nothing names the queue's own numbers: at its limit,
// or over a limit lowered below what was claimed.
func TestQueueHintSaysTheLimit(t *testing.T) {
	for _, c := range []struct {
		q    *taskstorepb.QueueStats
		want string
	}{
		{&taskstorepb.QueueStats{Name: "a/q", Claimed: 1, MaxClaimed: 1}, "a/q has 1 claimed, its limit of 1 "},
		{&taskstorepb.QueueStats{Name: "a/q", Claimed: 2, MaxClaimed: 1}, "a/q has 2 claimed, over its limit of 1 "},
		{&taskstorepb.QueueStats{Name: "a/q", Paused: true, Claimed: 2, MaxClaimed: 1}, "a/q is paused"},
		{&taskstorepb.QueueStats{Name: "a/q", Claimed: 1, MaxClaimed: 2}, ""},
	} {
		got := queueHint(c.q)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%v: %q, want %q", c.q, got, c.want)
		}
	}
}
