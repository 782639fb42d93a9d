package statuspage

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// fake is a node that hosts shards 1 and 2 of 3, with lagging replicas.
type fake struct{}

func (fake) Status(ctx context.Context, localOnly bool) *taskstorepb.StatusResponse {
	return &taskstorepb.StatusResponse{
		Node: "a",
		Nodes: []*taskstorepb.NodeStatus{
			{Id: "a", Address: "10.0.0.1:7000", HttpAddress: "10.0.0.1:8080", State: "member", Health: "alive", Shards: []uint32{1, 2}, Leads: []uint32{1}},
			{Id: "b", Address: "10.0.0.2:7000", HttpAddress: "10.0.0.2:8080", State: "member", Health: "suspect", Shards: []uint32{1, 2, 3}},
			{Id: "c", Address: "10.0.0.3:7000", State: "draining", Health: "dead", Shards: []uint32{3}},
		},
		Shards: []*taskstorepb.ShardStatus{
			{Id: 1, Leader: "a", Term: 4, Replicas: []string{"a", "b"}, ReplicaStatus: []*taskstorepb.ReplicaStatus{
				{Node: "a", Role: "leader", CommitIndex: 900, AppliedIndex: 900, LastIndex: 900},
				{Node: "b", Role: "follower", CommitIndex: 895, AppliedIndex: 895, LastIndex: 899, Lag: 5},
			}},
			{Id: 2, Leader: "", Term: 7, Replicas: []string{"a", "b"}, ReplicaStatus: []*taskstorepb.ReplicaStatus{
				{Node: "a", Role: "candidate", CommitIndex: 1000, AppliedIndex: 1000, LastIndex: 1000},
				{Node: "b", Role: "follower", CommitIndex: 400, AppliedIndex: 400, LastIndex: 400, Lag: 600},
			}},
			{Id: 3, Leader: "b", Term: 2, Replicas: []string{"b", "c"}},
		},
	}
}

func (fake) Queues(ctx context.Context, req *taskstorepb.QueuesRequest) (*taskstorepb.QueuesResponse, error) {
	return &taskstorepb.QueuesResponse{}, nil
}

func (fake) Schedules(ctx context.Context, req *taskstorepb.SchedulesRequest) (*taskstorepb.SchedulesResponse, error) {
	return &taskstorepb.SchedulesResponse{}, nil
}

func (fake) Tasks(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error) {
	st, _ := status.New(codes.Unavailable, "not the leader").WithDetails(&taskstorepb.NotLeader{Shard: 3, LeaderId: "b", LeaderAddress: "10.0.0.2:7000"})
	return nil, st.Err()
}

func fetch(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

func TestPagesFromFake(t *testing.T) {
	h := New(fake{}, fake{}, Options{Refresh: 7 * time.Second})
	code, body := fetch(t, h, "/")
	for _, want := range []string{
		`<td class="n lag warn">5</td>`, `<td class="n lag bad">600</td>`, `<span class="badge bad">no leader</span>`,
		`<span class="badge warn">suspect</span>`, `<span class="badge bad">dead</span>`, `<span class="badge warn">draining</span>`,
		`no report (node unreachable)`, `<a href="http://10.0.0.2:8080/">10.0.0.2:8080</a>`, `<meta http-equiv="refresh" content="7">`,
		`>1 <small>of 3</small>`, `>2 <small>of 3</small>`, `600 <small>entries</small>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %s", want)
		}
	}
	if code != http.StatusOK || t.Failed() {
		t.Fatalf("overview %d:\n%s", code, body)
	}

	code, body = fetch(t, h, "/queues")
	if code != http.StatusOK || !strings.Contains(body, `Shard 3: <a href="http://10.0.0.2:8080/queues">on b</a>`) || !strings.Contains(body, "shards 1, 2, hosted on this node") {
		t.Fatalf("queues %d:\n%s", code, body)
	}

	code, body = fetch(t, h, "/queues/far%2Faway")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "lives on shard 3, which is not hosted on this node. Node b hosts it.") ||
		!strings.Contains(body, `<a href="http://10.0.0.2:8080/queues/far%2Faway">`) {
		t.Fatalf("remote queue %d:\n%s", code, body)
	}
}

func TestParseQueuePath(t *testing.T) {
	for _, c := range []struct{ in, name, id string }{
		{"a%2Fb", "a/b", ""},
		{"a/b", "a/b", ""},
		{"a%2Fb/tasks/x1/value", "a/b", "x1"},
		{"a/b/tasks/x1/value", "a/b", "x1"},
		{"a%2Ftasks%2Fx%2Fvalue", "a/tasks/x/value", ""},
		{"q%20%3C%3E", "q <>", ""},
		{"%2Fq", "", ""},
		{"", "", ""},
		{"%zz", "", ""},
		{"tasks/x/value", "tasks/x/value", ""},
	} {
		name, id, ok := parseQueuePath(c.in)
		if name != c.name || id != c.id || ok != (c.name != "") {
			t.Errorf("parseQueuePath(%q) = %q, %q, %v; want %q, %q", c.in, name, id, ok, c.name, c.id)
		}
	}
}

func TestPreview(t *testing.T) {
	p := preview([]byte("line one\nline\ttwo"), 80)
	if p.Binary || p.Truncated || p.Text != "line one↵line→two" {
		t.Errorf("%+v", p)
	}
	p = preview([]byte(strings.Repeat("é", 100)), 80)
	if p.Binary || !p.Truncated || p.Text != strings.Repeat("é", 80) || p.Size != 200 {
		t.Errorf("%+v", p)
	}
	p = preview([]byte("bell\a"), 80)
	if !p.Binary || p.Hex != "62656c6c07" || p.Truncated {
		t.Errorf("%+v", p)
	}
	p = preview(nil, 80)
	if p.Size != 0 || p.Binary {
		t.Errorf("%+v", p)
	}
}

func TestFormat(t *testing.T) {
	for d, want := range map[time.Duration]string{
		420 * time.Microsecond: "420µs", 0: "0s", 850 * time.Millisecond: "850ms", 12300 * time.Millisecond: "12.3s", 245 * time.Second: "4m 05s",
		127 * time.Minute: "2h 07m", 76 * time.Hour: "3d 04h",
	} {
		if got := fmtDuration(d); got != want {
			t.Errorf("fmtDuration(%v) = %q, want %q", d, got, want)
		}
	}
	for r, want := range map[float64]string{0: "0", 0.001: "<0.01/s", 0.5: "0.50/s", 123.4: "123/s", 45678: "45.7k/s"} {
		if got := fmtRate(r); got != want {
			t.Errorf("fmtRate(%v) = %q, want %q", r, got, want)
		}
	}
	if got := fmtNum(1234567); got != "1\u202f234\u202f567" {
		t.Errorf("fmtNum = %q", got)
	}
}

// TestPeerLinksOverHTTPS: a page served over HTTPS links the other nodes'
// pages over HTTPS (a node with TLS answers no plain HTTP).
func TestPeerLinksOverHTTPS(t *testing.T) {
	h := New(fake{}, fake{}, Options{Refresh: -1})
	for path, want := range map[string]string{
		"/":                  `<a href="https://10.0.0.2:8080/">`,
		"/queues":            `<a href="https://10.0.0.2:8080/queues">`,
		"/queues/far%2Faway": `<a href="https://10.0.0.2:8080/queues/far%2Faway">`,
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "https://10.0.0.1:8080"+path, nil))
		if body := rec.Body.String(); !strings.Contains(body, want) || strings.Contains(body, `href="http://`) {
			t.Errorf("%s over HTTPS lacks %s or links over http://:\n%s", path, want, body)
		}
	}
}
