package statuspage_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/rpc/statuspage"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// fixture is a 3-node cluster holding known tasks, with the status page of
// its first node served the way server.Node mounts it.
type fixture struct {
	c      *harness.Cluster
	srv    *httptest.Server
	paged  *httptest.Server // pages of pageSize tasks
	node   int              // index of the node serving the page
	longV  string
	binV   []byte
	xssV   string
	ids    map[string][]string // queue -> inserted ids, in order
	oddQ   string              // a queue name that needs escaping
	pagedQ string
}

const pageSize = 3

func startFixture(t *testing.T) *fixture {
	t.Helper()
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: 2})
	c.WaitReady()
	c.WaitFormat()
	f := &fixture{c: c, ids: map[string][]string{},
		longV:  strings.Repeat("The quick brown fox jumps over the lazy dog. ", 8),
		binV:   []byte{0x00, 0xff, 0x10, 0x80, 0x7f, 'a', 0x00, 0xc3, 0x28, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a},
		xssV:   `<script>alert("x")</script>`,
		oddQ:   `web/<b>odd</b> & "name"?#`,
		pagedQ: "paging/q",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	insert := func(q string, ins ...*taskstorepb.TaskInsert) {
		t.Helper()
		for _, in := range ins {
			in.Queue = q
		}
		res, err := c.TaskStore(q).Modify(ctx, &taskstorepb.ModifyRequest{Inserts: ins})
		if err != nil {
			t.Fatalf("insert into %s: %v", q, err)
		}
		for _, task := range res.Inserted {
			f.ids[q] = append(f.ids[q], task.Id)
		}
	}
	insert("alpha/jobs",
		&taskstorepb.TaskInsert{Value: []byte(f.longV), Key: "long"},
		&taskstorepb.TaskInsert{Value: f.binV, Key: "binary"},
		&taskstorepb.TaskInsert{Value: []byte(f.xssV), Key: "xss"},
		&taskstorepb.TaskInsert{Value: []byte("later"), Delay: durationpb.New(time.Hour)},
		&taskstorepb.TaskInsert{Value: []byte("claim me"), Priority: 9},
	)
	if _, err := c.TaskStore("alpha/jobs").Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "worker-1", Queues: []string{"alpha/jobs"},
		Lease: durationpb.New(time.Hour), Limit: 1}); err != nil {
		t.Fatalf("claim: %v", err)
	}
	insert("beta/mail", &taskstorepb.TaskInsert{Value: []byte("hello")}, &taskstorepb.TaskInsert{Value: []byte("world")},
		&taskstorepb.TaskInsert{Value: []byte("done"), Priority: 5})
	// Claim and commit one, for a claim-to-commit time.
	cl, err := c.TaskStore("beta/mail").Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "worker-2", Queues: []string{"beta/mail"},
		Lease: durationpb.New(time.Hour), Limit: 1})
	if err != nil || len(cl.Tasks) != 1 || string(cl.Tasks[0].Value) != "done" {
		t.Fatalf("claim from beta/mail: %v %v", cl, err)
	}
	if _, err := c.TaskStore("beta/mail").Modify(ctx, &taskstorepb.ModifyRequest{Claimant: "worker-2",
		Deletes: []*taskstorepb.TaskRef{{Id: cl.Tasks[0].Id, Version: cl.Tasks[0].Version, Queue: "beta/mail"}}}); err != nil {
		t.Fatalf("commit: %v", err)
	}
	insert(f.oddQ, &taskstorepb.TaskInsert{Value: []byte("odd")})
	for i := range 7 {
		insert(f.pagedQ, &taskstorepb.TaskInsert{Value: []byte(fmt.Sprintf("task %d", i))})
	}

	// Serve the page of the node that took the writes of alpha/jobs: rates
	// are counted by the node serving the API.
	f.node = c.Leader(c.ShardOf("alpha/jobs"))
	if f.node < 0 {
		t.Fatal("alpha/jobs has no leader")
	}
	ns := c.Nodes[f.node].Server()
	// The page reads the node's replicas (stale): wait until they caught up.
	want := map[string]uint64{"alpha/jobs": 5, "beta/mail": 2, f.oddQ: 1, f.pagedQ: 7}
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := ns.RPC.Queues(ctx, &taskstorepb.QueuesRequest{Stale: true})
		got := map[string]uint64{}
		if err == nil {
			for _, q := range res.Queues {
				got[q.Name] = q.Total
			}
		}
		if fmt.Sprint(got) == fmt.Sprint(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s sees queues %v (err %v), want %v", ns.Node.Status(ctx, true).Node, got, err, want)
		}
		time.Sleep(50 * time.Millisecond)
	}

	mux := http.NewServeMux() // as server.Node mounts it
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.Handle("/", statuspage.New(ns.Node, ns.RPC))
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	f.paged = httptest.NewServer(statuspage.New(ns.Node, ns.RPC, statuspage.Options{PageSize: pageSize, Refresh: -1}))
	t.Cleanup(f.paged.Close)
	return f
}

func get(t *testing.T, u string) (*http.Response, string) {
	t.Helper()
	res, err := http.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	return res, string(b)
}

func getOK(t *testing.T, u string) string {
	t.Helper()
	res, body := get(t, u)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", u, res.Status, body)
	}
	if ct := res.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Fatalf("GET %s: content type %q", u, ct)
	}
	return body
}

func contains(t *testing.T, what, body string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(body, s) {
			t.Errorf("%s: missing %q", what, s)
		}
	}
	if t.Failed() {
		t.Logf("%s:\n%s", what, body)
		t.FailNow()
	}
}

var (
	rowRE  = regexp.MustCompile(`(?s)<tr[ >].*?</tr>`)
	cellRE = regexp.MustCompile(`(?s)<td[^>]*>(.*?)</td>`)
	tagRE  = regexp.MustCompile(`<[^>]*>`)
)

// row returns the text of the cells of the first table row containing
// marker (nested tables excluded by the non-greedy match ending at </tr>).
func row(t *testing.T, body, marker string) []string {
	t.Helper()
	for _, r := range rowRE.FindAllString(body, -1) {
		if !strings.Contains(r, marker) {
			continue
		}
		var cells []string
		for _, m := range cellRE.FindAllStringSubmatch(r, -1) {
			cells = append(cells, strings.TrimSpace(tagRE.ReplaceAllString(m[1], "")))
		}
		return cells
	}
	t.Fatalf("no row with %q in:\n%s", marker, body)
	return nil
}

func TestStatusPage(t *testing.T) {
	f := startFixture(t)
	base := f.srv.URL
	ns := f.c.Nodes[f.node].Server()
	self := f.c.Nodes[f.node].ID

	t.Run("overview", func(t *testing.T) {
		// Peers answer Status within a second each; on a loaded machine
		// one may miss that, so wait for a page with every replica.
		var body string
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			body = getOK(t, base+"/")
			if strings.Count(body, `class="n lag `) == 9 && strings.Contains(body, ">3 <small>of 3</small>") || time.Now().After(deadline) {
				break
			}
		}
		contains(t, "overview", body, "<h1>Cluster</h1>", "answered by <b>"+self+"</b>", "<td><b>"+self+`</b> <span class="badge self">this node</span>`)
		for _, n := range f.c.Nodes {
			cells := row(t, body, "<td><b>"+n.ID+"</b>")
			if cells[1] != n.Addr || cells[2] != n.Gossip {
				t.Errorf("node %s row %q: want address %s, gossip %s", n.ID, cells, n.Addr, n.Gossip)
			}
			if cells[4] != "member" || cells[5] != "alive" {
				t.Errorf("node %s row %q: want member, alive", n.ID, cells)
			}
		}
		st := ns.Node.Status(context.Background(), false)
		for _, s := range st.Shards {
			if s.Leader == "" {
				t.Fatalf("shard %d has no leader in %v", s.Id, st)
			}
			// The shard's row: id, leader, term, slots, then the replicas.
			cells := row(t, body, fmt.Sprintf(`<td class="n"><b>%d</b></td>`, s.Id))
			if cells[0] != fmt.Sprint(s.Id) || cells[1] != s.Leader {
				t.Errorf("shard %d row %q: want leader %s", s.Id, cells[:3], s.Leader)
			}
		}
		// Every shard (2) and the meta group list 3 replicas with a lag.
		if n := strings.Count(body, `class="n lag `); n != 9 {
			t.Errorf("%d replica lag cells, want 9", n)
		}
		contains(t, "overview", body, "Shards with a leader", ">2 <small>of 2</small>", "Members alive", ">3 <small>of 3</small>", "Fully replicated")
		if strings.Contains(body, "Under-replicated") {
			t.Errorf("a healthy cluster is shown under-replicated")
		}
	})

	t.Run("queues", func(t *testing.T) {
		body := getOK(t, base+"/queues")
		// Sorted by name, with escaped names and %2F links.
		var order []int
		for _, q := range []string{"alpha/jobs", "beta/mail", f.pagedQ} {
			order = append(order, strings.Index(body, `href="/queues/`+url.PathEscape(q)+`"`))
		}
		if order[0] < 0 || !slices.IsSorted(order) {
			t.Errorf("queue links missing or unsorted: %v\n%s", order, body)
		}
		cells := row(t, body, `href="/queues/alpha%2Fjobs"`)
		// name, shard, total, available, claimed, delayed, oldest age, ...
		if want := []string{"alpha/jobs", fmt.Sprint(f.c.ShardOf("alpha/jobs")), "5", "3", "1", "1"}; !slices.Equal(cells[:6], want) {
			t.Errorf("alpha/jobs row %q, want %q...", cells, want)
		}
		if cells[6] == "—" || cells[6] == "" {
			t.Errorf("alpha/jobs has no oldest available age: %q", cells)
		}
		// Rates, as the node that took the writes counts them: 5 enqueued
		// and 1 claimed in a minute.
		contains(t, "queues", body, `<th class="n">Enqueue</th>`, `<th class="n">Claim→commit</th>`)
		if len(cells) != 11 || cells[7] != "0.08/s" || cells[8] != "0.02/s" || cells[9] != "0" || cells[10] != "—" {
			t.Errorf("alpha/jobs rates %q, want 0.08/s, 0.02/s, 0, —", cells[min(7, len(cells)):])
		}
		cells = row(t, body, `href="/queues/beta%2Fmail"`)
		if cells[2] != "2" || cells[3] != "2" {
			t.Errorf("beta/mail row %q", cells)
		}
		if f.c.Leader(f.c.ShardOf("beta/mail")) == f.node && (len(cells) != 11 || cells[9] != "0.02/s" || cells[10] == "—") {
			t.Errorf("beta/mail rates %q, want a commit rate and a claim-to-commit time", cells)
		}
		contains(t, "queues", body, `web/&lt;b&gt;odd&lt;/b&gt; &amp; &#34;name&#34;?#`, `href="/queues/web%2F%3Cb%3Eodd%3C%2Fb%3E%20&amp;%20%22name%22%3F%23"`, "4 queues")
		if strings.Contains(body, "<b>odd</b>") {
			t.Errorf("queue name not escaped:\n%s", body)
		}

		body = getOK(t, base+"/queues?prefix=beta")
		contains(t, "queues?prefix=beta", body, "beta/mail", `value="beta"`)
		if strings.Contains(body, "alpha/jobs") {
			t.Errorf("prefix filter shows alpha/jobs:\n%s", body)
		}
		body = getOK(t, base+"/queues?prefix="+url.QueryEscape(`"><script>`))
		contains(t, "queues?prefix=<script>", body, "No queues", `value="&#34;&gt;&lt;script&gt;"`)
	})

	t.Run("queue", func(t *testing.T) {
		body := getOK(t, base+"/queues/alpha%2Fjobs")
		contains(t, "queue page", body, "<h1>alpha/jobs", "worker-1", "claimed", "delayed", "available")
		// The long value: its first 80 characters, then an ellipsis.
		ids := f.ids["alpha/jobs"]
		cells := row(t, body, ids[0])
		if want := f.longV[:80] + "… (" + fmt.Sprint(len(f.longV)) + " bytes) download"; cells[len(cells)-1] != want {
			t.Errorf("long value cell %q, want %q", cells[len(cells)-1], want)
		}
		contains(t, "queue page", body, `href="/queues/alpha%2Fjobs/tasks/`+ids[0]+`/value"`)
		// Binary: a hex preview.
		cells = row(t, body, ids[1])
		if !strings.Contains(cells[len(cells)-1], "19 bytes, binary: 00ff10807f6100c32801020304050607…") {
			t.Errorf("binary value cell %q", cells[len(cells)-1])
		}
		// Escaped, never raw markup.
		contains(t, "queue page", body, `&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;`)
		if strings.Contains(body, "<script") {
			t.Errorf("unescaped <script> in the page:\n%s", body)
		}

		// Paging with a page size of 3: 7 tasks over 3 pages.
		var seen []string
		u := f.paged.URL + "/queues/" + url.PathEscape(f.pagedQ)
		for pages := 0; u != ""; pages++ {
			if pages == 5 {
				t.Fatal("paging does not end")
			}
			body := getOK(t, u)
			if n := strings.Count(body, "<td class=\"mono\""); n > pageSize {
				t.Errorf("%d tasks on a page of %d", n, pageSize)
			}
			for _, id := range f.ids[f.pagedQ] {
				if strings.Contains(body, ">"+id+"<") {
					seen = append(seen, id)
				}
			}
			u = ""
			if m := regexp.MustCompile(`href="([^"]*\?page=[^"]*)">Next page`).FindStringSubmatch(body); m != nil {
				u = f.paged.URL + strings.ReplaceAll(m[1], "&amp;", "&")
				if pages > 0 {
					contains(t, "later page", body, "First page")
				}
			}
		}
		slices.Sort(seen)
		want := slices.Sorted(slices.Values(f.ids[f.pagedQ]))
		if !slices.Equal(seen, want) {
			t.Errorf("paged through %v, want %v", seen, want)
		}

		// A name that needs escaping, and the literal-slash convenience form.
		body = getOK(t, base+"/queues/"+url.PathEscape(f.oddQ))
		contains(t, "odd queue", body, "<h1>web/&lt;b&gt;odd&lt;/b&gt; &amp; &#34;name&#34;?#")
		body = getOK(t, base+"/queues/beta/mail")
		contains(t, "literal slash", body, "<h1>beta/mail", `<td class="value">hello <a`, `<td class="value">world <a`)
	})

	t.Run("value", func(t *testing.T) {
		ids := f.ids["alpha/jobs"]
		for i, want := range [][]byte{[]byte(f.longV), f.binV, []byte(f.xssV)} {
			for _, u := range []string{
				base + "/queues/alpha%2Fjobs/tasks/" + ids[i] + "/value",
				base + "/queues/alpha/jobs/tasks/" + ids[i] + "/value",
			} {
				res, body := get(t, u)
				if res.StatusCode != http.StatusOK {
					t.Fatalf("GET %s: %s %s", u, res.Status, body)
				}
				if body != string(want) {
					t.Errorf("GET %s: %q, want %q", u, body, want)
				}
				if ct := res.Header.Get("Content-Type"); ct != "application/octet-stream" {
					t.Errorf("GET %s: content type %q", u, ct)
				}
				if cd := res.Header.Get("Content-Disposition"); cd != `attachment; filename=`+ids[i]+`.bin` {
					t.Errorf("GET %s: content disposition %q", u, cd)
				}
			}
		}
		res, _ := get(t, base+"/queues/alpha%2Fjobs/tasks/nosuchid/value")
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("unknown task value: %s", res.Status)
		}
		// A task id of another queue is not served under this one.
		res, _ = get(t, base+"/queues/beta%2Fmail/tasks/"+ids[0]+"/value")
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("task of another queue: %s", res.Status)
		}
	})

	t.Run("read-only", func(t *testing.T) {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			for _, p := range []string{"/", "/queues", "/queues/alpha%2Fjobs", "/queues/alpha%2Fjobs/tasks/" + f.ids["alpha/jobs"][0] + "/value"} {
				req, _ := http.NewRequest(method, base+p, strings.NewReader("x=1"))
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "GET, HEAD" {
					t.Errorf("%s %s: %s, Allow %q", method, p, res.Status, res.Header.Get("Allow"))
				}
			}
		}
		// Nothing changed.
		res, err := ns.RPC.Queues(context.Background(), &taskstorepb.QueuesRequest{Prefix: "alpha/", Stale: true})
		if err != nil || len(res.Queues) != 1 || res.Queues[0].Total != 5 {
			t.Errorf("alpha/jobs after writes: %v %v", res, err)
		}
	})

	t.Run("not-found", func(t *testing.T) {
		for _, p := range []string{
			"/nope", "/queues/nosuch%2Fqueue", "/queues/nosuch", "/queues/alpha%2Fjobs/tasks",
			"/queues/alpha%2Fjobs/tasks/" + f.ids["alpha/jobs"][0], "/queues/alpha%2Fjobs/tasks/" + f.ids["alpha/jobs"][0] + "/other",
			"/queues/alpha%2Fjobs/extra", "/queues//x",
		} {
			res, body := get(t, base+p)
			if res.StatusCode != http.StatusNotFound {
				t.Errorf("GET %s: %s, want 404\n%s", p, res.Status, body)
			}
		}
		// The mounted neighbours still answer.
		res, body := get(t, base+"/healthz")
		if res.StatusCode != http.StatusOK || body != "ok\n" {
			t.Errorf("/healthz: %s %q", res.Status, body)
		}
		// A bad page token is the client's fault.
		res, _ = get(t, base+"/queues/alpha%2Fjobs?page=garbage")
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("bad page token: %s, want 400", res.Status)
		}
	})

	t.Run("paused", func(t *testing.T) {
		// A paused queue says so in the list and on its
		// page; one that is not, does not.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := f.c.TaskStore("beta/mail").PauseQueue(ctx, &taskstorepb.QueuePauseRequest{Queue: "beta/mail"}); err != nil {
			t.Fatal(err)
		}
		defer f.c.TaskStore("beta/mail").ResumeQueue(ctx, &taskstorepb.QueuePauseRequest{Queue: "beta/mail"})
		if _, err := f.c.TaskStore("beta/mail").SetQueueLimit(ctx, &taskstorepb.QueueLimitRequest{Queue: "beta/mail", MaxClaimed: 3}); err != nil {
			t.Fatal(err)
		}
		defer f.c.TaskStore("beta/mail").SetQueueLimit(ctx, &taskstorepb.QueueLimitRequest{Queue: "beta/mail"})
		for {
			// (The cluster raises the state format policies need after
			// its start.)
			_, err := f.c.TaskStore("beta/mail").SetQueuePolicy(ctx, &taskstorepb.QueuePolicyRequest{Queue: "beta/mail",
				Policy: &taskstorepb.QueuePolicy{MaxClaims: 2, DeadLetter: "beta/dead", Rate: 50, Burst: 5}})
			if err == nil {
				break
			}
			if ctx.Err() != nil || !strings.Contains(err.Error(), "format") {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		defer f.c.TaskStore("beta/mail").SetQueuePolicy(ctx, &taskstorepb.QueuePolicyRequest{Queue: "beta/mail"})
		body := getOK(t, base+"/queues")
		if cells := row(t, body, `href="/queues/beta%2Fmail"`); cells[0] != "beta/mail paused limit 3 max-claims 2 → beta/dead rate 50/s" {
			t.Errorf("beta/mail row %q, want the name with paused, limit and policy badges", cells)
		}
		if cells := row(t, body, `href="/queues/alpha%2Fjobs"`); cells[0] != "alpha/jobs" {
			t.Errorf("alpha/jobs row %q: a queue that is not paused shows a badge", cells)
		}
		contains(t, "queue page", getOK(t, base+"/queues/beta%2Fmail"), `<span class="badge warn"`, ">paused</span>", ">rate 50/s</span>")
	})

	t.Run("schedules", func(t *testing.T) {
		// A queue's page lists the schedules that insert
		// into it.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		sc := &taskstorepb.Schedule{Name: "nightly", Queue: "alpha/jobs", Cron: "0 2 * * *", TimeZone: "Europe/Berlin"}
		if _, err := f.c.TaskStore("alpha/jobs").PutSchedule(ctx, &taskstorepb.PutScheduleRequest{Schedule: sc}); err != nil {
			t.Fatal(err)
		}
		defer f.c.TaskStore("alpha/jobs").DeleteSchedule(ctx, &taskstorepb.DeleteScheduleRequest{Name: "nightly", Queue: "alpha/jobs"})
		body := getOK(t, base+"/queues/alpha%2Fjobs")
		if cells := row(t, body, `<td class="mono">nightly</td>`); cells[1] != "0 2 * * * (Europe/Berlin)" || cells[4] != "0" || cells[5] != "skip" {
			t.Errorf("schedule row %q", cells)
		}
		if strings.Contains(getOK(t, base+"/queues/beta%2Fmail"), "nightly") {
			t.Error("another queue's page lists the schedule")
		}
	})

	t.Run("screenshot", func(t *testing.T) {
		screenshotPages(t, base, map[string]string{
			"overview": "/",
			"queues":   "/queues",
			"queue":    "/queues/alpha%2Fjobs",
		})
	})
}
