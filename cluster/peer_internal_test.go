package cluster

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// olderNode serves Admin.Status only, like a node of a version before the
// Peer service.
type olderNode struct {
	taskstorepb.UnimplementedAdminServer
	now time.Time
}

func (o *olderNode) Status(_ context.Context, req *taskstorepb.StatusRequest) (*taskstorepb.StatusResponse, error) {
	if req.ClockOnly {
		return &taskstorepb.StatusResponse{Now: timestamppb.New(o.now)}, nil
	}
	return &taskstorepb.StatusResponse{
		Node: "n2",
		Nodes: []*taskstorepb.NodeStatus{
			{Id: "n1", State: "member"},
			{Id: "n2", State: "draining", GossipAddress: "10.0.0.2:7946", DiskLow: true},
			{Id: "n3", State: "removed"},
			{Id: "n4", State: "waiting"},
		},
		Shards: []*taskstorepb.ShardStatus{
			{Id: 1, Leader: "n1", ReplicaStatus: []*taskstorepb.ReplicaStatus{
				{Node: "n2", Role: "follower", AppliedIndex: 42, Checkpoints: []*taskstorepb.Checkpoint{{Index: 40, Digest: []byte("d")}}}}},
			{Id: 2, ReplicaStatus: []*taskstorepb.ReplicaStatus{{Node: "n2", Role: RoleDiverged, Divergence: &taskstorepb.Divergence{}}}},
			{Id: 3}, // placed elsewhere
		},
	}, nil
}

// TestPeerWithoutPeerService: a node mid-upgrade asks a peer of the older
// version, which answers Peer with Unimplemented; the report and the clock
// come from its Admin.Status instead, so promotion, hand-off and clock
// checks keep working through a rolling upgrade.
func TestPeerWithoutPeerService(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	old := &olderNode{now: time.Unix(1700000000, 5)}
	taskstorepb.RegisterAdminServer(s, old)
	go s.Serve(l)
	defer s.Stop()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	now, err := fetchClock(ctx, conn)
	if err != nil || now != old.now.UnixNano() {
		t.Fatalf("clock: %d, %v; want %d", now, err, old.now.UnixNano())
	}
	r, err := fetchReport(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if r.Node != "n2" || r.GossipAddress != "10.0.0.2:7946" || !r.DiskLow {
		t.Errorf("node %q gossip %q disk low %v", r.Node, r.GossipAddress, r.DiskLow)
	}
	for id, want := range map[string]string{"n1": "member", "n2": "draining", "n3": "removed"} {
		if st, ok := memberState(r, id); !ok || NodeStateName(st) != want {
			t.Errorf("member %s: %v %v, want %s", id, st, ok, want)
		}
	}
	if _, ok := memberState(r, "n4"); ok {
		t.Errorf("a waiting node is not a member of the map, but the report has it")
	}
	if rep := replicaOf(r, 1); rep == nil || rep.Leader != "n1" || rep.Role != "follower" || rep.AppliedIndex != 42 || rep.Diverged ||
		len(rep.Checkpoints) != 1 || rep.Checkpoints[0].Index != 40 {
		t.Errorf("shard 1: %v", rep)
	}
	if rep := replicaOf(r, 2); rep == nil || !rep.Diverged {
		t.Errorf("shard 2: %v, want diverged", rep)
	}
	if rep := replicaOf(r, 3); rep != nil {
		t.Errorf("shard 3 is not on n2, but the report has %v", rep)
	}
}
