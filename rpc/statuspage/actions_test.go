//go:build unix

package statuspage_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/rpc"
	"github.com/e1158ecb/taskstore/rpc/statuspage"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// browser is a site headless Chromium visits: a reverse proxy to a node's
// HTTPS status page that adds a credential to every request (as a browser
// does once its user has answered the basic-auth prompt), and /submit,
// which posts a form to /actions from a page of the same origin (no
// JavaScript on the status page itself, so the test's page clicks).
type browser struct {
	*httptest.Server
	t      *testing.T
	target string // where /submit posts, default /actions
}

func newBrowser(t *testing.T, nodeHTTPS string, tlsConf *tls.Config, credential string) *browser {
	t.Helper()
	u, err := url.Parse("https://" + nodeHTTPS)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{TLSClientConfig: tlsConf}
	b := &browser{t: t}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/submit" {
			b.submitPage(w, r)
			return
		}
		if credential != "" {
			r.Header.Set("Authorization", "Bearer "+credential)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(b.Close)
	return b
}

// submitPage writes a form of the query's fields, posted on load.
func (b *browser) submitPage(w http.ResponseWriter, r *http.Request) {
	target := b.target
	if target == "" {
		target = "/actions"
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, `<html><body><form method="post" action="%s">`, html.EscapeString(target))
	for k, vs := range r.URL.Query() {
		for _, v := range vs {
			fmt.Fprintf(&sb, `<input type="hidden" name="%s" value="%s">`, html.EscapeString(k), html.EscapeString(v))
		}
	}
	sb.WriteString(`</form><script>document.forms[0].submit()</script></body></html>`)
	io.WriteString(w, sb.String())
}

// post makes Chromium post form from b's origin and returns the DOM it ends
// on (after the redirect of a done action).
func (b *browser) post(form url.Values) string {
	b.t.Helper()
	return renderedDOM(b.t, b.URL+"/submit?"+form.Encode())
}

var tokenRE = regexp.MustCompile(`name="token" value="([0-9a-f]+)"`)

// formToken reads the form token of a queue's page as b's credential sees
// it ("" when the page offers no actions).
func (b *browser) formToken(queue string) string {
	b.t.Helper()
	res, err := http.Get(b.URL + "/queues/" + url.PathEscape(queue))
	if err != nil {
		b.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if m := tokenRE.FindSubmatch(body); m != nil {
		return string(m[1])
	}
	return ""
}

// TestStatusPageActionsInChromium drives the status page's actions in
// headless Chromium against a secured 3-node cluster, from
// the page of a node that does not lead the queues' shard (so every action
// is forwarded to the leader): pause and resume, requeue from a dead-letter
// queue with attempts reset, delete one task, purge only with the typed
// confirmation. Refused, with nothing changed: a caller without a
// credential (401), a client-role token (403), a form not rendered for the
// caller, a post from another origin, and every caller of a page served
// without an authorization policy (read-only, no forms).
func TestStatusPageActionsInChromium(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2, Secure: true, HTTP: true})
	c.WaitReady()
	c.WaitFormat()
	const work, dead = "ops/work", "ops/dead"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ts := c.TaskStore(work)
	var ins []*taskstorepb.TaskInsert
	for i := range 3 {
		ins = append(ins, &taskstorepb.TaskInsert{Id: fmt.Sprintf("dead-%d", i), Queue: dead, Value: []byte("failed job")})
	}
	// dead-3's key is taken in work: it cannot move there.
	ins = append(ins, &taskstorepb.TaskInsert{Id: "dead-3", Queue: dead, Key: "dup", Value: []byte("failed job")},
		&taskstorepb.TaskInsert{Id: "job-1", Queue: work, Value: []byte("job one")},
		&taskstorepb.TaskInsert{Id: "job-2", Queue: work, Key: "dup", Value: []byte("job two")})
	if _, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: ins}); err != nil {
		t.Fatal(err)
	}
	// The dead-letter tasks carry an attempt count and an error, as after
	// failing; the requeue resets them.
	got := tasks(t, ctx, ts, dead)
	var fail []*taskstorepb.TaskChange
	attempt, errText := uint32(3), "boom"
	for _, tk := range got {
		fail = append(fail, &taskstorepb.TaskChange{Id: tk.Id, Version: tk.Version, Queue: dead, Attempt: &attempt, Err: &errText})
	}
	if _, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Changes: fail}); err != nil {
		t.Fatal(err)
	}

	follower := (c.Leader(c.ShardOf(work)) + 1) % len(c.Nodes)
	nodeHTTP := c.Nodes[follower].Server().HTTPAddr
	tlsConf := c.Security.ClientTLS(t, "")
	admin := newBrowser(t, nodeHTTP, tlsConf, c.Security.AdminToken)

	// The admin's page has the forms; it is what a screenshot shows.
	var tok string
	waitFor(t, func() bool { tok = admin.formToken(dead); return tok != "" }) // the follower applies the inserts
	dom := renderedDOM(t, admin.URL+"/queues/"+url.PathEscape(dead))
	for _, want := range []string{`value="pause"`, `value="move"`, `value="purge"`, `value="delete"`, `name="confirm"`} {
		if !strings.Contains(dom, want) {
			t.Errorf("the admin's page lacks %s", want)
		}
	}
	if strings.Contains(dom, "Read-only") {
		t.Error("the admin's page says it is read-only")
	}
	screenshotPages(t, admin.URL, map[string]string{"actions-queue": "/queues/" + url.PathEscape(dead)})

	// Refusals first, while every task is where it was put.
	before := snapshot(t, ctx, ts, work, dead)
	nobody := newBrowser(t, nodeHTTP, tlsConf, "")
	client := newBrowser(t, nodeHTTP, tlsConf, c.Security.ClientToken)
	other := newBrowser(t, nodeHTTP, tlsConf, c.Security.AdminToken)
	foreign := httptest.NewServer(http.HandlerFunc(other.submitPage)) // another origin
	defer foreign.Close()
	other.target = admin.URL + "/actions"
	purgeWork := url.Values{"do": {"purge"}, "queue": {work}, "confirm": {work}, "token": {tok}}
	for _, c := range []struct {
		name, dom string
		want      string
	}{
		// Chromium shows a 401 as its credential prompt, which a headless
		// browser leaves empty: nothing of the action's answer.
		{"no credential", nobody.post(purgeWork) + noCredential(t, nobody.URL, purgeWork), "requires a credential"},
		{"client role", client.post(purgeWork), "needs the admin role"},
		{"form not rendered for the caller", admin.post(url.Values{"do": {"purge"}, "queue": {work}, "confirm": {work}, "token": {strings.Repeat("0", 64)}}), "not rendered for you"},
		{"another origin", renderedDOM(t, foreign.URL+"/?"+purgeWork.Encode()), "another"},
		{"purge without the typed name", admin.post(url.Values{"do": {"purge"}, "queue": {work}, "confirm": {"ops/wor"}, "token": {tok}}), "Nothing was deleted"},
	} {
		if !strings.Contains(c.dom, c.want) {
			t.Errorf("%s: the answer lacks %q:\n%s", c.name, c.want, c.dom)
		}
	}
	if after := snapshot(t, ctx, ts, work, dead); after != before {
		t.Fatalf("a refused action changed the queues:\nbefore %s\nafter  %s", before, after)
	}

	// Pause, then resume.
	dom = admin.post(url.Values{"do": {"pause"}, "queue": {work}, "token": {tok}})
	if !strings.Contains(dom, "Paused ops/work") || !strings.Contains(dom, `value="resume"`) {
		t.Fatalf("after pause the page is:\n%s", dom)
	}
	if !stats(t, ctx, ts, work).GetPaused() {
		t.Fatal("the cluster does not have ops/work paused")
	}
	dom = admin.post(url.Values{"do": {"resume"}, "queue": {work}, "token": {tok}})
	if !strings.Contains(dom, "Resumed ops/work.") || stats(t, ctx, ts, work).GetPaused() {
		t.Fatalf("after resume the queue is still paused or the page says otherwise:\n%s", dom)
	}

	// Requeue the dead-letter queue into work, attempts reset.
	dom = admin.post(url.Values{"do": {"move"}, "queue": {dead}, "to": {work}, "reset": {"1"}, "token": {tok}})
	if !strings.Contains(dom, "Moved 3 task(s) from ops/dead to ops/work, attempts reset; 1 could not move (their key is taken in ops/work) and were left in ops/dead.") {
		t.Fatalf("after the move the page is:\n%s", dom)
	}
	if left := tasks(t, ctx, ts, dead); len(left) != 1 || left[0].Id != "dead-3" {
		t.Fatalf("left in %s: %v, want dead-3 alone", dead, left)
	}
	moved := tasks(t, ctx, ts, work)
	var ids []string
	for _, tk := range moved {
		ids = append(ids, tk.Id)
		if tk.Attempt != 0 || tk.Err != "" {
			t.Errorf("task %s kept attempt %d err %q", tk.Id, tk.Attempt, tk.Err)
		}
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"dead-0", "dead-1", "dead-2", "job-1", "job-2"}) {
		t.Fatalf("ops/work holds %v", ids)
	}

	// Delete one task, by the version the page showed.
	var job1 *taskstorepb.Task
	for _, tk := range moved {
		if tk.Id == "job-1" {
			job1 = tk
		}
	}
	stale := url.Values{"do": {"delete"}, "queue": {work}, "id": {"job-1"}, "version": {fmt.Sprint(job1.Version + 1)}, "token": {tok}}
	if dom := admin.post(stale); !strings.Contains(dom, "reload") {
		t.Errorf("a delete of a version the task does not have was not refused as out of date:\n%s", dom)
	}
	dom = admin.post(url.Values{"do": {"delete"}, "queue": {work}, "id": {"job-1"}, "version": {fmt.Sprint(job1.Version)}, "token": {tok}})
	if !strings.Contains(dom, fmt.Sprintf("Deleted task job-1 (version %d).", job1.Version)) {
		t.Fatalf("after the delete the page is:\n%s", dom)
	}
	if n := len(tasks(t, ctx, ts, work)); n != 4 {
		t.Fatalf("ops/work holds %d tasks after the delete, want 4", n)
	}

	// Purge with the typed confirmation: the queue list says what went.
	dom = admin.post(url.Values{"do": {"purge"}, "queue": {work}, "confirm": {work}, "token": {tok}})
	if !strings.Contains(dom, "Purged ops/work: 4 task(s) deleted.") {
		t.Fatalf("after the purge the page is:\n%s", dom)
	}
	if n := len(tasks(t, ctx, ts, work)); n != 0 {
		t.Fatalf("ops/work holds %d tasks after the purge", n)
	}

	// A page served without an authorization policy stays read-only.
	ns := c.Nodes[follower].Server()
	open := httptest.NewServer(statuspage.New(ns.Node, ns.RPC, statuspage.Options{Refresh: -1, Actions: rpc.PageActions(ns.RPC)}))
	defer open.Close()
	if _, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Id: "job-3", Queue: work}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return strings.Contains(renderedDOM(t, open.URL+"/queues/"+url.PathEscape(work)), "job-3")
	})
	dom = renderedDOM(t, open.URL+"/queues/"+url.PathEscape(work))
	if strings.Contains(dom, `name="token"`) || !strings.Contains(dom, "Read-only: pausing, requeueing, purging and deleting") {
		t.Errorf("the page without a policy offers actions:\n%s", dom)
	}
	res, err := http.PostForm(open.URL+"/actions", url.Values{"do": {"purge"}, "queue": {work}, "confirm": {work}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden || len(tasks(t, ctx, ts, work)) != 1 {
		t.Fatalf("a post to a page without a policy answered %d", res.StatusCode)
	}
}

// noCredential posts form without a credential and returns the answer's
// status line and body.
func noCredential(t *testing.T, base string, form url.Values) string {
	t.Helper()
	res, err := http.PostForm(base+"/actions", form)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusUnauthorized || res.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("a post without a credential answered %s (WWW-Authenticate %q), want 401 with a challenge", res.Status, res.Header.Get("WWW-Authenticate"))
	}
	return res.Status + " " + string(b)
}

func tasks(t *testing.T, ctx context.Context, ts taskstorepb.TaskStoreClient, queue string) []*taskstorepb.Task {
	t.Helper()
	res, err := ts.Tasks(ctx, &taskstorepb.TasksRequest{Queue: queue, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return res.GetTasks()
}

func stats(t *testing.T, ctx context.Context, ts taskstorepb.TaskStoreClient, queue string) *taskstorepb.QueueStats {
	t.Helper()
	res, err := ts.Queues(ctx, &taskstorepb.QueuesRequest{Prefix: queue})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range res.GetQueues() {
		if q.GetName() == queue {
			return q
		}
	}
	return nil
}

// snapshot prints the queues' tasks with their versions and states.
func snapshot(t *testing.T, ctx context.Context, ts taskstorepb.TaskStoreClient, queues ...string) string {
	t.Helper()
	var sb strings.Builder
	for _, q := range queues {
		for _, tk := range tasks(t, ctx, ts, q) {
			fmt.Fprintf(&sb, "%s/%s@%d ", q, tk.Id, tk.Version)
		}
		fmt.Fprintf(&sb, "paused=%v; ", stats(t, ctx, ts, q).GetPaused())
	}
	return sb.String()
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}
