package cluster

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// serve starts a gRPC server on loopback with what register adds, and
// returns a connection to it; both end with the test.
func serve(t *testing.T, register func(grpc.ServiceRegistrar)) *grpc.ClientConn {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	register(s)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// olderNode serves Admin only, like a node of a version before the Peer
// service.
type olderNode struct {
	taskstorepb.UnimplementedAdminServer
	now   time.Time
	wiped chan *taskstorepb.RebuildReplicaRequest
}

func (o *olderNode) RebuildReplica(ctx context.Context, req *taskstorepb.RebuildReplicaRequest) (*taskstorepb.RebuildReplicaResponse, error) {
	if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(ForwardedKey)) == 0 {
		return nil, status.Error(codes.InvalidArgument, "wipe without the forwarded mark")
	}
	o.wiped <- req
	return &taskstorepb.RebuildReplicaResponse{}, nil
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
	old := &olderNode{now: time.Unix(1700000000, 5), wiped: make(chan *taskstorepb.RebuildReplicaRequest, 1)}
	conn := serve(t, func(s grpc.ServiceRegistrar) { taskstorepb.RegisterAdminServer(s, old) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	now, legacy, err := fetchClock(ctx, conn, false)
	if err != nil || now != old.now.UnixNano() || !legacy {
		t.Fatalf("clock: %d, %v (fell back: %v); want %d from Status", now, err, legacy, old.now.UnixNano())
	}
	r, legacy, err := fetchReport(ctx, conn, false)
	if err != nil || !legacy {
		t.Fatalf("report: %v (fell back: %v)", err, legacy)
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
	// The wipe goes as an older leader sent it: RebuildReplica with wipe
	// set and the forwarded mark.
	if err := wipeRemote(ctx, conn, 2, "n2"); err != nil {
		t.Fatal(err)
	}
	if req := <-old.wiped; req.Shard != 2 || req.Node != "n2" || !req.Wipe {
		t.Errorf("older node got %v, want a wipe of shard 2 on n2", req)
	}
}

// TestWipeReplicaAnswers: Peer.WipeReplica refuses to act for another node
// (an address reused) and a replica that is not diverged, both as
// FailedPrecondition, which the leader's caller sees as a refusal (as the
// public RebuildReplica answered before; a bare error would be Unknown).
func TestWipeReplicaAnswers(t *testing.T) {
	n := &Node{cfg: Config{ID: "n1"}}
	conn := serve(t, n.RegisterPeer)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		node string
		msg  string
	}{
		{"n2", "not n2"},
		{"n1", "not diverged"},
	} {
		err := wipeRemote(ctx, conn, 3, tc.node)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("wipe of shard 3 on %s: %v, want FailedPrecondition saying %q", tc.node, err, tc.msg)
		}
	}
}
