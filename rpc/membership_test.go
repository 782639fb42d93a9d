package rpc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/limits"
	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestAddNodeRefusesMalformedArguments sends AddNode calls with malformed
// ids and addresses to every node of a real cluster (followers forward to
// the meta leader): each is InvalidArgument, and neither the cluster map
// nor the meta group's Raft configuration gains a member. Before checkAddNode
// was called, an address without a port became a voter of the meta group.
func TestAddNodeRefusesMalformedArguments(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2})
	c.WaitReady()
	cases := []struct{ name, id, addr string }{
		{"no port", "bad1", "localhost"},
		{"port out of range", "bad2", "127.0.0.1:99999"},
		{"port zero", "bad3", "127.0.0.1:0"},
		{"empty host", "bad4", ":7000"},
		{"space in host", "bad5", "my host:7000"},
		{"control in id", "bad\n6", "127.0.0.1:7000"},
		{"space around id", " bad7", "127.0.0.1:7000"},
		{"id too long", strings.Repeat("x", 1000), "127.0.0.1:7000"},
		{"no id", "", "127.0.0.1:7000"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			admin := taskstorepb.NewAdminClient(c.Conn(i % len(c.Nodes)))
			_, err := admin.AddNode(ctx, &taskstorepb.AddNodeRequest{Id: tc.id, Address: tc.addr})
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("AddNode(%q, %q) = %v, want InvalidArgument", tc.id, tc.addr, err)
			}
		})
	}
	for i := range c.Nodes {
		if n := len(c.MetaVoters(i)); n != 3 {
			t.Errorf("node %d: the meta group has %d servers, want 3: %v", i, n, c.MetaVoters(i))
		}
		if n := len(c.Nodes[i].Server().Node.Map().Nodes); n != 3 {
			t.Errorf("node %d: the map has %d nodes, want 3", i, n)
		}
	}
}

// TestCommandLimitsAreConfigurable starts nodes whose command limits allow
// 3 operations per transaction: a 4-operation Modify is refused with
// ResourceExhausted, a 3-operation one commits. The server's limits were
// hard-wired to limits.DefaultCommands (1000) whatever the node was given.
func TestCommandLimitsAreConfigurable(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2,
		Limits: limits.Server{Commands: limits.Commands{MaxOps: 3}}})
	c.WaitReady()
	const q = "limited/q"
	ins := func(n int) *taskstorepb.ModifyRequest {
		req := &taskstorepb.ModifyRequest{}
		for i := range n {
			req.Inserts = append(req.Inserts, &taskstorepb.TaskInsert{Queue: q, Value: []byte{byte(i)}})
		}
		return req
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.TaskStore(q).Modify(ctx, ins(4)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("4 inserts = %v, want ResourceExhausted", err)
	}
	if _, err := c.TaskStore(q).Modify(ctx, ins(3)); err != nil {
		t.Fatalf("3 inserts: %v", err)
	}
}
