package client_test

import (
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestIdleProduceStreamCloses: a Produce stream to a leader with nothing in
// flight for WithStreamIdle is closed, and the next streamed request opens
// a new one and is answered.
func TestIdleProduceStreamCloses(t *testing.T) {
	hc := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2})
	hc.WaitReady()
	c := mustDial(t, strings.Join(hc.Endpoints(), ","), client.WithStreamIdle(300*time.Millisecond))
	ctx := ctxFor(t, 60*time.Second)
	if _, err := c.ModifyStreamed(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: "idle/q", Id: "a"}}}); err != nil {
		t.Fatal(err)
	}
	if n := c.OpenStreams(); n != 1 {
		t.Fatalf("%d streams open after a streamed request, want 1", n)
	}
	deadline := time.Now().Add(30 * time.Second)
	for c.OpenStreams() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the idle stream is still open")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := c.ModifyStreamed(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: "idle/q", Id: "b"}}}); err != nil {
		t.Fatalf("a request after the idle close: %v", err)
	}
	if n := c.OpenStreams(); n != 1 {
		t.Fatalf("%d streams open after the next request, want 1", n)
	}
}
