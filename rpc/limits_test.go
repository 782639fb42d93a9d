package rpc_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestBadRequestsNeverReachTheLog sends each kind of malformed and oversized
// request to a shard leader of a real 3-node cluster: each is refused with
// InvalidArgument or ResourceExhausted, no shard's Raft log grows on any
// node, and the node goes on serving a good request afterwards.
func TestBadRequestsNeverReachTheLog(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: 2})
	c.WaitReady()
	// Leaders raise the state format through the log a second or so after
	// they settle (OP_SET_FORMAT): let that happen before the log is
	// watched, or its entry reads as a refused request that got in.
	c.WaitFormat()
	const q = "limits/q"
	ts := c.TaskStore(q)
	ctx := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	// A good insert first, so the shard has settled (leader, barrier done).
	if _, err := ts.Modify(ctx(), &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Id: "ok0", Queue: q}}}); err != nil {
		t.Fatal(err)
	}
	lim := fsm.DefaultLimits
	ins := func(in ...*taskstorepb.TaskInsert) *taskstorepb.ModifyRequest {
		return &taskstorepb.ModifyRequest{Inserts: in}
	}
	many := make([]*taskstorepb.TaskInsert, lim.MaxOps+1)
	for i := range many {
		many[i] = &taskstorepb.TaskInsert{Id: fmt.Sprintf("m%d", i), Queue: q}
	}
	bigSend := grpc.MaxCallSendMsgSize(64 << 20) // let the server be the one to refuse

	cases := []struct {
		name  string
		call  func() error
		codes []codes.Code
	}{
		{"message over MaxMessageBytes", func() error {
			_, err := ts.Modify(ctx(), ins(&taskstorepb.TaskInsert{Queue: q, Value: make([]byte, taskstorepb.MaxMessageBytes+1)}), bigSend)
			return err
		}, []codes.Code{codes.ResourceExhausted}},
		{"value over the value limit", func() error {
			_, err := ts.Modify(ctx(), ins(&taskstorepb.TaskInsert{Queue: q, Value: make([]byte, lim.MaxValueBytes+1)}), bigSend)
			return err
		}, []codes.Code{codes.InvalidArgument, codes.ResourceExhausted}},
		{"more operations than MaxOps", func() error {
			_, err := ts.Modify(ctx(), ins(many...))
			return err
		}, []codes.Code{codes.InvalidArgument, codes.ResourceExhausted}},
		{"transaction across groups", func() error {
			_, err := ts.Modify(ctx(), ins(&taskstorepb.TaskInsert{Queue: q}, &taskstorepb.TaskInsert{Queue: "other/q"}))
			return err
		}, []codes.Code{codes.InvalidArgument}},
		{"empty queue name", func() error {
			_, err := ts.Modify(ctx(), ins(&taskstorepb.TaskInsert{Id: "e1"}))
			return err
		}, []codes.Code{codes.InvalidArgument}},
		{"id over the id limit", func() error {
			_, err := ts.Modify(ctx(), ins(&taskstorepb.TaskInsert{Id: strings.Repeat("x", lim.MaxIDBytes+1), Queue: q}))
			return err
		}, []codes.Code{codes.InvalidArgument, codes.ResourceExhausted}},
		{"empty transaction", func() error {
			_, err := ts.Modify(ctx(), &taskstorepb.ModifyRequest{})
			return err
		}, []codes.Code{codes.InvalidArgument}},
		{"claim without queues", func() error {
			_, err := ts.Claim(ctx(), &taskstorepb.ClaimRequest{Claimant: "w", Lease: durationpb.New(time.Second)})
			return err
		}, []codes.Code{codes.InvalidArgument}},
		{"claim with a negative lease", func() error {
			_, err := ts.Claim(ctx(), &taskstorepb.ClaimRequest{Queues: []string{q}, Claimant: "w", Lease: durationpb.New(-time.Second)})
			return err
		}, []codes.Code{codes.InvalidArgument}},
		{"claim across groups", func() error {
			_, err := ts.Claim(ctx(), &taskstorepb.ClaimRequest{Queues: []string{q, "other/q"}, Claimant: "w", Lease: durationpb.New(time.Second)})
			return err
		}, []codes.Code{codes.InvalidArgument}},
		{"modify's claim in another group", func() error {
			_, err := ts.Modify(ctx(), &taskstorepb.ModifyRequest{Claimant: "w", Inserts: []*taskstorepb.TaskInsert{{Queue: q}},
				Claim: &taskstorepb.ModifyClaim{Queues: []string{"other/q"}}})
			return err
		}, []codes.Code{codes.InvalidArgument}},
		{"modify's claim without a claimant", func() error {
			_, err := ts.Modify(ctx(), &taskstorepb.ModifyRequest{Claim: &taskstorepb.ModifyClaim{Queues: []string{q}}})
			return err
		}, []codes.Code{codes.InvalidArgument}},
		{"modify's claim with a negative lease", func() error {
			_, err := ts.Modify(ctx(), &taskstorepb.ModifyRequest{Claimant: "w",
				Claim: &taskstorepb.ModifyClaim{Queues: []string{q}, Lease: durationpb.New(-time.Second)}})
			return err
		}, []codes.Code{codes.InvalidArgument}},
		{"modify's claim over the claim limit", func() error {
			_, err := ts.Modify(ctx(), &taskstorepb.ModifyRequest{Claimant: "w",
				Claim: &taskstorepb.ModifyClaim{Queues: []string{q}, Limit: uint32(lim.MaxClaimLimit + 1)}})
			return err
		}, []codes.Code{codes.InvalidArgument}},
	}

	before := settledIndexes(t, c)
	for _, tc := range cases {
		err := tc.call()
		code := status.Code(err)
		ok := false
		for _, want := range tc.codes {
			ok = ok || code == want
		}
		if !ok {
			t.Errorf("%s: got %v (%v), want one of %v", tc.name, code, err, tc.codes)
			continue
		}
		if msg := status.Convert(err).Message(); msg == "" {
			t.Errorf("%s: %v without a message", tc.name, code)
		}
		t.Logf("%s: %v: %s", tc.name, code, truncate(status.Convert(err).Message(), 160))
	}
	after := settledIndexes(t, c)
	for key, b := range before {
		// A new term appends one no-op entry (an election, or the
		// controller balancing leadership); anything beyond that is a
		// command, and no command was accepted in between.
		a := after[key]
		if grown, terms := a.index-b.index, a.term-b.term; grown > terms {
			t.Errorf("%s: last log index moved from %d to %d in %d new terms: a refused request reached the log", key, b.index, a.index, terms)
		}
	}
	// Nothing of the refused requests is visible either.
	listed, err := ts.Tasks(ctx(), &taskstorepb.TasksRequest{Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(listed.GetTasks()); got != 1 {
		t.Errorf("queue %s holds %d tasks after the refused requests, want 1 (ok0)", q, got)
	}
	// Still serving, and a request between gRPC's default 4 MiB and
	// MaxMessageBytes (five values at their limit) is read, not refused.
	var big []*taskstorepb.TaskInsert
	for i := range 5 {
		big = append(big, &taskstorepb.TaskInsert{Id: fmt.Sprintf("big%d", i), Queue: q, Value: make([]byte, lim.MaxValueBytes)})
	}
	if _, err := c.TaskStore(q).Modify(ctx(), ins(big...), bigSend, grpc.MaxCallRecvMsgSize(taskstorepb.MaxResponseBytes)); err != nil {
		t.Fatalf("a 5 MiB transaction after the bad ones: %v", err)
	}
}

// settledIndexes waits (a few seconds at most) until every replica of each
// shard has the same last log index, so that a follower still catching up
// on the good insert is not taken for a refused request in the log.
func settledIndexes(t *testing.T, c *harness.Cluster) map[string]logPosition {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		pos := lastIndexes(c)
		last := map[string]uint64{}
		settled := true
		for key, p := range pos {
			shard := key[strings.Index(key, " ")+1:]
			if l, ok := last[shard]; ok && l != p.index {
				settled = false
			}
			last[shard] = p.index
		}
		if settled || time.Now().After(deadline) {
			return pos
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type logPosition struct{ index, term uint64 }

// lastIndexes is the last log index and the term of every data shard on
// every node.
func lastIndexes(c *harness.Cluster) map[string]logPosition {
	out := map[string]logPosition{}
	for i, n := range c.Nodes {
		for _, id := range []uint32{1, 2} {
			out[fmt.Sprintf("%s shard %d", n.ID, id)] = logPosition{
				index: c.RaftStat(i, id, "last_log_index"),
				term:  c.RaftStat(i, id, "term"),
			}
		}
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
