package statuspage_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/limits"
	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/auth"
	"github.com/e1158ecb/taskstore/rpc"
	"github.com/e1158ecb/taskstore/rpc/statuspage"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestPageMoveSplitsTooLargeAnswers requeues, from the status page, tasks
// whose values together are over the answer a node may send (the nodes
// here send at most 1 MiB; a move echoes the moved tasks with their
// values): the page moves with the client's loop, which splits such a batch,
// so every task moves. A loop without the split is refused with
// ResourceExhausted and moves nothing.
func TestPageMoveSplitsTooLargeAnswers(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2,
		Limits: limits.Server{MaxResponseBytes: 1 << 20}})
	c.WaitReady()
	c.WaitFormat()
	const work, dead, n = "big/work", "big/dead", 8
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ts := c.TaskStore(dead)
	for i := range n {
		// One at a time: the insert's own answer echoes the value.
		v := bytes.Repeat([]byte{byte('a' + i)}, 200<<10)
		if _, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: dead, Value: v}}}); err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
	}
	ns := c.Nodes[0].Server()
	page := statuspage.New(ns.Node, ns.RPC, statuspage.Options{Refresh: -1, Actions: rpc.PageActions(ns.RPC)})
	admin := auth.Principal{Role: auth.RoleAdmin, Name: "ops"}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		page.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), admin)))
	}))
	defer srv.Close()
	get := func(path string) string {
		t.Helper()
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return string(body)
	}
	var tok string
	if m := tokenRE.FindStringSubmatch(get("/queues/" + url.PathEscape(dead))); m != nil {
		tok = m[1]
	} else {
		t.Fatal("the queue's page offers an admin no actions")
	}
	res, err := http.PostForm(srv.URL+"/actions", url.Values{"do": {"move"}, "queue": {dead}, "to": {work}, "token": {tok}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if want := "Moved 8 task(s) from big/dead to big/work."; !strings.Contains(string(body), want) {
		t.Fatalf("after the move (HTTP %d) the page says:\n%s\nwant %q", res.StatusCode, body, want)
	}
	for q, want := range map[string]int{work: n, dead: 0} {
		resp, err := c.TaskStore(q).Tasks(ctx, &taskstorepb.TasksRequest{Queue: q, OmitValues: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := len(resp.GetTasks()); got != want {
			t.Errorf("%s holds %d tasks, want %d", q, got, want)
		}
	}
}
