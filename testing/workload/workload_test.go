package workload_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
	"github.com/e1158ecb/taskstore/testing/workload"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want workload.Outcome
	}{
		{nil, workload.OK},
		{&client.DependencyError{}, workload.Failed},
		{fmt.Errorf("wrapped: %w", client.ErrInvalid), workload.Failed},
		{client.ErrTooLarge, workload.Failed},
		{fmt.Errorf("x: %w: %w", client.ErrUnavailable, context.DeadlineExceeded), workload.Unknown},
		{context.DeadlineExceeded, workload.Unknown},
		{status.Error(codes.Internal, "boom"), workload.Unknown},
		{errors.New("connection reset"), workload.Unknown},
	} {
		if got := workload.Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestHistoryConcurrentAndJSON(t *testing.T) {
	h := workload.NewHistory()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				op := h.Begin(&workload.Op{Worker: fmt.Sprint(g), Kind: workload.KindInsert, Inserts: []workload.Insert{{ID: fmt.Sprintf("%d-%d", g, i), Queue: "q"}}})
				var err error
				if i%10 == 0 {
					err = &client.DependencyError{Errors: nil}
				}
				h.Finish(op, err)
				h.Count("x", 1)
			}
		}()
	}
	wg.Wait()
	ops := h.Ops()
	if len(ops) != 800 || h.Counts()["x"] != 800 {
		t.Fatalf("got %d ops, %d counted", len(ops), h.Counts()["x"])
	}
	for i, op := range ops {
		if op.Index != i || op.End.Before(op.Start) {
			t.Fatalf("op %d: index %d, %v..%v", i, op.Index, op.Start, op.End)
		}
	}
	var buf bytes.Buffer
	if err := h.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var back struct{ Ops []map[string]any }
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil || len(back.Ops) != 800 {
		t.Fatalf("JSON: %v, %d ops", err, len(back.Ops))
	}
	if !strings.Contains(buf.String(), `"outcome":"failed"`) {
		t.Errorf("outcomes not written by name")
	}
}

// TestWorkloadRecords runs the workload briefly against an in-process
// cluster, without faults, and checks that every role recorded operations
// and that the final state can be read.
func TestWorkloadRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: 2})
	c.WaitReady()
	h := workload.NewHistory()
	addrs := strings.Join(c.Endpoints(), ",")
	cfg := workload.Defaults
	cfg.Prefix = "wt"
	cfg.Pace = 10 * time.Millisecond
	w, err := workload.Start(cfg, h, func(ctx context.Context) (*client.Client, error) { return client.Dial(ctx, addrs) })
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
	w.Stop()
	kinds := map[workload.Kind]int{}
	outcomes := map[workload.Outcome]int{}
	zombies := 0
	for _, op := range h.Ops() {
		kinds[op.Kind]++
		outcomes[op.Outcome]++
		if op.Zombie {
			zombies++
		}
	}
	t.Logf("kinds %v outcomes %v zombie commits %d", kinds, outcomes, zombies)
	for _, k := range []workload.Kind{workload.KindInsert, workload.KindClaim, workload.KindCommit, workload.KindTxn, workload.KindRead} {
		if kinds[k] == 0 {
			t.Errorf("no %s recorded", k)
		}
	}
	if zombies == 0 {
		t.Errorf("no zombie commit recorded")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := client.Dial(ctx, addrs)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	final, err := workload.ReadFinal(ctx, cl, cfg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(final.Tasks) == 0 {
		t.Fatalf("no task at the end")
	}
	for _, task := range final.Tasks {
		if !strings.HasPrefix(task.ID, cfg.Prefix+"-") {
			t.Fatalf("foreign task %s", task.ID)
		}
	}
}

// TestHistoryCut: ops answered before the cut stay, ops begun after it
// go, and ops in flight at any point of it become unknown.
func TestHistoryCut(t *testing.T) {
	h := workload.NewHistory()
	t0 := h.Base()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	add := func(worker string, start, end int, outcome workload.Outcome) {
		h.Add(&workload.Op{Worker: worker, Kind: workload.KindInsert, Start: at(start), End: at(end), Outcome: outcome, Inserts: []workload.Insert{{ID: worker, Queue: "g/in"}}})
	}
	add("before", 0, 90, workload.OK)
	add("refused-before", 10, 95, workload.Failed)
	add("answered-during", 50, 150, workload.OK) // sent before the cut began
	add("refused-during", 120, 130, workload.Failed)
	add("spans", 80, 250, workload.OK)
	add("ends-after", 150, 250, workload.OK)
	add("after", 200, 210, workload.OK)
	c := h.Cut(at(100), at(200))
	want := map[string]workload.Outcome{"before": workload.OK, "refused-before": workload.Failed, "answered-during": workload.Unknown, "refused-during": workload.Unknown, "spans": workload.Unknown, "ends-after": workload.Unknown}
	ops := c.Ops()
	if len(ops) != len(want) {
		t.Fatalf("cut holds %d ops, want %d: %+v", len(ops), len(want), ops)
	}
	for i, op := range ops {
		if op.Index != i {
			t.Errorf("op %s: index %d, want %d", op.Worker, op.Index, i)
		}
		if o, ok := want[op.Worker]; !ok || op.Outcome != o {
			t.Errorf("op %s: outcome %v, want %v (kept %v)", op.Worker, op.Outcome, o, ok)
		}
	}
	if h.Ops()[2].Outcome != workload.OK {
		t.Error("Cut changed the history it was taken from")
	}
}
