package clienttest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client/clienttest"
)

// TestFakeKeepsTheNodesRules sends the fake requests that a node refuses
// or answers by rules its old in-memory copy did not have (a
// third copy of the rules that could drift). Each must get the node's
// answer, because the fake now runs the node's TaskStore service over a
// real state machine.
func TestFakeKeepsTheNodesRules(t *testing.T) {
	c := clienttest.New(t, 1, 1)
	conn, err := grpc.NewClient(c.Addrs(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ts := taskstorepb.NewTaskStoreClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ins, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: "g/q", Key: "k"}}})
	if err != nil {
		t.Fatal(err)
	}
	task := ins.Inserted[0]
	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"a value over 1 MiB", func() error {
			_, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: "g/q", Value: make([]byte, 1<<20+1)}}})
			return err
		}, codes.ResourceExhausted, "inserts[0].value"},
		{"version 0", func() error {
			_, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Deletes: []*taskstorepb.TaskRef{{Queue: "g/q", Id: task.Id}}})
			return err
		}, codes.InvalidArgument, "version"},
		{"a claim limit over 1000", func() error {
			_, err := ts.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"g/q"}, Limit: 1001})
			return err
		}, codes.InvalidArgument, "limit"},
		{"a lease over 24 h", func() error {
			_, err := ts.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"g/q"}, Lease: durationpb.New(25 * time.Hour)})
			return err
		}, codes.InvalidArgument, "lease"},
		{"a wait over 5 minutes", func() error {
			_, err := ts.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"g/q"}, Wait: durationpb.New(6 * time.Minute)})
			return err
		}, codes.InvalidArgument, "wait"},
		{"a queue name starting with /", func() error {
			_, err := ts.Tasks(ctx, &taskstorepb.TasksRequest{Queue: "/q"})
			return err
		}, codes.InvalidArgument, "queue"},
		{"a request id going backwards", func() error {
			req := func(seq uint64) *taskstorepb.ModifyRequest {
				return &taskstorepb.ModifyRequest{Request: &taskstorepb.RequestID{ClientId: "c1", Seq: seq},
					Inserts: []*taskstorepb.TaskInsert{{Queue: "g/q"}}}
			}
			if _, err := ts.Modify(ctx, req(5)); err != nil {
				return err
			}
			_, err := ts.Modify(ctx, req(4))
			return err
		}, codes.FailedPrecondition, ""},
	} {
		err := tc.call()
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: %v, want %v naming %q", tc.name, err, tc.code, tc.msg)
		}
	}
	// Tasks and versions as the machine keeps them: a claim raises the
	// version and the claim count, the key stays reserved.
	cl, err := ts.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"g/q"}})
	if err != nil || len(cl.Tasks) != 1 {
		t.Fatalf("claim: %v, %v", cl, err)
	}
	if got := cl.Tasks[0]; got.Id != task.Id || got.Version <= task.Version || got.Claims != 1 || got.Claimant != "w" {
		t.Errorf("claimed %v, from %v", got, task)
	}
	if got := c.Task(task.Id); got == nil || got.Version != cl.Tasks[0].Version {
		t.Errorf("Cluster.Task: %v, want version %d", got, cl.Tasks[0].Version)
	}
}
