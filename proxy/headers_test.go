package proxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// TestHeadersEndToEnd: a task's headers go in over HTTP and through the Go
// client (gRPC), come back in listings of both, filter a listing (the
// gateway's headers[KEY]=VALUE query parameters), survive a change that
// moves the task, are replaced by a change that names them, and headers
// over the bounds are refused as InvalidArgument (HTTP 400).
func TestHeadersEndToEnd(t *testing.T) {
	c := startCluster(t)
	c.WaitFormat()
	p := startProxy(t, c)
	base := "http://" + p.HTTPAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := client.Dial(ctx, strings.Join(c.Endpoints(), ","))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	trace := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme"}
	tk, err := cl.Insert(ctx, "hdr/q", []byte("x"), client.WithHeaders(trace))
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(tk.Headers, trace) {
		t.Fatalf("inserted %v, want headers %v", tk.Headers, trace)
	}
	res, err := http.Post(base+"/v1/modify", "application/json", strings.NewReader(`{"inserts":[{"queue":"hdr/q","id":"web-1","headers":{"tenant":"other"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(b), `"headers":{"tenant":"other"}`) {
		t.Fatalf("HTTP insert: %d %s", res.StatusCode, b)
	}

	// Filters: over gRPC and over HTTP.
	list, err := cl.Tasks(ctx, &taskstorepb.TasksRequest{Queue: "hdr/q", Headers: map[string]string{"tenant": "acme"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Tasks) != 1 || list.Tasks[0].Id != tk.Id || !maps.Equal(list.Tasks[0].Headers, trace) {
		t.Fatalf("gRPC listing tenant=acme: %v", list.Tasks)
	}
	q := url.Values{"queue": {"hdr/q"}, "headers[tenant]": {"other"}}
	res, err = http.Get(base + "/v1/tasks?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	var page struct {
		Tasks []struct {
			ID      string
			Headers map[string]string
		}
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if err := json.Unmarshal(b, &page); err != nil || res.StatusCode != 200 {
		t.Fatalf("HTTP listing: %d %s (%v)", res.StatusCode, b, err)
	}
	if len(page.Tasks) != 1 || page.Tasks[0].ID != "web-1" || page.Tasks[0].Headers["tenant"] != "other" {
		t.Fatalf("HTTP listing tenant=other: %s", b)
	}

	// A move keeps them; a change naming them replaces them.
	mv, err := cl.Modify(ctx, &taskstorepb.ModifyRequest{Changes: []*taskstorepb.TaskChange{{Id: tk.Id, Version: tk.Version, Queue: "hdr/q", NewQueue: "hdr/dead"}}})
	if err != nil {
		t.Fatal(err)
	}
	moved := mv.Changed[0]
	if !maps.Equal(moved.Headers, trace) {
		t.Fatalf("moved %v, want headers kept", moved)
	}
	ch, err := cl.Modify(ctx, &taskstorepb.ModifyRequest{Changes: []*taskstorepb.TaskChange{{Id: tk.Id, Version: moved.Version, Queue: "hdr/dead", Headers: map[string]string{"tenant": "acme2"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := ch.Changed[0].Headers; !maps.Equal(got, map[string]string{"tenant": "acme2"}) {
		t.Fatalf("replaced headers %v", got)
	}

	// Over the bounds: InvalidArgument, naming the field.
	_, err = cl.Insert(ctx, "hdr/q", nil, client.WithHeaders(map[string]string{"k": strings.Repeat("v", 5000)}))
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "headers") {
		t.Fatalf("a 5000-byte header: %v, want ErrInvalid naming headers", err)
	}
	res, err = http.Post(base+"/v1/modify", "application/json", strings.NewReader(`{"inserts":[{"queue":"hdr/q","headers":{"":"v"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 400 || !strings.Contains(string(b), "headers") {
		t.Fatalf("HTTP insert of an empty header key: %d %s, want 400", res.StatusCode, b)
	}
}
