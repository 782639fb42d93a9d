package taskstorepb_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// boundedProducer serves Produce with its items in flight bounded; each
// item waits until release is closed, and the most in flight at once is
// recorded.
type boundedProducer struct {
	taskstorepb.UnimplementedTaskStoreServer
	in        *taskstorepb.Inflight
	release   chan struct{}
	now, most atomic.Int64
}

func (p *boundedProducer) Produce(stream taskstorepb.TaskStore_ProduceServer) error {
	return taskstorepb.ServeProduceBounded(stream, 1<<20, p.in, func(ctx context.Context, it *taskstorepb.ProduceItem) *taskstorepb.ProduceAnswer {
		n := p.now.Add(1)
		for m := p.most.Load(); n > m && !p.most.CompareAndSwap(m, n); m = p.most.Load() {
		}
		select {
		case <-p.release:
		case <-ctx.Done():
		}
		p.now.Add(-1)
		return &taskstorepb.ProduceAnswer{Id: it.Id, Modify: &taskstorepb.ModifyResponse{}}
	})
}

// TestProduceInflightBound sends 300 items on each of three streams over a
// real gRPC socket to a server bounded to 8 items per stream and 12 in all:
// no more than 12 are ever in flight (the streams are read no further
// meanwhile), and once the handlers go on every item is answered.
func TestProduceInflightBound(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	p := &boundedProducer{in: taskstorepb.NewInflight(8, 12), release: make(chan struct{})}
	taskstorepb.RegisterTaskStoreServer(srv, p)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const streams, items = 3, 300
	answered := make(chan int, streams)
	for range streams {
		st, err := taskstorepb.NewTaskStoreClient(cc).Produce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for i := range items {
				if err := st.Send(&taskstorepb.ProduceRequest{Items: []*taskstorepb.ProduceItem{{Id: uint64(i + 1), Modify: &taskstorepb.ModifyRequest{}}}}); err != nil {
					t.Error(err)
					return
				}
			}
			st.CloseSend()
		}()
		go func() {
			n := 0
			for {
				res, err := st.Recv()
				if err != nil {
					break
				}
				n += len(res.Answers)
			}
			answered <- n
		}()
	}
	deadline := time.Now().Add(30 * time.Second)
	for p.now.Load() < 12 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // room for a handler past the bound to start
	if n := p.now.Load(); n != 12 {
		t.Errorf("%d items in flight with every handler held, want the bound of 12", n)
	}
	close(p.release)
	for range streams {
		if n := <-answered; n != items {
			t.Errorf("a stream got %d answers, want %d", n, items)
		}
	}
	if m := p.most.Load(); m > 12 {
		t.Errorf("%d items were in flight at once, over the bound of 12", m)
	}
}
