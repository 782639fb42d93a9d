package proxy_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestProducerThroughProxy runs the shared leader-loss scenario
// (harness.ProduceLeaderLoss) with a Producer whose client knows only the
// proxy: the proxy relays each item over its own streams to the leaders
// and retries the items of the killed one with their request ids.
func TestProducerThroughProxy(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	pc := dial(t, p.Addr(), client.WithProxyOnly())
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	harness.ProduceLeaderLoss(ctx, t, c, pc.NewProducer(client.WithInflight(32)), dial(t, strings.Join(c.Endpoints(), ",")), "pp", 400)
}

// TestModifyTravelsOnTheStream: a caller's unary Modify reaches the node
// over the proxy's Produce stream to it, so the calls of many callers
// share messages and writes on the proxy's hop; the proxy's gauge of open
// streams shows it. The answer, and a refusal's code, are the unary call's.
func TestModifyTravelsOnTheStream(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	pc := dial(t, p.Addr(), client.WithProxyOnly())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if n := proxyStreams(t, p.HTTPAddr()); n != 0 {
		t.Fatalf("before any call: %v open streams, want 0", n)
	}
	resp, err := pc.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: "ms/q", Value: []byte("v")}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetInserted()) != 1 || string(resp.Inserted[0].GetValue()) != "v" {
		t.Fatalf("answer %v: want the one inserted task with its value", resp)
	}
	if n := proxyStreams(t, p.HTTPAddr()); n < 1 {
		t.Fatalf("after a Modify: %v open streams, want the stream it travelled on", n)
	}
	// A refused transaction keeps its code: a commit of a version that
	// does not exist.
	task := resp.Inserted[0]
	_, err = pc.Modify(ctx, &taskstorepb.ModifyRequest{Deletes: []*taskstorepb.TaskRef{{Queue: task.Queue, Id: task.Id, Version: task.Version + 7}}})
	if code := status.Code(err); code != codes.FailedPrecondition {
		t.Fatalf("delete of a wrong version: %v (%v), want the unary call's refusal", err, code)
	}
}

// proxyStreams reads taskstore_proxy_produce_streams from the proxy's
// metrics.
func proxyStreams(t *testing.T, httpAddr string) float64 {
	t.Helper()
	res, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(line, "taskstore_proxy_produce_streams "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no taskstore_proxy_produce_streams in the proxy's metrics")
	return 0
}
