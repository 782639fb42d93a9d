package rpc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestFailureKindsMapToCodes: each kind of failure the state machine
// decides reaches a client over real gRPC as its code (the node maps the
// kind, not the message). MOVED and ANSWER_TOO_LARGE are covered by the
// slot move and amplification tests.
func TestFailureKindsMapToCodes(t *testing.T) {
	c := harness.Start(t, 1, harness.Options{Shards: 1, Secure: true, StateStore: cluster.StateInMemory, MemoryLimit: 320 << 10})
	c.WaitReady()
	c.WaitFormat()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.Security.AdminToken)
	client := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.Security.ClientToken)
	ts := c.TaskStore("demo/q")
	insert := func(ctx context.Context, queue, id string, value []byte) error {
		_, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Id: id, Queue: queue, Value: value}}})
		return err
	}
	// A task of group demo outside the client's prefix demo/.
	if err := insert(admin, "demo", "secret", nil); err != nil {
		t.Fatal(err)
	}
	rid := func(seq uint64) *taskstorepb.RequestID { return &taskstorepb.RequestID{ClientId: "kinds", Seq: seq} }
	if _, err := ts.Modify(admin, &taskstorepb.ModifyRequest{Request: rid(2), Inserts: []*taskstorepb.TaskInsert{{Queue: "demo/q"}}}); err != nil {
		t.Fatal(err)
	}

	for _, k := range []struct {
		kind string
		call func() error
		want codes.Code
	}{
		{"REFERENCES", func() error {
			_, err := ts.Modify(admin, &taskstorepb.ModifyRequest{Deletes: []*taskstorepb.TaskRef{{Id: "missing", Version: 1, Queue: "demo/q"}}})
			return err
		}, codes.FailedPrecondition},
		{"STALE_SEQUENCE", func() error {
			_, err := ts.Modify(admin, &taskstorepb.ModifyRequest{Request: rid(1), Inserts: []*taskstorepb.TaskInsert{{Queue: "demo/q"}}})
			return err
		}, codes.FailedPrecondition},
		{"OUT_OF_SCOPE", func() error {
			_, err := ts.Modify(client, &taskstorepb.ModifyRequest{Deletes: []*taskstorepb.TaskRef{{Id: "secret", Version: 1, Queue: "demo/q"}}})
			return err
		}, codes.PermissionDenied},
		{"MEMORY_FULL", func() error {
			value := []byte(strings.Repeat("x", 1000))
			for i := range 1000 {
				if err := insert(admin, "demo/full", "", value); err != nil || i == 999 {
					return err
				}
			}
			return nil
		}, codes.ResourceExhausted},
	} {
		err := k.call()
		if status.Code(err) != k.want {
			t.Errorf("%s: %v, want %v", k.kind, err, k.want)
		}
		// The reason is in a detail, for clients to decide by.
		if k.kind == "MEMORY_FULL" && len(status.Convert(err).Details()) != 1 {
			t.Errorf("%s: details %v, want an ErrorInfo", k.kind, status.Convert(err).Details())
		}
	}
}
