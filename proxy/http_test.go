package proxy_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/proxy"
	"github.com/e1158ecb/taskstore/rpc"
)

// TestHTTPEndpoints checks /healthz, /readyz, /metrics and an error body.
func TestHTTPEndpoints(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	base := "http://" + p.HTTPAddr()
	get := func(path string) (int, string) {
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get(path); code != 200 {
			t.Errorf("%s: %d %s", path, code, body)
		}
	}
	// pprof is off unless asked for: /debug/pprof/cmdline prints the flags.
	if code, body := get("/debug/pprof/cmdline"); code == 200 {
		t.Errorf("/debug/pprof/cmdline without Pprof: %d %s", code, body)
	}
	// One request so that the counters have a series.
	res, err := http.Post(base+"/v1/modify", "application/json", strings.NewReader(`{"inserts":[{"queue":"web/q","id":"web-1","value":"aGk="}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(b), `"id":"web-1"`) {
		t.Fatalf("insert: %d %s", res.StatusCode, b)
	}
	// The same insert again is refused, with the details in the body.
	res, err = http.Post(base+"/v1/modify", "application/json", strings.NewReader(`{"inserts":[{"queue":"web/q","id":"web-1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	var body struct {
		Code    int
		Message string
		Details []map[string]any
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("error body %s: %v", b, err)
	}
	if res.StatusCode != 400 || body.Code != int(codes.FailedPrecondition) || len(body.Details) != 1 ||
		body.Details[0]["@type"] != "type.googleapis.com/taskstore.v1.ModifyError" {
		t.Fatalf("duplicate insert: %d %s", res.StatusCode, b)
	}
	// A typo in a field name is refused, not ignored.
	res, err = http.Post(base+"/v1/claim", "application/json", strings.NewReader(`{"queue":["web/q"],"claimant":"w"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 400 {
		t.Errorf("unknown field: HTTP %d, want 400", res.StatusCode)
	}
	// A Go duration ("1m") is refused saying what a duration looks like
	// in JSON (the refusal named only the type).
	res, err = http.Post(base+"/v1/claim", "application/json", strings.NewReader(`{"queues":["web/q"],"claimant":"w","lease":"1m"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 400 || !strings.Contains(string(b), `seconds with an \"s\"`) {
		t.Errorf("lease 1m: HTTP %d %s, want 400 saying how to write a duration", res.StatusCode, b)
	}
	code, metrics := get("/metrics")
	for _, series := range []string{"taskstore_build_info{", `grpc_server_handled_total{grpc_code="OK",grpc_method="Modify",grpc_service="taskstore.v1.TaskStore",grpc_type="unary"}`,
		// The proxy relays a Modify over its Produce stream to the node.
		`grpc_client_started_total{grpc_method="Produce",grpc_service="taskstore.v1.TaskStore",grpc_type="bidi_stream"}`} {
		if !strings.Contains(metrics, series) {
			t.Errorf("metrics lack %s", series)
		}
	}
	if code != 200 || !strings.Contains(metrics, `taskstore_proxy_requests_total{code="OK",method="Modify"} 1`) ||
		!strings.Contains(metrics, `taskstore_proxy_requests_total{code="FailedPrecondition",method="Modify"} 1`) {
		t.Errorf("metrics: %d\n%s", code, metrics)
	}
	// Status through the proxy lists the cluster's nodes.
	code, st := get("/v1/status")
	if code != 200 || !strings.Contains(st, c.Nodes[0].Addr) {
		t.Errorf("status: %d %s", code, st)
	}
}

// TestMaxWaitIsTheNodes: the proxy sends a claim with a longer wait to a
// node to refuse, so it must know the node's bound.
func TestMaxWaitIsTheNodes(t *testing.T) {
	if proxy.MaxWait != rpc.MaxWait {
		t.Fatalf("proxy's maxWait %v, node's %v", proxy.MaxWait, rpc.MaxWait)
	}
}

// TestHTTPBodyLimit: the HTTP/JSON API refuses a body
// over MaxJSONBodyBytes with 413 before decoding it, whether it says its
// length or is chunked, and a body within it still works.
func TestHTTPBodyLimit(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	url := "http://" + p.HTTPAddr() + "/v1/modify"
	post := func(body io.Reader, length int64) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, url, body)
		req.ContentLength = length
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	// A well-formed request whose value alone is over the limit.
	huge := `{"inserts":[{"queue":"web/big","value":"` + strings.Repeat("AAAA", proxy.MaxJSONBodyBytes/4+1) + `"}]}`
	if code, body := post(strings.NewReader(huge), int64(len(huge))); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "over the limit") {
		t.Errorf("a body over the limit, with its length: %d %.200s", code, body)
	}
	// Chunked: no length to refuse by; the proxy stops reading at the limit.
	if code, body := post(io.MultiReader(strings.NewReader(huge)), -1); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a chunked body over the limit: %d %.200s", code, body)
	}
	value := base64.StdEncoding.EncodeToString(make([]byte, 1<<20))
	ok := `{"inserts":[{"queue":"web/big","value":"` + value + `"}]}`
	if code, body := post(strings.NewReader(ok), int64(len(ok))); code != http.StatusOK {
		t.Errorf("a 1 MiB value: %d %.200s", code, body)
	}
	if code, body := post(io.MultiReader(strings.NewReader(ok)), -1); code != http.StatusOK {
		t.Errorf("a chunked 1 MiB value: %d %.200s", code, body)
	}
}

// TestProxyRefusesWhatNodesRefuseAtOnce: a queue that
// names no consistency group ("/x") and a negative claim wait are refused
// by the proxy as by a node, with the node's InvalidArgument and at once;
// the proxy used to retry routing "/x" for 30 s and then answer 503, and to
// accept the negative wait.
func TestProxyRefusesWhatNodesRefuseAtOnce(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	for name, addr := range map[string]string{"proxy": p.Addr(), "node": c.Nodes[0].Addr} {
		ts := taskstorepb.NewTaskStoreClient(grpcConn(t, addr))
		calls := map[string]func(ctx context.Context) error{
			"insert into /x": func(ctx context.Context) error {
				_, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: "/x"}}})
				return err
			},
			"claim /x": func(ctx context.Context) error {
				_, err := ts.Claim(ctx, &taskstorepb.ClaimRequest{Queues: []string{"/x"}, Claimant: "w"})
				return err
			},
			"list /x": func(ctx context.Context) error {
				_, err := ts.Tasks(ctx, &taskstorepb.TasksRequest{Queue: "/x"})
				return err
			},
			"claim with a negative wait": func(ctx context.Context) error {
				_, err := ts.Claim(ctx, &taskstorepb.ClaimRequest{Queues: []string{"web/q"}, Claimant: "w", Wait: durationpb.New(-time.Second)})
				return err
			},
		}
		for call, f := range calls {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			start := time.Now()
			err := f(ctx)
			cancel()
			if status.Code(err) != codes.InvalidArgument || time.Since(start) > 5*time.Second {
				t.Errorf("%s, %s: %v after %v, want InvalidArgument at once", name, call, err, time.Since(start).Round(time.Millisecond))
			}
		}
	}
}

// TestHTTPUnknownQueryParameter: a query parameter that
// names no field (a typo) is a 400 naming it, not silently dropped; the
// known ones, by JSON or proto name, still work.
func TestHTTPUnknownQueryParameter(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	get := func(path string) (int, string) {
		res, err := http.Get("http://" + p.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for path, want := range map[string]int{
		"/v1/tasks?queue=web/q&limt=5":          http.StatusBadRequest,
		"/v1/tasks?queue=web/q&stal=true":       http.StatusBadRequest,
		"/v1/queues?prefix=web/&shard.x=1":      http.StatusBadRequest,
		"/v1/tasks?queue=web/q&limit=5":         http.StatusOK,
		"/v1/tasks?queue=web/q&omitValues=true": http.StatusOK,
		"/v1/tasks?queue=web/q&omit_values=1":   http.StatusOK,
	} {
		code, body := get(path)
		if code != want || want == http.StatusBadRequest && !strings.Contains(body, "unknown query parameter") {
			t.Errorf("%s: %d %s, want %d", path, code, body, want)
		}
	}
}

// TestHTTPClaimSaysWhyEmpty: a claim over HTTP of a paused queue, or of one
// at its concurrency limit, answers with the reason in empty_reason (it
// answered {} while taskctl said why); a claim of a queue that is just
// empty has none.
func TestHTTPClaimSaysWhyEmpty(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	base := "http://" + p.HTTPAddr()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ts := c.TaskStore("why/paused")
	if _, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{
		{Queue: "why/paused", Id: "p1"}, {Queue: "why/full", Id: "f1"}, {Queue: "why/full", Id: "f2"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.PauseQueue(ctx, &taskstorepb.QueuePauseRequest{Queue: "why/paused"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.SetQueueLimit(ctx, &taskstorepb.QueueLimitRequest{Queue: "why/full", MaxClaimed: 1}); err != nil {
		t.Fatal(err)
	}
	claim := func(queues string) (int, string) {
		t.Helper()
		res, err := http.Post(base+"/v1/claim", "application/json", strings.NewReader(`{"queues":[`+queues+`],"claimant":"w"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := claim(`"why/full"`); code != 200 || !strings.Contains(body, `"id":"f1"`) {
		t.Fatalf("first claim of why/full: %d %s", code, body)
	}
	for _, c := range []struct{ queues, want string }{
		{`"why/paused"`, `"emptyReason":"why/paused is paused (taskctl queue resume why/paused)"`},
		{`"why/full"`, `"emptyReason":"why/full has 1 claimed, its limit of 1 (taskctl queue limit)"`},
		{`"why/paused","why/full","why/empty"`, `"emptyReason":"why/paused is paused (taskctl queue resume why/paused); why/full has 1 claimed, its limit of 1 (taskctl queue limit)"`},
		{`"why/empty"`, `{}`},
	} {
		if code, body := claim(c.queues); code != 200 || strings.TrimSpace(body) != "{"+strings.TrimPrefix(c.want, "{") && !strings.Contains(body, c.want) {
			t.Errorf("claim of %s: %d %s, want %s", c.queues, code, body, c.want)
		}
	}
}

// TestHTTPDedupSaysKeyTaskDeleted: an insert refused for a key whose task
// was deleted within its dedup window says so in the refusal
// (existing_deleted), and an if_absent insert answered with that task names
// it in coalesced_deleted; a key held by a live task says neither.
func TestHTTPDedupSaysKeyTaskDeleted(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	base := "http://" + p.HTTPAddr()
	post := func(body string) (int, string) {
		t.Helper()
		res, err := http.Post(base+"/v1/modify", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := post(`{"inserts":[{"queue":"dd/q","id":"t1","key":"k","dedupWindow":"600s"},{"queue":"dd/q","id":"t2","key":"live"}]}`); code != 200 {
		t.Fatalf("insert: %d %s", code, body)
	}
	if code, body := post(`{"deletes":[{"id":"t1","queue":"dd/q","version":"1"}]}`); code != 200 {
		t.Fatalf("delete: %d %s", code, body)
	}
	if code, body := post(`{"inserts":[{"queue":"dd/q","id":"t3","key":"k"}]}`); code != 400 || !strings.Contains(body, `"existingId":"t1"`) || !strings.Contains(body, `"existingDeleted":true`) {
		t.Errorf("insert of a reserved key: %d %s, want refused with existingDeleted", code, body)
	}
	if code, body := post(`{"inserts":[{"queue":"dd/q","id":"t4","key":"live"}]}`); code != 400 || strings.Contains(body, `existingDeleted`) {
		t.Errorf("insert of a live task's key: %d %s, want refused without existingDeleted", code, body)
	}
	if code, body := post(`{"inserts":[{"queue":"dd/q","key":"k","ifAbsent":true},{"queue":"dd/q","key":"live","ifAbsent":true}]}`); code != 200 || !strings.Contains(body, `"coalescedDeleted":[0]`) {
		t.Errorf("if_absent inserts of a reserved and a live key: %d %s, want coalescedDeleted [0]", code, body)
	}
}
