package cluster_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestFiveNodesPlaceThreeReplicas: replication factor 3 on five nodes puts
// each shard on three of them, spread evenly, and the cluster serves.
func TestFiveNodesPlaceThreeReplicas(t *testing.T) {
	c := harness.Start(t, 5, harness.Options{Shards: 5, Scale: raceScale})
	c.WaitReady()
	perNode := map[string]int{}
	for _, s := range c.Nodes[0].Server().Node.Map().Shards {
		if len(s.Replicas) != 3 {
			t.Fatalf("shard %d on %v", s.Id, s.Replicas)
		}
		for _, r := range s.Replicas {
			perNode[r]++
		}
	}
	for _, n := range c.Nodes {
		if perNode[n.ID] != 3 {
			t.Fatalf("replicas per node %v, want 3 each", perNode)
		}
	}
	for i := 0; i < 5; i++ {
		q := fmt.Sprintf("five%d/q", i)
		id := fmt.Sprintf("x%d", i) // ids are unique per shard, and groups share shards
		insert(t, c, q, id, "y")
		if get(t, c, q, id) == nil {
			t.Fatalf("%s: insert not readable", q)
		}
	}
	// A node without a replica of a shard points at one that has it, by
	// name (it used to say "leader is  at ADDR", with a blank name).
	sh := c.Nodes[0].Server().Node.Map().Shards[0]
	for i, n := range c.Nodes {
		if slices.Contains(sh.Replicas, n.ID) {
			continue
		}
		_, err := taskstorepb.NewTaskStoreClient(c.Conn(i)).Tasks(ctxT(t, 10*time.Second), &taskstorepb.TasksRequest{Shard: sh.Id})
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.Unavailable || !strings.Contains(msg, "no replica on this node; "+sh.PreferredLeader+" at ") {
			t.Fatalf("read of shard %d on %s, which has no replica: %v", sh.Id, n.ID, err)
		}
		break
	}
	// Status names each shard's preferred leader, as the map has it, and
	// the preferences are spread: one per node for five shards.
	st := c.Nodes[1].Server().Node.Status(ctxT(t, 10*time.Second), false)
	prefs := map[string]int{}
	for _, s := range st.Shards {
		want := ""
		for _, m := range c.Nodes[0].Server().Node.Map().Shards {
			if m.Id == s.Id {
				want = m.PreferredLeader
			}
		}
		if s.PreferredLeader == "" || s.PreferredLeader != want || !slices.Contains(s.Replicas, s.PreferredLeader) {
			t.Fatalf("shard %d: status says preferred %q, map %q, replicas %v", s.Id, s.PreferredLeader, want, s.Replicas)
		}
		prefs[s.PreferredLeader]++
	}
	if len(prefs) != 5 {
		t.Fatalf("preferred leaders %v, want one per node", prefs)
	}
}

// waitPlacement waits until every shard's Raft configuration (as its leader
// sees it) has exactly the map's replicas, all voters.
func waitPlacement(t *testing.T, c *harness.Cluster, timeout time.Duration, nodes []string, lo, hi int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		last = placementMismatch(c)
		if last == "" {
			perNode := map[string]int{}
			for _, s := range c.Nodes[0].Server().Node.Map().Shards {
				for _, r := range s.Replicas {
					perNode[r]++
				}
			}
			for _, id := range nodes {
				if perNode[id] < lo || perNode[id] > hi {
					last = fmt.Sprintf("replicas per node %v, want %d to %d each", perNode, lo, hi)
				}
			}
		}
		if last == "" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("placement not reached: %s", last)
}

func placementMismatch(c *harness.Cluster) string {
	var cmNode int = -1
	for i, n := range c.Nodes {
		if n.Server() != nil {
			cmNode = i
			break
		}
	}
	cm := c.Nodes[cmNode].Server().Node.Map()
	for _, sh := range cm.Shards {
		leader := c.Leader(sh.Id)
		if leader < 0 {
			return fmt.Sprintf("shard %d has no leader", sh.Id)
		}
		f := c.Nodes[leader].Server().Node.Shard(sh.Id).Raft().GetConfiguration()
		if f.Error() != nil {
			return f.Error().Error()
		}
		var voters []string
		for _, srv := range f.Configuration().Servers {
			if srv.Suffrage != 0 { // raft.Voter is 0
				return fmt.Sprintf("shard %d: %s is not a voter yet", sh.Id, srv.ID)
			}
			voters = append(voters, string(srv.ID))
		}
		want := slices.Clone(sh.Replicas)
		slices.Sort(want)
		slices.Sort(voters)
		if !slices.Equal(want, voters) {
			return fmt.Sprintf("shard %d: raft voters %v, map %v", sh.Id, voters, want)
		}
	}
	return ""
}

// TestAddAndRemoveNodesOnline grows a 3-node cluster to 5 and shrinks it
// back, checking placement and that the data stays.
func TestAddAndRemoveNodesOnline(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 4, Scale: raceScale})
	c.WaitReady()
	for i := 0; i < 20; i++ {
		q := fmt.Sprintf("grow%d/q", i%4)
		insert(t, c, q, fmt.Sprintf("g%d", i), "v")
	}
	c.StartJoining("n4")
	c.StartJoining("n5")
	admin := taskstorepb.NewAdminClient(c.Conn(1)) // any node: forwarded to the meta leader
	for _, id := range []string{"n4", "n5"} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := admin.AddNode(ctxT(t, 10*time.Second), &taskstorepb.AddNodeRequest{Id: id})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("add %s: %v", id, err)
			}
			time.Sleep(200 * time.Millisecond) // gossip may not have seen it yet
		}
	}
	waitPlacement(t, c, 2*time.Minute, []string{"n1", "n2", "n3", "n4", "n5"}, 2, 3) // 12 replicas over 5 nodes
	cm := c.Nodes[0].Server().Node.Map()
	perNode := map[string]int{}
	for _, s := range cm.Shards {
		if len(s.Replicas) != 3 {
			t.Fatalf("shard %d has %v", s.Id, s.Replicas)
		}
		for _, r := range s.Replicas {
			perNode[r]++
		}
	}
	for _, id := range []string{"n1", "n2", "n3", "n4", "n5"} {
		if perNode[id] < 2 || perNode[id] > 3 { // 12 replicas over 5 nodes
			t.Fatalf("replicas per node %v, want 2 or 3 each", perNode)
		}
	}
	for i := 0; i < 20; i++ {
		q := fmt.Sprintf("grow%d/q", i%4)
		if get(t, c, q, fmt.Sprintf("g%d", i)) == nil {
			t.Fatalf("g%d lost while adding nodes", i)
		}
	}

	// Refused: nothing to remove that does not exist.
	if _, err := admin.RemoveNode(ctxT(t, 10*time.Second), &taskstorepb.RemoveNodeRequest{Id: "n9"}); status.Code(err) != codes.NotFound {
		t.Fatalf("remove n9: %v, want NotFound", err)
	}
	if _, err := admin.RemoveNode(ctxT(t, 10*time.Second), &taskstorepb.RemoveNodeRequest{Id: "n2"}); err != nil {
		t.Fatalf("remove n2: %v", err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		n2 := c.Nodes[0].Server().Node.NodeStatus("n2")
		if n2 != nil && n2.State == "removed" && len(n2.Shards) == 0 && placementMismatch(c) == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n2 not drained: %v; %s", n2, placementMismatch(c))
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i := 0; i < 20; i++ {
		q := fmt.Sprintf("grow%d/q", i%4)
		if get(t, c, q, fmt.Sprintf("g%d", i)) == nil {
			t.Fatalf("g%d lost while removing n2", i)
		}
	}
	insert(t, c, "grow0/q", "after", "v")
	// The removed node, still running, learns that it was removed
	// (taskstored then stops it; it used to run on, unaware).
	for i, n := range c.Nodes {
		if n.ID != "n2" {
			continue
		}
		select {
		case <-c.Nodes[i].Server().Node.Removed():
		case <-time.After(30 * time.Second):
			t.Fatal("the removed node n2 did not learn that it was removed")
		}
	}
}
