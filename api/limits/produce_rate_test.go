package limits_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/e1158ecb/taskstore/api/limits"
	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// produceServer answers every Produce item with success.
type produceServer struct {
	taskstorepb.UnimplementedTaskStoreServer
}

func (produceServer) Produce(stream taskstorepb.TaskStore_ProduceServer) error {
	return taskstorepb.ServeProduce(stream, 1<<20, func(_ context.Context, it *taskstorepb.ProduceItem) *taskstorepb.ProduceAnswer {
		return &taskstorepb.ProduceAnswer{Id: it.Id}
	})
}

// TestRateLimitChargesEachProduceItem: a Produce stream is no way around a
// per-client rate limit; each item is charged as the unary call it stands
// for, and the items beyond the burst are refused alone with
// ResourceExhausted while the stream goes on.
func TestRateLimitChargesEachProduceItem(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A rate so low that no token comes back during the test: the burst
	// is all there is.
	srv := grpc.NewServer(limits.Server{RatePerClient: 0.001, Burst: 3}.ServerOptions()...)
	taskstorepb.RegisterTaskStoreServer(srv, produceServer{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := taskstorepb.NewTaskStoreClient(conn).Produce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const items = 5
	req := &taskstorepb.ProduceRequest{}
	for i := range items {
		req.Items = append(req.Items, &taskstorepb.ProduceItem{Id: uint64(i + 1), Modify: &taskstorepb.ModifyRequest{}})
	}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	codesSeen := map[codes.Code]int{}
	for answered := 0; answered < items; {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("after %d answers: %v", answered, err)
		}
		for _, a := range resp.Answers {
			codesSeen[codes.Code(a.Code)]++
			answered++
		}
	}
	if codesSeen[codes.OK] != 3 || codesSeen[codes.ResourceExhausted] != 2 {
		t.Fatalf("answers by code %v: want 3 OK (the burst) and 2 ResourceExhausted", codesSeen)
	}
}
