package cluster_test

import (
	"cmp"
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/cluster/peerpb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestPeerReport asks each node of a live cluster, over the internal Peer
// service, what its peers decide by (nodes asked each other's
// public Admin.Status): who it is, its gossip address, every member's
// state, each replica's role, leader and progress; and its clock. The
// public Status of the same node, converted as for a peer of an older
// version, says the same.
func TestPeerReport(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale})
	c.WaitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, q := range []string{"a", "b", "c", "d"} {
		if _, err := c.TaskStore(q).Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: q, Value: []byte("x")}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range c.Nodes {
		peer := peerpb.NewPeerClient(c.Conn(i))
		before := time.Now().UnixNano()
		clock, err := peer.Clock(ctx, &peerpb.ClockRequest{})
		if err != nil {
			t.Fatalf("%s: Clock: %v", n.ID, err)
		}
		if now := clock.Now; now < before || now > time.Now().UnixNano() {
			t.Errorf("%s: Clock %d, not within the call (%d..)", n.ID, now, before)
		}
		// Wait until the replicas have applied what they will: the public
		// and the internal answer are read one after the other.
		var got, want *peerpb.NodeReport
		for range 50 {
			st, err := taskstorepb.NewAdminClient(c.Conn(i)).Status(ctx, &taskstorepb.StatusRequest{LocalOnly: true})
			if err != nil {
				t.Fatalf("%s: Status: %v", n.ID, err)
			}
			if got, err = peer.Report(ctx, &peerpb.ReportRequest{}); err != nil {
				t.Fatalf("%s: Report: %v", n.ID, err)
			}
			want = cluster.ReportFromStatus(st)
			if sameReport(got, want) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if !sameReport(got, want) {
			t.Errorf("%s: Peer.Report and the converted Admin.Status differ:\nreport %v\nstatus %v", n.ID, got, want)
		}
		if got.MaxStateFormat != fsm.MaxFormat {
			t.Errorf("%s: report says the node applies state formats up to %d, want %d", n.ID, got.MaxStateFormat, fsm.MaxFormat)
		}
		if got.Node != n.ID || got.GossipAddress == "" || got.DiskLow {
			t.Errorf("%s: report says node %q, gossip %q, disk low %v", n.ID, got.Node, got.GossipAddress, got.DiskLow)
		}
		var members []string
		for _, m := range got.Members {
			if m.State != metapb.NodeState_NODE_MEMBER {
				t.Errorf("%s: member %s in state %v", n.ID, m.Id, m.State)
			}
			members = append(members, m.Id)
		}
		slices.Sort(members)
		if !slices.Equal(members, []string{"n1", "n2", "n3"}) {
			t.Errorf("%s: members %v", n.ID, members)
		}
		if len(got.Replicas) != 2 {
			t.Fatalf("%s: %d replicas, want 2 (every node runs both shards)", n.ID, len(got.Replicas))
		}
		for _, r := range got.Replicas {
			leader := c.Nodes[c.Leader(r.Shard)].ID
			wantRole := "follower"
			if leader == n.ID {
				wantRole = "leader"
			}
			if r.Leader != leader || r.Role != wantRole || r.AppliedIndex == 0 || r.Diverged {
				t.Errorf("%s: shard %d: leader %q role %q applied %d diverged %v; want leader %q role %q, applied > 0",
					n.ID, r.Shard, r.Leader, r.Role, r.AppliedIndex, r.Diverged, leader, wantRole)
			}
		}
	}
}

// sameReport compares two reports with members in any order.
func sameReport(a, b *peerpb.NodeReport) bool {
	norm := func(r *peerpb.NodeReport) *peerpb.NodeReport {
		r = proto.Clone(r).(*peerpb.NodeReport)
		// Status does not say which formats a binary applies: a node of
		// the version before Peer applies format 0 only, which is what the
		// conversion's zero means.
		r.MaxStateFormat = 0
		slices.SortFunc(r.Members, func(x, y *peerpb.Member) int { return cmp.Compare(x.Id, y.Id) })
		return r
	}
	return proto.Equal(norm(a), norm(b))
}
