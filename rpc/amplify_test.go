package rpc_test

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestSmallRequestsCannotAskForHugeAnswers: requests of a few kilobytes that
// name one large task many times, or many large tasks, are refused or paged
// before anything is encoded, and the nodes allocate a small multiple of the
// message limit, not a gigabyte (1000 if_absent inserts of
// one key whose holder had a 1 MiB value made the leader allocate 1 GB).
func TestSmallRequestsCannotAskForHugeAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("a long scenario (tens of seconds): skipped with -short; make test-full runs it")
	}
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2})
	c.WaitReady()
	const q = "amp/q"
	ts := c.TaskStore(q)
	ctx := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	big := make([]byte, fsm.DefaultLimits.MaxValueBytes)
	// Enough 1 MiB tasks that all of them do not fit one answer.
	n := taskstorepb.MaxResponseBytes/len(big) + 2
	var ids []string
	for i := range n {
		in := &taskstorepb.TaskInsert{Id: fmt.Sprintf("big-%d", i), Queue: q, Value: big}
		if i == 0 {
			in.Key = "k"
		}
		if _, err := ts.Modify(ctx(), &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{in}}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, in.Id)
	}
	// A client that could receive anything: the node must be the one to
	// bound the answer.
	recvAll := grpc.MaxCallRecvMsgSize(2 << 30)
	// The whole cluster runs in this process: its allocations during one
	// call are what the call cost, unless the cluster's background work
	// lands in the same moment (a snapshot of the shard's ~70 MiB, a
	// follower catching up: CI once counted 594 MiB for one page). So a
	// call's cost is the least of up to three tries: an answer that
	// amplifies costs as much every time. Each call here is a read or a
	// refused write, so trying again changes nothing.
	const allowed = 8 * taskstorepb.MaxResponseBytes
	allocated := func(f func()) uint64 {
		least := uint64(math.MaxUint64)
		for range 3 {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			f()
			runtime.ReadMemStats(&after)
			if least = min(least, after.TotalAlloc-before.TotalAlloc); least <= allowed {
				break
			}
		}
		return least
	}

	var err error
	ifAbsent := make([]*taskstorepb.TaskInsert, fsm.DefaultLimits.MaxOps)
	for i := range ifAbsent {
		ifAbsent[i] = &taskstorepb.TaskInsert{Queue: q, Key: "k", IfAbsent: true}
	}
	if a := allocated(func() {
		_, err = ts.Modify(ctx(), &taskstorepb.ModifyRequest{Inserts: ifAbsent}, recvAll)
	}); a > allowed {
		t.Errorf("%d if_absent inserts of a key held by a 1 MiB task allocated %d MiB", len(ifAbsent), a>>20)
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("%d if_absent inserts of a key held by a 1 MiB task: %v, want ResourceExhausted", len(ifAbsent), err)
	}

	same := make([]string, 1000)
	for i := range same {
		same[i] = ids[0]
	}
	var res *taskstorepb.TasksResponse
	if a := allocated(func() {
		res, err = ts.Tasks(ctx(), &taskstorepb.TasksRequest{Queue: q, Ids: same}, recvAll)
	}); a > allowed {
		t.Errorf("Tasks naming one 1 MiB task 1000 times allocated %d MiB", a>>20)
	}
	if err != nil || len(res.GetTasks()) != 1 {
		t.Errorf("Tasks naming one task 1000 times: %d tasks, %v; want it once", len(res.GetTasks()), err)
	}

	if a := allocated(func() {
		_, err = ts.Tasks(ctx(), &taskstorepb.TasksRequest{Queue: q, Ids: ids}, recvAll)
	}); a > allowed {
		t.Errorf("Tasks naming %d 1 MiB tasks allocated %d MiB", len(ids), a>>20)
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("Tasks naming %d 1 MiB tasks: %v, want ResourceExhausted", len(ids), err)
	}
	if res, err := ts.Tasks(ctx(), &taskstorepb.TasksRequest{Queue: q, Ids: ids, OmitValues: true}); err != nil || len(res.Tasks) != n {
		t.Errorf("the same without values: %d tasks, %v; want %d", len(res.GetTasks()), err, n)
	}

	// A listing pages by bytes as well as by count, and every page fits.
	seen, pages, token := 0, 0, ""
	for {
		var page *taskstorepb.TasksResponse
		if a := allocated(func() {
			page, err = ts.Tasks(ctx(), &taskstorepb.TasksRequest{Queue: q, Limit: 1000, PageToken: token}, recvAll)
		}); a > allowed {
			t.Errorf("a page of 1 MiB tasks allocated %d MiB", a>>20)
		}
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		pages++
		seen += len(page.Tasks)
		if token = page.NextPageToken; token == "" || pages > n {
			break
		}
	}
	if seen != n || pages < 2 {
		t.Errorf("listed %d tasks in %d pages; want %d in at least 2", seen, pages, n)
	}
}
