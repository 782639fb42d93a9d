package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/proxy"
)

// TestAnswerMemory: the answers a proxy holds at once are bounded. Callers
// that do not read their answers (a stalled or slow reader) keep them queued
// in the proxy; beyond the budget further large answers are refused with
// ResourceExhausted, an answer larger than the whole budget too, and once
// the held answers are read the budget is free again.
func TestAnswerMemory(t *testing.T) {
	c := startCluster(t)
	const mib = 1 << 20
	p := startProxy(t, c, func(cfg *proxy.Config) { cfg.AnswerMemory = 3*mib + mib/2 })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	value := bytes.Repeat([]byte{'v'}, mib)
	cl := dial(t, p.Addr(), client.WithProxyOnly())
	const queue = "mem/q"
	for i := range 5 {
		if _, err := cl.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: queue, Id: fmt.Sprint("t", i), Value: value}}}); err != nil {
			t.Fatal(err)
		}
	}
	get := func(ids ...string) *taskstorepb.TasksRequest {
		return &taskstorepb.TasksRequest{Queue: queue, Ids: ids}
	}

	// A caller whose windows are gRPC's smallest and that never reads: each
	// answer of 1 MiB stays queued in the proxy.
	stalled, err := grpc.NewClient(p.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	var held []grpc.ClientStream
	for i := range 3 {
		st, err := stalled.NewStream(ctx, &grpc.StreamDesc{}, taskstorepb.TaskStore_Tasks_FullMethodName)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.SendMsg(get(fmt.Sprint("t", i))); err != nil {
			t.Fatal(err)
		}
		if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
		held = append(held, st)
	}
	for p.AnswerBytesHeld() < 3*mib {
		if ctx.Err() != nil {
			t.Fatalf("the proxy holds %d bytes of answers, want 3 MiB", p.AnswerBytesHeld())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Full: a fourth answer of 1 MiB does not fit.
	_, err = cl.Tasks(ctx, get("t3"))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--answer-memory") || !strings.Contains(err.Error(), "retry later") {
		t.Fatalf("a 4th answer of 1 MiB over a budget of 3.5 MiB holding 3: %v, want ResourceExhausted naming --answer-memory", err)
	}
	// Small answers still go through.
	if res, err := cl.Tasks(ctx, &taskstorepb.TasksRequest{Queue: queue, Ids: []string{"t3"}, OmitValues: true}); err != nil || len(res.Tasks) != 1 {
		t.Fatalf("a small answer while the budget is full: %v", err)
	}

	// Read the held answers: they were whole, and their bytes come back.
	for i, st := range held {
		var res taskstorepb.TasksResponse
		if err := st.RecvMsg(&res); err != nil {
			t.Fatalf("held answer %d: %v", i, err)
		}
		if len(res.Tasks) != 1 || !bytes.Equal(res.Tasks[0].Value, value) {
			t.Fatalf("held answer %d: %d tasks", i, len(res.Tasks))
		}
	}
	for p.AnswerBytesHeld() != 0 {
		if ctx.Err() != nil {
			t.Fatalf("the proxy still holds %d bytes of answers after they were read", p.AnswerBytesHeld())
		}
		time.Sleep(10 * time.Millisecond)
	}
	res, err := cl.Tasks(ctx, get("t3", "t4"))
	if err != nil || len(res.Tasks) != 2 {
		t.Fatalf("2 MiB once the budget is free: %v", err)
	}
	// An answer larger than the whole budget is refused even when it is free.
	_, err = cl.Tasks(ctx, get("t0", "t1", "t2", "t3"))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("an answer of 4 MiB over a budget of 3.5 MiB: %v, want ResourceExhausted", err)
	}
	if n := p.AnswerBytesHeld(); n != 0 {
		t.Fatalf("%d bytes held after the calls ended", n)
	}
}
