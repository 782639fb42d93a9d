package statuspage_test

import (
	"context"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/rpc/statuspage"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestStatusPageInChromiumTellsTheTruth renders the pages of a real
// cluster in headless Chromium: a task whose delay ran out with
// no write since shows as available, not delayed (item 1: "Delayed 1"
// stayed for minutes); with a node down, the overview says which shard is
// under-replicated and counts the members alive (item 3).
func TestStatusPageInChromiumTellsTheTruth(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2})
	c.WaitReady()
	const q = "page/q"
	// Long enough for Chromium to render the page once before it ends.
	const delay = 10 * time.Second
	inserted := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := c.TaskStore(q).Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{
		{Queue: q, Value: []byte("soon"), Delay: durationpb.New(delay)}}}); err != nil {
		t.Fatal(err)
	}
	leader := c.Leader(c.ShardOf(q))
	ns := c.Nodes[leader].Server()
	srv := httptest.NewServer(statuspage.New(ns.Node, ns.RPC, statuspage.Options{Refresh: -1}))
	defer srv.Close()
	if cells := row(t, renderedDOM(t, srv.URL+"/queues"), `href="/queues/page%2Fq"`); !slices.Equal(cells[:6], []string{q, "1", "1", "0", "0", "1"}) {
		t.Fatalf("at first the row is %q, want 1 delayed", cells)
	}
	time.Sleep(time.Until(inserted.Add(delay))) // the delay runs out; nothing is written
	var cells []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		cells = row(t, renderedDOM(t, srv.URL+"/queues"), `href="/queues/page%2Fq"`)
		if slices.Equal(cells[:6], []string{q, "1", "1", "1", "0", "0"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the delay the row is %q, want the task available", cells)
		}
	}

	victim := (leader + 1) % len(c.Nodes)
	c.Kill(victim)
	want := []string{"<b>Under-replicated:</b> shard 1 (2 of 3 replicas healthy).", "Members alive"}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		dom := renderedDOM(t, srv.URL+"/")
		if strings.Contains(dom, want[0]) && strings.Contains(dom, want[1]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with %s down the overview lacks %q:\n%s", c.Nodes[victim].ID, want, dom)
		}
	}
}
