package rpc_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/rpc"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// produce sends items in one message on a new stream and returns the
// answers by id, after closing the sending side.
func produce(t *testing.T, ctx context.Context, ts taskstorepb.TaskStoreClient, items ...*taskstorepb.ProduceItem) map[uint64]*taskstorepb.ProduceAnswer {
	t.Helper()
	st, err := ts.Produce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&taskstorepb.ProduceRequest{Items: items}); err != nil {
		t.Fatal(err)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	out := map[uint64]*taskstorepb.ProduceAnswer{}
	for {
		res, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		for _, a := range res.Answers {
			out[a.Id] = a
		}
	}
	if len(out) != len(items) {
		t.Fatalf("%d answers to %d items: %v", len(out), len(items), out)
	}
	return out
}

// serve serves srv over real gRPC on a loopback port until the test ends
// and returns a client of it.
func serve(t *testing.T, srv taskstorepb.TaskStoreServer) taskstorepb.TaskStoreClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(taskstorepb.ServerCodec())
	taskstorepb.RegisterTaskStore(s, srv)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return taskstorepb.NewTaskStoreClient(cc)
}

func insertItem(id uint64, queue string, rid *taskstorepb.RequestID) *taskstorepb.ProduceItem {
	return &taskstorepb.ProduceItem{Id: id, Modify: &taskstorepb.ModifyRequest{Request: rid,
		Inserts: []*taskstorepb.TaskInsert{{Queue: queue, Value: []byte("v")}}}}
}

// TestProduceAnswersEachItemAlone runs a Produce stream over real gRPC
// against a secured three-node cluster: every item of one message gets its
// own answer and error (one refused item does not refuse its neighbours),
// items are authorized one by one by their queues, a follower answers each
// item NotLeader with the leader's address, and an item sent again with its
// request id is answered from the first application, not applied twice.
func TestProduceAnswersEachItemAlone(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Secure: true})
	c.WaitReady()
	const q = "demo/produce"
	shard := c.ShardOf(q)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ts := c.TaskStore(q)
	leader := c.Leader(shard)

	t.Run("each item its own outcome", func(t *testing.T) {
		ans := produce(t, ctx, ts,
			insertItem(1, q, nil),
			&taskstorepb.ProduceItem{Id: 2, Modify: &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Value: []byte("no queue")}}}},
			&taskstorepb.ProduceItem{Id: 3, Modify: &taskstorepb.ModifyRequest{Deletes: []*taskstorepb.TaskRef{{Id: "missing", Version: 1, Queue: q}}}},
			insertItem(4, q, nil),
			&taskstorepb.ProduceItem{Id: 5},
		)
		for _, id := range []uint64{1, 4} {
			if err := taskstorepb.AnswerError(ans[id]); err != nil || len(ans[id].Modify.GetInserted()) != 1 {
				t.Fatalf("item %d: %v %v", id, err, ans[id])
			}
		}
		if code := status.Code(taskstorepb.AnswerError(ans[2])); code != codes.InvalidArgument {
			t.Errorf("insert without a queue: %v, want InvalidArgument", taskstorepb.AnswerError(ans[2]))
		}
		if code := status.Code(taskstorepb.AnswerError(ans[5])); code != codes.InvalidArgument {
			t.Errorf("item without a request: %v, want InvalidArgument", taskstorepb.AnswerError(ans[5]))
		}
		st := status.Convert(taskstorepb.AnswerError(ans[3]))
		if st.Code() != codes.FailedPrecondition {
			t.Fatalf("delete of a missing task: %v, want FailedPrecondition", st.Err())
		}
		var me *taskstorepb.ModifyError
		for _, d := range st.Details() {
			if m, ok := d.(*taskstorepb.ModifyError); ok {
				me = m
			}
		}
		if me == nil || len(me.Errors) != 1 || me.Errors[0].Category != taskstorepb.RefError_DELETE_MISSING {
			t.Errorf("refusal's detail: %v", st.Details())
		}
	})

	t.Run("authorized per item", func(t *testing.T) {
		cctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.Security.ClientToken)
		ans := produce(t, cctx, ts, insertItem(1, q, nil), insertItem(2, "other/q", nil))
		if err := taskstorepb.AnswerError(ans[1]); err != nil {
			t.Fatalf("insert into the client's own prefix: %v", err)
		}
		if code := status.Code(taskstorepb.AnswerError(ans[2])); code != codes.PermissionDenied {
			t.Fatalf("insert outside the client's prefixes: %v, want PermissionDenied", taskstorepb.AnswerError(ans[2]))
		}
		// Without a credential the stream itself is refused, as a call is.
		nctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer not-a-token-0123456789")
		st, err := ts.Produce(nctx)
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("unknown token: %v, want Unauthenticated", err)
		}
	})

	t.Run("not leader with a hint per item", func(t *testing.T) {
		follower := (leader + 1) % 3
		ans := produce(t, ctx, taskstorepb.NewTaskStoreClient(c.Conn(follower)), insertItem(7, q, nil), insertItem(8, q, nil))
		for _, id := range []uint64{7, 8} {
			st := status.Convert(taskstorepb.AnswerError(ans[id]))
			if st.Code() != codes.Unavailable {
				t.Fatalf("item %d at a follower: %v", id, st.Err())
			}
			var hint *taskstorepb.NotLeader
			for _, d := range st.Details() {
				if nl, ok := d.(*taskstorepb.NotLeader); ok {
					hint = nl
				}
			}
			if hint == nil || hint.LeaderAddress != c.Nodes[leader].Addr {
				t.Fatalf("item %d: hint %v, want leader %s", id, hint, c.Nodes[leader].Addr)
			}
		}
	})

	t.Run("a retried request id applies once", func(t *testing.T) {
		const rq = "demo/once"
		rid := &taskstorepb.RequestID{ClientId: "produce-test", Seq: 1}
		first := produce(t, ctx, ts, insertItem(1, rq, rid))
		again := produce(t, ctx, ts, insertItem(99, rq, rid))
		a, b := first[1].Modify.GetInserted(), again[99].Modify.GetInserted()
		if len(a) != 1 || len(b) != 1 || a[0].Id != b[0].Id {
			t.Fatalf("first %v, retry %v: want the same task", first[1], again[99])
		}
		res, err := ts.Tasks(ctx, &taskstorepb.TasksRequest{Queue: rq})
		if err != nil || len(res.Tasks) != 1 {
			t.Fatalf("queue holds %v (%v), want one task", res.GetTasks(), err)
		}
	})
}

// blockedShards is a shard whose proposals never commit: they wait for
// their context, as a proposal to a group without quorum does.
type blockedShards struct{}

type blockedShard struct{}

func (blockedShards) ShardFor(string) (rpc.Shard, error)  { return blockedShard{}, nil }
func (blockedShards) ShardByID(uint32) (rpc.Shard, error) { return blockedShard{}, nil }
func (blockedShards) LocalShards() []rpc.Shard            { return []rpc.Shard{blockedShard{}} }
func (blockedShards) Clock() time.Time                    { return time.Now() }
func (blockedShard) ID() uint32                           { return 1 }
func (blockedShard) Now() int64                           { return time.Now().UnixNano() }
func (blockedShard) IsLeader() bool                       { return true }
func (blockedShard) Propose(ctx context.Context, _ *fsmpb.Command) (*fsmpb.Result, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (blockedShard) Claim(ctx context.Context, _ *fsmpb.Command, _ time.Duration) (*fsmpb.Result, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (blockedShard) Read(context.Context, bool, func(*fsm.Machine) error) error {
	return errors.New("no machine")
}

// TestProduceDeadlinesAndCancellation: an item's own timeout ends it
// DeadlineExceeded and a cancel ends it Canceled, each without ending the
// stream or the other items; closing the stream's sending side ends the
// stream once every item is answered.
func TestProduceDeadlinesAndCancellation(t *testing.T) {
	ts := serve(t, rpc.NewTaskStore(blockedShards{}, nil, harness.Discard))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := ts.Produce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	timed := insertItem(1, "g/q", nil)
	timed.Timeout = durationpb.New(50 * time.Millisecond)
	if err := st.Send(&taskstorepb.ProduceRequest{Items: []*taskstorepb.ProduceItem{timed, insertItem(2, "g/q", nil), insertItem(3, "g/q", nil)}}); err != nil {
		t.Fatal(err)
	}
	recv := func() *taskstorepb.ProduceAnswer {
		t.Helper()
		res, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Answers) != 1 {
			t.Fatalf("answers %v, want one", res.Answers)
		}
		return res.Answers[0]
	}
	if a := recv(); a.Id != 1 || codes.Code(a.Code) != codes.DeadlineExceeded {
		t.Fatalf("first answer %v, want item 1 DeadlineExceeded", a)
	}
	if err := st.Send(&taskstorepb.ProduceRequest{Cancel: []uint64{2}}); err != nil {
		t.Fatal(err)
	}
	if a := recv(); a.Id != 2 || codes.Code(a.Code) != codes.Canceled {
		t.Fatalf("answer %v, want item 2 Canceled", a)
	}
	// Item 3 still waits; the stream still takes items.
	if err := st.Send(&taskstorepb.ProduceRequest{Cancel: []uint64{3}}); err != nil {
		t.Fatal(err)
	}
	if a := recv(); a.Id != 3 || codes.Code(a.Code) != codes.Canceled {
		t.Fatalf("answer %v, want item 3 Canceled", a)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last answer: %v, want the stream's end", err)
	}
}

// countingShards is blockedShards that records how many proposals wait at
// once, and the most.
type countingShards struct {
	blockedShards
	now, most *atomic.Int64
}

type countingShard struct {
	blockedShard
	now, most *atomic.Int64
}

func (s countingShards) ShardFor(string) (rpc.Shard, error) {
	return countingShard{now: s.now, most: s.most}, nil
}

func (s countingShard) Propose(ctx context.Context, _ *fsmpb.Command) (*fsmpb.Result, error) {
	n := s.now.Add(1)
	for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
	}
	defer s.now.Add(-1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestProduceInflightBoundOnNode floods one Produce stream over real gRPC
// with 200 items whose proposals never commit (each ends at its own 100ms
// timeout), against a node bounded to 8 per stream: no more than 8
// proposals ever wait on the node at once (the rest stay unread in the
// stream's flow control), and every item is still answered.
func TestProduceInflightBoundOnNode(t *testing.T) {
	var now, most atomic.Int64
	node := rpc.NewTaskStore(countingShards{now: &now, most: &most}, nil, harness.Discard)
	node.SetProduceInflight(8, 100)
	ts := serve(t, node)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	st, err := ts.Produce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const items = 200
	sent := make(chan error, 1)
	go func() {
		for i := uint64(1); i <= items; i++ {
			it := insertItem(i, "g/q", nil)
			it.Timeout = durationpb.New(100 * time.Millisecond)
			if err := st.Send(&taskstorepb.ProduceRequest{Items: []*taskstorepb.ProduceItem{it}}); err != nil {
				sent <- err
				return
			}
		}
		sent <- st.CloseSend()
	}()
	seen := map[uint64]bool{}
	for {
		res, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range res.Answers {
			if codes.Code(a.Code) != codes.DeadlineExceeded {
				t.Fatalf("answer %v, want DeadlineExceeded", a)
			}
			seen[a.Id] = true
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if len(seen) != items {
		t.Fatalf("%d of %d items answered", len(seen), items)
	}
	if m := most.Load(); m > 8 || m < 1 {
		t.Fatalf("%d proposals waited at once on one stream, want 1..8", m)
	}
}
