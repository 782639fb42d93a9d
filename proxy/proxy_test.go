package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/proxy"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// startCluster starts a 3-node in-process cluster with 4 shards and waits
// for settled leaders.
func startCluster(t *testing.T) *harness.Cluster {
	t.Helper()
	c := harness.Start(t, 3, harness.Options{Shards: 4, Scale: 2})
	c.WaitReady()
	return c
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { recover() }() // a log line after the test ended
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// startProxy starts a proxy on loopback ports in front of c and waits until
// it has read the routing table.
func startProxy(t testing.TB, c *harness.Cluster, opts ...func(*proxy.Config)) *proxy.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := proxy.Config{
		Cluster:       strings.Join(c.Endpoints(), ","),
		ListenAddr:    "127.0.0.1:0",
		HTTPAddr:      "127.0.0.1:0",
		Logger:        slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		ClientOptions: []client.Option{client.WithBackoff(5*time.Millisecond, 500*time.Millisecond)},
	}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := proxy.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for s.Ready() != nil {
		if ctx.Err() != nil {
			t.Fatalf("proxy not ready: %v", s.Ready())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return s
}

func dial(t *testing.T, addrs string, opts ...client.Option) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts = append([]client.Option{client.WithBackoff(5*time.Millisecond, 500*time.Millisecond)}, opts...)
	cl, err := client.Dial(ctx, addrs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func grpcConn(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// api is what the equivalence test calls; the Go client, a proxy's gRPC
// service and its HTTP/JSON face each implement it.
type api interface {
	Modify(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error)
	Claim(ctx context.Context, req *taskstorepb.ClaimRequest) (*taskstorepb.ClaimResponse, error)
	Tasks(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error)
	Queues(ctx context.Context, req *taskstorepb.QueuesRequest) (*taskstorepb.QueuesResponse, error)
	Purge(ctx context.Context, req *taskstorepb.PurgeRequest) (*taskstorepb.PurgeResponse, error)
}

// directAPI is the Go client routing to leaders itself.
type directAPI struct{ *client.Client }

func (d directAPI) Purge(ctx context.Context, req *taskstorepb.PurgeRequest) (*taskstorepb.PurgeResponse, error) {
	n, err := d.Client.Purge(ctx, req.Queue)
	return &taskstorepb.PurgeResponse{Deleted: n}, err
}

// grpcAPI calls a proxy's TaskStore service.
type grpcAPI struct{ c taskstorepb.TaskStoreClient }

func (g grpcAPI) Modify(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error) {
	return g.c.Modify(ctx, req)
}
func (g grpcAPI) Claim(ctx context.Context, req *taskstorepb.ClaimRequest) (*taskstorepb.ClaimResponse, error) {
	return g.c.Claim(ctx, req)
}
func (g grpcAPI) Tasks(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error) {
	return g.c.Tasks(ctx, req)
}
func (g grpcAPI) Queues(ctx context.Context, req *taskstorepb.QueuesRequest) (*taskstorepb.QueuesResponse, error) {
	return g.c.Queues(ctx, req)
}
func (g grpcAPI) Purge(ctx context.Context, req *taskstorepb.PurgeRequest) (*taskstorepb.PurgeResponse, error) {
	return g.c.Purge(ctx, req)
}

// httpAPI calls a proxy's HTTP/JSON face the way curl would, and turns an
// error body back into a gRPC status. It records the HTTP codes of errors.
type httpAPI struct {
	base  string
	mu    sync.Mutex
	codes map[codes.Code]int // gRPC code -> HTTP status seen
}

func (h *httpAPI) do(ctx context.Context, method, path string, q url.Values, req, resp proto.Message) error {
	var body io.Reader
	if req != nil {
		b, err := protojson.Marshal(req)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	u := h.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	hr, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	hr.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(hr)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		var st spb.Status
		if err := protojson.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("http %d, undecodable body %q: %v", res.StatusCode, b, err)
		}
		h.mu.Lock()
		h.codes[codes.Code(st.Code)] = res.StatusCode
		h.mu.Unlock()
		return status.ErrorProto(&st)
	}
	return protojson.Unmarshal(b, resp)
}

func (h *httpAPI) Modify(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error) {
	resp := &taskstorepb.ModifyResponse{}
	return resp, h.do(ctx, "POST", "/v1/modify", nil, req, resp)
}
func (h *httpAPI) Purge(ctx context.Context, req *taskstorepb.PurgeRequest) (*taskstorepb.PurgeResponse, error) {
	resp := &taskstorepb.PurgeResponse{}
	return resp, h.do(ctx, "POST", "/v1/purge", nil, req, resp)
}
func (h *httpAPI) Claim(ctx context.Context, req *taskstorepb.ClaimRequest) (*taskstorepb.ClaimResponse, error) {
	resp := &taskstorepb.ClaimResponse{}
	return resp, h.do(ctx, "POST", "/v1/claim", nil, req, resp)
}

// Tasks uses GET with query parameters for ids and queues, as documented.
func (h *httpAPI) Tasks(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error) {
	resp := &taskstorepb.TasksResponse{}
	q := url.Values{}
	if req.Queue != "" {
		q.Set("queue", req.Queue)
	}
	for _, id := range req.Ids {
		q.Add("ids", id)
	}
	if req.Limit != 0 {
		q.Set("limit", fmt.Sprint(req.Limit))
	}
	if req.PageToken != "" {
		q.Set("pageToken", req.PageToken)
	}
	return resp, h.do(ctx, "GET", "/v1/tasks", q, nil, resp)
}
func (h *httpAPI) Queues(ctx context.Context, req *taskstorepb.QueuesRequest) (*taskstorepb.QueuesResponse, error) {
	resp := &taskstorepb.QueuesResponse{}
	q := url.Values{}
	if req.Prefix != "" {
		q.Set("prefix", req.Prefix)
	}
	return resp, h.do(ctx, "GET", "/v1/queues", q, nil, resp)
}

// norm renders a message for comparison: compact canonical JSON without the
// fields that legitimately differ between runs (times, and the shard a
// group happens to hash to), with the run's group name replaced by G.
func norm(m proto.Message, group string) string {
	m = proto.Clone(m)
	clearVolatile(m.ProtoReflect())
	b, err := protojson.Marshal(m)
	if err != nil {
		panic(err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		panic(err)
	}
	return strings.ReplaceAll(buf.String(), group, "G")
}

func clearVolatile(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Message() != nil && (fd.Message().FullName() == "google.protobuf.Timestamp" || fd.Message().FullName() == "google.protobuf.Duration"):
			m.Clear(fd)
		case fd.Name() == "shard" || fd.Kind() == protoreflect.DoubleKind:
			m.Clear(fd) // the group's shard; rates over time
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				clearVolatile(v.List().Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			clearVolatile(v.Message())
		}
		return true
	})
}

// normErr renders an error as its gRPC code, message and details.
func normErr(err error, group string) string {
	st := status.Convert(err)
	s := st.Code().String() + " " + strings.ReplaceAll(st.Message(), group, "G")
	for _, d := range st.Details() {
		if m, ok := d.(proto.Message); ok {
			s += " " + norm(m, group)
		} else {
			s += fmt.Sprintf(" %v", d)
		}
	}
	return s
}

// scenario runs the same operations against one face of the API in its own
// consistency group and returns a normalized transcript.
func scenario(t *testing.T, a api, group string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []string
	rec := func(step string, m proto.Message, err error) {
		if err != nil {
			out = append(out, step+" error: "+normErr(err, group))
		} else {
			out = append(out, step+": "+norm(m, group))
		}
	}
	in, done := group+"/in", group+"/done"
	id := func(n int) string { return fmt.Sprintf("%s-%d", group, n) }

	// Insert three tasks with client-chosen ids, one with a key. The
	// inserts name their producer, p1: the direct face's client would name
	// its own claimant otherwise, and a task records who inserted it.
	ins, err := a.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: "p1", Inserts: []*taskstorepb.TaskInsert{
		{Id: id(1), Queue: in, Priority: 1, Value: []byte("one")},
		{Id: id(2), Queue: in, Priority: 5, Value: []byte("two")},
		{Id: id(3), Queue: in, Priority: 3, Key: "k3", Value: []byte("three")},
	}})
	rec("insert", ins, err)
	// Claim the best two.
	cl, err := a.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w1", Queues: []string{in}, Limit: 2, Lease: durationpb.New(time.Minute)})
	rec("claim", cl, err)
	if len(cl.GetTasks()) != 2 {
		t.Errorf("%s: claim returned %d tasks: %v", group, len(cl.GetTasks()), err)
		return out
	}
	t2, t3 := cl.Tasks[0], cl.Tasks[1]
	// Commit: move the first to done with a new value, delete the second,
	// insert a follow-up, all in one transaction.
	mod, err := a.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: "w1",
		Changes: []*taskstorepb.TaskChange{{Id: t2.Id, Version: t2.Version, Queue: in, NewQueue: done, Value: []byte("two done")}},
		Deletes: []*taskstorepb.TaskRef{{Id: t3.Id, Version: t3.Version, Queue: in}},
		Inserts: []*taskstorepb.TaskInsert{{Id: id(4), Queue: done, Key: "k4", Value: []byte("four")}},
	})
	rec("commit", mod, err)
	// Get by ids alone: every shard is asked.
	got, err := a.Tasks(ctx, &taskstorepb.TasksRequest{Ids: []string{id(4), id(3), id(1), id(2), id(9)}})
	rec("get", got, err)
	// List a queue.
	list, err := a.Tasks(ctx, &taskstorepb.TasksRequest{Queue: done})
	rec("list", list, err)
	// Queue statistics from every shard.
	qs, err := a.Queues(ctx, &taskstorepb.QueuesRequest{Prefix: group + "/"})
	rec("queues", qs, err)
	// A refused transaction: a stale delete, a dependency on a missing task,
	// a duplicate id and a duplicate key; nothing changes.
	_, err = a.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: "w1",
		Deletes: []*taskstorepb.TaskRef{{Id: t2.Id, Version: t2.Version, Queue: in}},
		Depends: []*taskstorepb.TaskRef{{Id: id(9), Version: 1, Queue: in}},
		Inserts: []*taskstorepb.TaskInsert{{Id: id(1), Queue: in}, {Id: id(5), Queue: done, Key: "k4"}},
	})
	rec("refused", nil, err)
	// Another claimant may not touch a task w2 holds.
	held, err := a.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w2", Queues: []string{in}, Lease: durationpb.New(time.Minute)})
	rec("claim w2", held, err)
	if len(held.GetTasks()) == 1 {
		h := held.Tasks[0]
		_, err = a.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: "w3",
			Deletes: []*taskstorepb.TaskRef{{Id: h.Id, Version: h.Version, Queue: in}}})
		rec("claimed", nil, err)
	}
	// Requests that span consistency groups are invalid.
	_, err = a.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{
		{Queue: in}, {Queue: "other" + group + "/x"},
	}})
	rec("cross-group", nil, err)
	// Bad input the node finds: a negative delay.
	_, err = a.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: in, Delay: durationpb.New(-time.Second)}}})
	rec("bad delay", nil, err)
	// Nothing left to claim.
	none, err := a.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w1", Queues: []string{in}})
	rec("claim empty", none, err)
	// Purge a queue; then it is gone.
	pr, err := a.Purge(ctx, &taskstorepb.PurgeRequest{Queue: done})
	rec("purge", pr, err)
	qs, err = a.Queues(ctx, &taskstorepb.QueuesRequest{Prefix: group + "/"})
	rec("queues after purge", qs, err)
	// A commit that claims the next task: claim only, then delete and
	// claim, then one that finds nothing (w2 still holds G-1).
	ins, err = a.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: "p1", Inserts: []*taskstorepb.TaskInsert{
		{Id: id(6), Queue: in, Value: []byte("six")}, {Id: id(7), Queue: in, Priority: 2, Value: []byte("seven")}}})
	rec("insert more", ins, err)
	next := &taskstorepb.ModifyClaim{Queues: []string{in}, Lease: durationpb.New(time.Minute)}
	first, err := a.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: "w1", Claim: next})
	rec("claim by modify", first, err)
	if len(first.GetClaimed()) != 1 {
		return out
	}
	t7 := first.Claimed[0]
	second, err := a.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: "w1", Claim: next,
		Deletes: []*taskstorepb.TaskRef{{Id: t7.Id, Version: t7.Version, Queue: in}}})
	rec("delete and claim", second, err)
	if len(second.GetClaimed()) != 1 {
		return out
	}
	t6 := second.Claimed[0]
	last, err := a.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: "w1", Claim: next,
		Deletes: []*taskstorepb.TaskRef{{Id: t6.Id, Version: t6.Version, Queue: in}}})
	rec("delete and claim none", last, err)
	_, err = a.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: "w1",
		Inserts: []*taskstorepb.TaskInsert{{Queue: in}},
		Claim:   &taskstorepb.ModifyClaim{Queues: []string{"other" + group + "/x"}}})
	rec("claim cross-group", nil, err)
	return out
}

// TestSameResultsEverywhere runs one scenario through the direct client,
// two proxies' gRPC services and a proxy's HTTP/JSON face, and requires the
// same transcript from each, and the transcript to be the right one.
func TestSameResultsEverywhere(t *testing.T) {
	c := startCluster(t)
	pa, pb := startProxy(t, c), startProxy(t, c)
	direct := dial(t, strings.Join(c.Endpoints(), ","), client.WithClaimant("unused"))
	ha := &httpAPI{base: "http://" + pa.HTTPAddr(), codes: map[codes.Code]int{}}
	faces := []struct {
		name string
		api  api
	}{
		{"direct", directAPI{direct}},
		{"proxya", grpcAPI{taskstorepb.NewTaskStoreClient(grpcConn(t, pa.Addr()))}},
		{"proxyb", grpcAPI{taskstorepb.NewTaskStoreClient(grpcConn(t, pb.Addr()))}},
		{"http", ha},
	}
	want := []string{
		`insert: {"inserted":[{"id":"G-1","version":"1","queue":"G/in","claimant":"p1","priority":1,"value":"b25l"},{"id":"G-2","version":"1","queue":"G/in","claimant":"p1","priority":5,"value":"dHdv"},{"id":"G-3","version":"1","queue":"G/in","claimant":"p1","priority":3,"key":"k3","value":"dGhyZWU="}]}`,
		`claim: {"tasks":[{"id":"G-2","version":"2","queue":"G/in","claimant":"w1","priority":5,"value":"dHdv","claims":1},{"id":"G-3","version":"2","queue":"G/in","claimant":"w1","priority":3,"key":"k3","value":"dGhyZWU=","claims":1}]}`,
		`commit: {"inserted":[{"id":"G-4","version":"1","queue":"G/done","claimant":"w1","key":"k4","value":"Zm91cg=="}],"changed":[{"id":"G-2","version":"3","queue":"G/done","priority":5,"value":"dHdvIGRvbmU=","claims":1}]}`,
		`get: {"tasks":[{"id":"G-4","version":"1","queue":"G/done","claimant":"w1","key":"k4","value":"Zm91cg=="},{"id":"G-1","version":"1","queue":"G/in","claimant":"p1","priority":1,"value":"b25l"},{"id":"G-2","version":"3","queue":"G/done","priority":5,"value":"dHdvIGRvbmU=","claims":1}]}`,
		`list: {"tasks":[{"id":"G-2","version":"3","queue":"G/done","priority":5,"value":"dHdvIGRvbmU=","claims":1},{"id":"G-4","version":"1","queue":"G/done","claimant":"w1","key":"k4","value":"Zm91cg=="}]}`,
		`queues: {"queues":[{"name":"G/done","total":"2","available":"2"},{"name":"G/in","total":"1","available":"1"}]}`,
		`refused error: FailedPrecondition transaction refused: 4 offending reference(s) {"errors":[{"category":"DEPEND_MISSING","id":"G-9","version":"1"},{"category":"DELETE_STALE","id":"G-2","version":"2","currentVersion":"3","queue":"G/done"},{"category":"INSERT_DUPLICATE_ID","id":"G-1","queue":"G/in","existingId":"G-1"},{"category":"INSERT_DUPLICATE_KEY","id":"G-5","queue":"G/done","key":"k4","existingId":"G-4"}]}`,
		`claim w2: {"tasks":[{"id":"G-1","version":"2","queue":"G/in","claimant":"w2","priority":1,"value":"b25l","claims":1}]}`,
		`claimed error: FailedPrecondition transaction refused: 1 offending reference(s) {"errors":[{"category":"CLAIMED","id":"G-1","version":"2","queue":"G/in","claimant":"w2"}]}`,
		`cross-group error: InvalidArgument inserts[1].queue: queue "otherG/x" is in consistency group "otherG" but inserts[0].queue is in "G": a request may touch one group only`,
		`bad delay error: InvalidArgument inserts[0].delay: must not be negative`,
		`claim empty: {}`,
		`purge: {"deleted":"2"}`,
		`queues after purge: {"queues":[{"name":"G/in","total":"1","claimed":"1"}]}`,
		`insert more: {"inserted":[{"id":"G-6","version":"1","queue":"G/in","claimant":"p1","value":"c2l4"},{"id":"G-7","version":"1","queue":"G/in","claimant":"p1","priority":2,"value":"c2V2ZW4="}]}`,
		`claim by modify: {"claimed":[{"id":"G-7","version":"2","queue":"G/in","claimant":"w1","priority":2,"value":"c2V2ZW4=","claims":1}]}`,
		`delete and claim: {"claimed":[{"id":"G-6","version":"2","queue":"G/in","claimant":"w1","value":"c2l4","claims":1}]}`,
		`delete and claim none: {}`,
		`claim cross-group error: InvalidArgument claim.queues[0]: queue "otherG/x" is in consistency group "otherG" but inserts[0].queue is in "G": a request may touch one group only`,
	}
	var mu sync.Mutex
	got := map[string][]string{}
	var wg sync.WaitGroup
	for _, f := range faces {
		wg.Go(func() {
			tr := scenario(t, f.api, "eq"+f.name)
			mu.Lock()
			got[f.name] = tr
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, f := range faces {
		tr := got[f.name]
		if !slices.Equal(tr, want) {
			for i := range max(len(tr), len(want)) {
				var g, w string
				if i < len(tr) {
					g = tr[i]
				}
				if i < len(want) {
					w = want[i]
				}
				if g != w {
					t.Errorf("%s step %d:\n got %s\nwant %s", f.name, i, g, w)
				}
			}
		}
	}
	// grpc-gateway's mapping of the codes to HTTP.
	for code, want := range map[codes.Code]int{codes.FailedPrecondition: 400, codes.InvalidArgument: 400} {
		if got := ha.codes[code]; got != want {
			t.Errorf("HTTP status for %v: got %d, want %d", code, got, want)
		}
	}
}

// TestRequestsOnlyANodeCanJudge sends requests the proxy cannot route (no
// queue, an empty claimant, an empty queue name, an unknown shard) to a
// proxy and to a node, and requires the node's own answer from both.
func TestRequestsOnlyANodeCanJudge(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	node := taskstorepb.NewTaskStoreClient(c.Conn(0))
	viaProxy := taskstorepb.NewTaskStoreClient(grpcConn(t, p.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type call func(ctx context.Context, c taskstorepb.TaskStoreClient) error
	cases := []struct {
		name string
		want codes.Code
		call call
	}{
		{"empty transaction", codes.InvalidArgument, func(ctx context.Context, c taskstorepb.TaskStoreClient) error {
			_, err := c.Modify(ctx, &taskstorepb.ModifyRequest{})
			return err
		}},
		{"delete without queue", codes.InvalidArgument, func(ctx context.Context, c taskstorepb.TaskStoreClient) error {
			_, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Deletes: []*taskstorepb.TaskRef{{Id: "x", Version: 1}}})
			return err
		}},
		{"claim without claimant", codes.InvalidArgument, func(ctx context.Context, c taskstorepb.TaskStoreClient) error {
			_, err := c.Claim(ctx, &taskstorepb.ClaimRequest{Queues: []string{"judge/q"}})
			return err
		}},
		{"claim with empty queue name", codes.InvalidArgument, func(ctx context.Context, c taskstorepb.TaskStoreClient) error {
			_, err := c.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"judge/q", ""}})
			return err
		}},
		{"claim without queues", codes.InvalidArgument, func(ctx context.Context, c taskstorepb.TaskStoreClient) error {
			_, err := c.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w"})
			return err
		}},
		{"claim wait too long", codes.InvalidArgument, func(ctx context.Context, c taskstorepb.TaskStoreClient) error {
			_, err := c.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"judge/q"}, Wait: durationpb.New(time.Hour)})
			return err
		}},
		{"tasks without queue", codes.InvalidArgument, func(ctx context.Context, c taskstorepb.TaskStoreClient) error {
			_, err := c.Tasks(ctx, &taskstorepb.TasksRequest{})
			return err
		}},
		{"tasks of an unknown shard", codes.NotFound, func(ctx context.Context, c taskstorepb.TaskStoreClient) error {
			_, err := c.Tasks(ctx, &taskstorepb.TasksRequest{Shard: 99, Ids: []string{"x"}})
			return err
		}},
		{"queues of an unknown shard", codes.NotFound, func(ctx context.Context, c taskstorepb.TaskStoreClient) error {
			_, err := c.Queues(ctx, &taskstorepb.QueuesRequest{Shard: 99})
			return err
		}},
		{"purge without queue", codes.InvalidArgument, func(ctx context.Context, c taskstorepb.TaskStoreClient) error {
			_, err := c.Purge(ctx, &taskstorepb.PurgeRequest{})
			return err
		}},
		{"bad page token", codes.InvalidArgument, func(ctx context.Context, c taskstorepb.TaskStoreClient) error {
			_, err := c.Tasks(ctx, &taskstorepb.TasksRequest{Queue: "judge/q", PageToken: "!!"})
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nerr := tc.call(ctx, node)
			if status.Code(nerr) == codes.Unavailable {
				// The node does not lead the shard; ask the leader.
				nerr = tc.call(ctx, c.TaskStore("judge/q"))
			}
			perr := tc.call(ctx, viaProxy)
			if status.Code(nerr) != tc.want {
				t.Fatalf("node answered %v, want code %v", nerr, tc.want)
			}
			if ns, ps := status.Convert(nerr), status.Convert(perr); ns.Code() != ps.Code() || ns.Message() != ps.Message() {
				t.Errorf("proxy answered %v (%q), node %v (%q)", ps.Code(), ps.Message(), ns.Code(), ns.Message())
			}
		})
	}
}

// TestMembershipIsForwarded: AddNode and RemoveNode through a proxy get the
// answer a node gives.
func TestMembershipIsForwarded(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	node := taskstorepb.NewAdminClient(c.Conn(0))
	viaProxy := taskstorepb.NewAdminClient(grpcConn(t, p.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, req := range []*taskstorepb.AddNodeRequest{{}, {Id: "ghost"}} {
		_, nerr := node.AddNode(ctx, req)
		_, perr := viaProxy.AddNode(ctx, req)
		if nerr == nil || status.Code(nerr) == codes.Unimplemented {
			t.Fatalf("AddNode(%v) on a node: %v", req, nerr)
		}
		if ns, ps := status.Convert(nerr), status.Convert(perr); ns.Code() != ps.Code() || ns.Message() != ps.Message() {
			t.Errorf("AddNode(%v): proxy answered %v (%q), node %v (%q)", req, ps.Code(), ps.Message(), ns.Code(), ns.Message())
		}
	}
	_, nerr := node.RemoveNode(ctx, &taskstorepb.RemoveNodeRequest{})
	_, perr := viaProxy.RemoveNode(ctx, &taskstorepb.RemoveNodeRequest{})
	if ns, ps := status.Convert(nerr), status.Convert(perr); nerr == nil || ns.Code() != ps.Code() || ns.Message() != ps.Message() {
		t.Errorf("RemoveNode without id: proxy answered %v (%q), node %v (%q)", ps.Code(), ps.Message(), ns.Code(), ns.Message())
	}
}

// TestClaimAcrossGroups: unlike a node, a proxy claims from queues of
// several groups, shard by shard, and never more than the limit.
func TestClaimAcrossGroups(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pc := dial(t, p.Addr(), client.WithProxyOnly())
	for _, q := range []string{"xa/q", "xb/q", "xc/q"} {
		if _, err := pc.Insert(ctx, q, []byte(q), client.WithID("task-"+q)); err != nil {
			t.Fatal(err)
		}
	}
	queues := []string{"xa/q", "xb/q", "xc/q"}
	resp, err := pc.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: queues, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, tk := range resp.Tasks {
		ids = append(ids, tk.Id)
	}
	if want := []string{"task-xa/q", "task-xb/q"}; !slices.Equal(ids, want) {
		t.Fatalf("claimed %v, want %v", ids, want)
	}
	// A waiting claim finds the last one; then nothing is left.
	resp, err = pc.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: queues, Limit: 5, Wait: durationpb.New(time.Second)})
	if err != nil || len(resp.Tasks) != 1 || resp.Tasks[0].Id != "task-xc/q" {
		t.Fatalf("second claim: %v, %v", resp, err)
	}
	start := time.Now()
	resp, err = pc.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: queues, Wait: durationpb.New(1500 * time.Millisecond)})
	if err != nil || len(resp.Tasks) != 0 {
		t.Fatalf("third claim: %v, %v", resp, err)
	}
	if d := time.Since(start); d < time.Second {
		t.Errorf("an empty waiting claim returned after %v, want about 1.5s", d)
	}
	// The proxy-only client sends a request id; with a caller's own id the
	// waiting claim over several groups still claims a task inserted while
	// it waits (each shard is asked under an id of its own, not the
	// caller's, which would make a second round repeat the first).
	go func() {
		time.Sleep(1500 * time.Millisecond)
		pc.Insert(ctx, "xa/q", nil, client.WithID("late"))
	}()
	resp, err = taskstorepb.NewTaskStoreClient(grpcConn(t, p.Addr())).Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: queues,
		Wait: durationpb.New(10 * time.Second), Request: &taskstorepb.RequestID{ClientId: "me", Seq: 1}})
	if err != nil || len(resp.Tasks) != 1 || resp.Tasks[0].Id != "late" {
		t.Fatalf("waiting claim over groups with a request id: %v, %v", resp, err)
	}
}

// TestCallersRequestIDPassesThrough: a caller that repeats a request with
// its own request id, through either proxy, gets the first answer and no
// second effect.
func TestCallersRequestIDPassesThrough(t *testing.T) {
	c := startCluster(t)
	pa, pb := startProxy(t, c), startProxy(t, c)
	a := taskstorepb.NewTaskStoreClient(grpcConn(t, pa.Addr()))
	b := taskstorepb.NewTaskStoreClient(grpcConn(t, pb.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rid := func(seq uint64) *taskstorepb.RequestID { return &taskstorepb.RequestID{ClientId: "caller-1", Seq: seq} }

	// An insert without a task id, sent twice: one task.
	ins := &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: "rid/q", Value: []byte("once")}}, Request: rid(1)}
	r1, err := a.Modify(ctx, ins)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.Modify(ctx, ins)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Inserted[0].Id != r2.Inserted[0].Id {
		t.Fatalf("a repeated insert made two tasks: %s and %s", r1.Inserted[0].Id, r2.Inserted[0].Id)
	}
	// A claim sent twice returns the same task and version.
	cl := &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{"rid/q"}, Request: rid(2)}
	c1, err := a.Claim(ctx, cl)
	if err != nil || len(c1.Tasks) != 1 {
		t.Fatalf("claim: %v %v", c1, err)
	}
	c2, err := b.Claim(ctx, cl)
	if err != nil || len(c2.Tasks) != 1 || c2.Tasks[0].Version != c1.Tasks[0].Version {
		t.Fatalf("repeated claim: %v %v, first %v", c2, err, c1)
	}
	// A purge sent again after another insert answers as the first time
	// and leaves the new task alone.
	p1, err := a.Purge(ctx, &taskstorepb.PurgeRequest{Queue: "rid/q", Request: rid(3)})
	if err != nil || p1.Deleted != 1 {
		t.Fatalf("purge: %v %v", p1, err)
	}
	// (Another client's request: a later sequence number of caller-1 would
	// make the cluster refuse the repeat as stale.)
	if _, err := a.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Id: "after", Queue: "rid/q"}},
		Request: &taskstorepb.RequestID{ClientId: "caller-2", Seq: 1}}); err != nil {
		t.Fatal(err)
	}
	p2, err := b.Purge(ctx, &taskstorepb.PurgeRequest{Queue: "rid/q", Request: rid(3)})
	if err != nil || p2.Deleted != 1 {
		t.Fatalf("repeated purge: %v %v", p2, err)
	}
	left, err := a.Tasks(ctx, &taskstorepb.TasksRequest{Queue: "rid/q"})
	if err != nil || len(left.Tasks) != 1 || left.Tasks[0].Id != "after" {
		t.Fatalf("left after the repeated purge: %v %v", left, err)
	}
}
