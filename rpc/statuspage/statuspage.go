package statuspage

import (
	"bytes"
	"cmp"
	"context"
	"embed"
	"fmt"
	"html/template"
	"log/slog"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// Cluster reports the cluster as a node sees it (*cluster.Node).
type Cluster interface {
	Status(ctx context.Context, localOnly bool) *taskstorepb.StatusResponse
}

// Queues reads queues and tasks (*rpc.Server).
type Queues interface {
	Queues(ctx context.Context, req *taskstorepb.QueuesRequest) (*taskstorepb.QueuesResponse, error)
	Tasks(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error)
	Schedules(ctx context.Context, req *taskstorepb.SchedulesRequest) (*taskstorepb.SchedulesResponse, error)
}

// Defaults of the Options.
const (
	DefaultPageSize   = 50
	DefaultMaxQueues  = 1000
	DefaultRefresh    = 10 * time.Second
	DefaultTimeout    = 5 * time.Second
	DefaultValueChars = 80
	// Lag (in log entries) from which a replica is shown as far behind
	// rather than merely behind.
	DefaultLagAlert = 100
)

// Options tune the page; the zero value takes every default.
type Options struct {
	PageSize   int           // tasks per page
	MaxQueues  int           // queues listed at most (narrow with ?prefix=)
	Refresh    time.Duration // meta refresh of / and /queues; negative: off
	Timeout    time.Duration // bound on the reads behind one page
	ValueChars int           // characters of a value shown before truncating
	LagAlert   uint64        // lag shown in red from here (amber below)
	Logger     *slog.Logger
	// Now is the clock for task states and the page footer (tests).
	Now func() time.Time
	// Actions, when set, lets an authenticated admin pause, resume, purge
	// and requeue a queue and delete a task from its page (actions.go);
	// nil keeps the page read-only for everyone.
	Actions Actions
	// ActionTimeout bounds one action; default DefaultActionTimeout.
	ActionTimeout time.Duration
}

//go:embed templates/*.html
var templateFS embed.FS

// Handler serves the status page. Create it with New.
type Handler struct {
	cluster Cluster
	queues  Queues
	opts    Options
	pages   map[string]*template.Template
	formKey []byte // signs the action forms (formToken)
}

// New returns the status page of a node: cl answers Status, qs answers
// Queues and Tasks.
func New(cl Cluster, qs Queues, opts ...Options) *Handler {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.PageSize <= 0 {
		o.PageSize = DefaultPageSize
	}
	if o.MaxQueues <= 0 {
		o.MaxQueues = DefaultMaxQueues
	}
	if o.Refresh == 0 {
		o.Refresh = DefaultRefresh
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.ValueChars <= 0 {
		o.ValueChars = DefaultValueChars
	}
	if o.LagAlert == 0 {
		o.LagAlert = DefaultLagAlert
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ActionTimeout <= 0 {
		o.ActionTimeout = DefaultActionTimeout
	}
	h := &Handler{cluster: cl, queues: qs, opts: o, pages: map[string]*template.Template{}, formKey: newFormKey()}
	base := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html"))
	for _, page := range []string{"overview.html", "queues.html", "queue.html", "error.html"} {
		h.pages[page] = template.Must(template.Must(base.Clone()).ParseFS(templateFS, "templates/"+page))
	}
	return h
}

// ServeHTTP dispatches by path; see the package documentation.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.EscapedPath() == "/actions" {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			http.Error(w, "actions are posted by the forms of a queue's page", http.StatusMethodNotAllowed)
			return
		}
		h.act(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the status page's pages are read; actions are posted to /actions", http.StatusMethodNotAllowed)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.Timeout)
	defer cancel()
	r = r.WithContext(ctx)
	p := r.URL.EscapedPath()
	switch {
	case p == "/":
		h.overview(w, r)
	case p == "/queues" || p == "/queues/":
		h.queueList(w, r)
	case strings.HasPrefix(p, "/queues/"):
		name, id, ok := parseQueuePath(strings.TrimPrefix(p, "/queues/"))
		switch {
		case !ok:
			h.notFound(w, r)
		case id != "":
			h.value(w, r, name, id)
		default:
			h.queue(w, r, name)
		}
	default:
		h.notFound(w, r)
	}
}

// parseQueuePath splits the escaped path after /queues/ into a queue name
// and, for a value download, a task id.
func parseQueuePath(rest string) (name, id string, ok bool) {
	segs := strings.Split(rest, "/")
	unescape := func(s []string) (string, bool) {
		var b strings.Builder
		for i, seg := range s {
			u, err := url.PathUnescape(seg)
			if err != nil {
				return "", false
			}
			if i > 0 {
				b.WriteByte('/')
			}
			b.WriteString(u)
		}
		return b.String(), true
	}
	n := len(segs)
	if n >= 4 && segs[n-3] == "tasks" && segs[n-1] == "value" {
		name, ok1 := unescape(segs[:n-3])
		id, ok2 := unescape(segs[n-2 : n-1])
		if !ok1 || !ok2 || name == "" || id == "" {
			return "", "", false
		}
		return name, id, true
	}
	name, ok = unescape(segs)
	if !ok || name == "" || strings.HasPrefix(name, "/") {
		return "", "", false
	}
	return name, "", true
}

// queueURL is the page of a queue; valueURL the download of a task's value.
// peerURL links another node's page: over HTTPS when this page came over
// HTTPS (a cluster's nodes share one TLS setup, and a node with TLS
// answers no plain HTTP).
func peerURL(r *http.Request, httpAddr, path string) string {
	if r.TLS != nil {
		return "https://" + httpAddr + path
	}
	return "http://" + httpAddr + path
}

func queueURL(name string) string { return "/queues/" + url.PathEscape(name) }

func valueURL(queue, id string) string {
	return queueURL(queue) + "/tasks/" + url.PathEscape(id) + "/value"
}

// page is what every template gets.
type page struct {
	Title   string
	Nav     string // overview, queues
	Node    string // the node answering
	Now     time.Time
	Refresh int // seconds; 0 for none
	Error   string
	Data    any
	// ReadOnly: the page offers no actions to this caller (the footer
	// says so).
	ReadOnly bool
	// Done says what the action that led here did (?done=).
	Done string
}

func (h *Handler) render(w http.ResponseWriter, code int, name string, p page) {
	p.Now = h.opts.Now().UTC()
	if d, ok := p.Data.(queueData); !ok || !d.CanAct {
		p.ReadOnly = true
	}
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, "layout.html", p); err != nil {
		h.opts.Logger.Error("status page template", "page", name, "err", err)
		http.Error(w, "template error", http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}

func (h *Handler) notFound(w http.ResponseWriter, r *http.Request) {
	h.renderError(w, http.StatusNotFound, "", "Not found", "No page at "+r.URL.Path+".")
}

func (h *Handler) renderError(w http.ResponseWriter, code int, node, title, msg string) {
	h.renderErrorLink(w, code, node, title, msg, "")
}

// renderErrorLink is renderError with a link to where to look instead.
func (h *Handler) renderErrorLink(w http.ResponseWriter, code int, node, title, msg, link string) {
	h.render(w, code, "error.html", page{Title: title, Node: node, Error: msg, Data: errorData{Code: code, Text: http.StatusText(code), Link: link}})
}

type errorData struct {
	Code int
	Text string
	Link string
}

// ---- / ----

type overviewData struct {
	Nodes  []nodeRow
	Shards []shardRow
	Meta   *shardRow
	// NodesAlive counts members (not removed or waiting nodes) gossip sees
	// alive, out of Members.
	NodesAlive, Members int
	Removed             int // removed nodes, not listed
	ShardsLed           int
	// FullyReplicated counts shards whose placed replicas all report as
	// leader or follower; UnderReplicated says which do not, and how many
	// of their replicas are healthy.
	FullyReplicated int
	UnderReplicated []string
	MaxLag          uint64
	LagAlert        uint64
	ReplicaRows     int
	// Problems found by the replicas' state checkpoints:
	// "shard 3 on n2" for each diverged replica, and shards whose voters
	// disagree with no majority.
	Diverged, Disagree []string
	// Slot moves under way and the last finished (newest first, at most
	// 10 of those).
	Moves, Finished []*taskstorepb.SlotMove
}

type nodeRow struct {
	*taskstorepb.NodeStatus
	Self     bool
	HTTPLink string // http(s)://addr/ when known
}

type shardRow struct {
	*taskstorepb.ShardStatus
	Replicas []replicaRow
	Local    bool
	LagAlert uint64
}

type replicaRow struct {
	Node      string
	Status    *taskstorepb.ReplicaStatus // nil: no report from that node
	IsLeader  bool
	Preferred bool // the shard's preferred leader
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	st := h.cluster.Status(r.Context(), false)
	d := overviewData{LagAlert: h.opts.LagAlert}
	for _, n := range st.GetNodes() {
		if n.GetState() == "removed" {
			d.Removed++ // history: taskctl node list --all
			continue
		}
		row := nodeRow{NodeStatus: n, Self: n.GetId() == st.GetNode()}
		if n.GetHttpAddress() != "" {
			row.HTTPLink = peerURL(r, n.GetHttpAddress(), "/")
		}
		if st := n.GetState(); st == "member" || st == "draining" {
			d.Members++
			if n.GetHealth() == "alive" {
				d.NodesAlive++
			}
		}
		d.Nodes = append(d.Nodes, row)
	}
	mk := func(s *taskstorepb.ShardStatus) shardRow {
		row := shardRow{ShardStatus: s, Local: slices.Contains(s.GetReplicas(), st.GetNode()), LagAlert: h.opts.LagAlert}
		seen := map[string]bool{}
		for _, rs := range s.GetReplicaStatus() {
			seen[rs.GetNode()] = true
			if rs.GetDivergence() != nil {
				what := fmt.Sprintf("shard %d on %s", s.GetId(), rs.GetNode())
				if why := rs.GetDivergence().GetDamaged(); why != "" {
					what += " (damaged: " + why + ")"
				}
				d.Diverged = append(d.Diverged, what)
			}
			if rs.GetDisagreement() != "" {
				d.Disagree = append(d.Disagree, fmt.Sprintf("shard %d (seen by %s)", s.GetId(), rs.GetNode()))
			}
			row.Replicas = append(row.Replicas, replicaRow{Node: rs.GetNode(), Status: rs, IsLeader: rs.GetNode() == s.GetLeader(), Preferred: rs.GetNode() == s.GetPreferredLeader()})
			d.MaxLag = max(d.MaxLag, rs.GetLag())
			d.ReplicaRows++
		}
		for _, id := range s.GetReplicas() {
			if !seen[id] {
				row.Replicas = append(row.Replicas, replicaRow{Node: id, IsLeader: id == s.GetLeader(), Preferred: id == s.GetPreferredLeader()})
				d.ReplicaRows++
			}
		}
		slices.SortFunc(row.Replicas, func(a, b replicaRow) int { return cmp.Compare(a.Node, b.Node) })
		return row
	}
	for _, s := range st.GetShards() {
		row := mk(s)
		if s.GetLeader() != "" {
			d.ShardsLed++
		}
		if healthy, placed := taskstorepb.HealthyReplicas(s); healthy < placed {
			d.UnderReplicated = append(d.UnderReplicated, fmt.Sprintf("shard %d (%d of %d replicas healthy)", s.GetId(), healthy, placed))
		} else {
			d.FullyReplicated++
		}
		d.Shards = append(d.Shards, row)
	}
	if st.GetMeta() != nil {
		m := mk(st.GetMeta())
		d.Meta = &m
	}
	d.Moves = st.GetMoves()
	for i := len(st.GetFinishedMoves()) - 1; i >= 0 && len(d.Finished) < 10; i-- {
		d.Finished = append(d.Finished, st.GetFinishedMoves()[i])
	}
	h.render(w, http.StatusOK, "overview.html", page{Title: "Cluster", Nav: "overview", Node: st.GetNode(), Refresh: h.refresh(), Data: d})
}

func (h *Handler) refresh() int {
	if h.opts.Refresh < 0 {
		return 0
	}
	return max(1, int(h.opts.Refresh/time.Second))
}

// ---- /queues ----

type queuesData struct {
	Prefix       string
	Queues       []queueRow
	Truncated    bool
	Max          int
	Rates        bool // some queue reports rates
	Total        totals
	LocalShards  []uint32
	RemoteShards []remoteShard
}

type totals struct{ Total, Available, Claimed, Delayed uint64 }

type queueRow struct {
	*taskstorepb.QueueStats
	URL string
}

// remoteShard is a shard not hosted here, with a node that hosts it.
type remoteShard struct {
	ID   uint32
	Node string
	Link string
}

func (h *Handler) queueList(w http.ResponseWriter, r *http.Request) {
	prefix := r.URL.Query().Get("prefix")
	st := h.cluster.Status(r.Context(), true)
	d := queuesData{Prefix: prefix, Max: h.opts.MaxQueues}
	d.LocalShards, d.RemoteShards = hosting(r, st)
	p := page{Title: "Queues", Nav: "queues", Node: st.GetNode(), Refresh: h.refresh(), Data: &d, Done: r.URL.Query().Get("done")}
	res, err := h.queues.Queues(r.Context(), &taskstorepb.QueuesRequest{Prefix: prefix, Limit: uint32(h.opts.MaxQueues + 1), Stale: true})
	if err != nil {
		p.Error = "Listing queues failed: " + errText(err)
		h.render(w, http.StatusServiceUnavailable, "queues.html", p)
		return
	}
	qs := res.GetQueues()
	slices.SortFunc(qs, func(a, b *taskstorepb.QueueStats) int {
		return cmp.Or(cmp.Compare(a.GetName(), b.GetName()), cmp.Compare(a.GetShard(), b.GetShard()))
	})
	if len(qs) > h.opts.MaxQueues {
		qs, d.Truncated = qs[:h.opts.MaxQueues], true
	}
	for _, q := range qs {
		d.Queues = append(d.Queues, queueRow{QueueStats: q, URL: queueURL(q.GetName())})
		d.Total.Total += q.GetTotal()
		d.Total.Available += q.GetAvailable()
		d.Total.Claimed += q.GetClaimed()
		d.Total.Delayed += q.GetDelayed()
		if hasRates(q) {
			d.Rates = true
		}
	}
	h.render(w, http.StatusOK, "queues.html", p)
}

func hasRates(q *taskstorepb.QueueStats) bool {
	return q.GetRateWindow() != nil || q.GetEnqueueRate() != 0 || q.GetClaimRate() != 0 || q.GetCommitRate() != 0 || q.GetAvgClaimToCommit() != nil
}

// hosting splits the shards into those with a replica on the answering node
// and the others, each with a node that hosts it.
func hosting(r *http.Request, st *taskstorepb.StatusResponse) (local []uint32, remote []remoteShard) {
	links := map[string]string{}
	for _, n := range st.GetNodes() {
		if n.GetHttpAddress() != "" {
			links[n.GetId()] = peerURL(r, n.GetHttpAddress(), "/queues")
		}
	}
	for _, s := range st.GetShards() {
		if slices.Contains(s.GetReplicas(), st.GetNode()) {
			local = append(local, s.GetId())
			continue
		}
		rs := remoteShard{ID: s.GetId()}
		for _, id := range append([]string{s.GetLeader()}, s.GetReplicas()...) {
			if id != "" {
				rs.Node, rs.Link = id, links[id]
				if rs.Link != "" {
					break
				}
			}
		}
		remote = append(remote, rs)
	}
	return local, remote
}

// ---- /queues/{name} ----

type queueData struct {
	Name     string
	Stats    *taskstorepb.QueueStats
	Tasks    []taskRow
	Page     string
	NextURL  string
	FirstURL string
	Rates    bool
	// Schedules that insert into the queue, from the shards this node
	// leads.
	Schedules []*taskstorepb.Schedule
	// Actions: CanAct when the caller is an admin the page acts for
	// (Token signs its forms); HasActions when the page has actions at
	// all.
	CanAct, HasActions bool
	Token              string
}

type taskRow struct {
	*taskstorepb.Task
	State    string // available, delayed, claimed
	Value    valuePreview
	ValueURL string
	Headers  string // KEY=VALUE pairs in key order; empty when none
}

func (h *Handler) queue(w http.ResponseWriter, r *http.Request, name string) {
	ctx := r.Context()
	tok := r.URL.Query().Get("page")
	st := h.cluster.Status(ctx, true)
	p := page{Title: name, Nav: "queues", Node: st.GetNode()}
	res, err := h.queues.Tasks(ctx, &taskstorepb.TasksRequest{Queue: name, Limit: uint32(h.opts.PageSize), PageToken: tok, Stale: true})
	if err != nil {
		h.readError(w, r, st, name, err)
		return
	}
	stats := h.queueStats(ctx, name)
	if stats == nil && len(res.GetTasks()) == 0 {
		h.renderError(w, http.StatusNotFound, st.GetNode(), "No such queue",
			fmt.Sprintf("There is no queue named %q (a queue exists while it holds tasks).", name))
		return
	}
	d := queueData{Name: name, Stats: stats, Page: tok, FirstURL: queueURL(name), Rates: stats != nil && hasRates(stats),
		HasActions: h.opts.Actions != nil}
	p.Done = r.URL.Query().Get("done")
	if a, ok := h.canAct(r); ok {
		d.CanAct, d.Token = true, a.Token
	}
	if ss, err := h.queues.Schedules(ctx, &taskstorepb.SchedulesRequest{Prefix: name, Stale: true}); err == nil {
		for _, s := range ss.GetSchedules() {
			if s.GetQueue() == name {
				d.Schedules = append(d.Schedules, s)
			}
		}
	}
	if next := res.GetNextPageToken(); next != "" {
		d.NextURL = queueURL(name) + "?" + url.Values{"page": {next}}.Encode()
	}
	now := h.opts.Now()
	for _, t := range res.GetTasks() {
		d.Tasks = append(d.Tasks, taskRow{Task: t, State: taskState(t, now), Value: preview(t.GetValue(), h.opts.ValueChars), ValueURL: valueURL(name, t.GetId()), Headers: headerText(t.GetHeaders())})
	}
	p.Data = d
	h.render(w, http.StatusOK, "queue.html", p)
}

// headerText shows a task's headers as KEY=VALUE pairs in key order.
func headerText(h map[string]string) string {
	parts := make([]string, 0, len(h))
	for _, k := range slices.Sorted(maps.Keys(h)) {
		parts = append(parts, k+"="+h[k])
	}
	return strings.Join(parts, " ")
}

// queueStats finds a queue's stats among the local shards (nil if absent).
func (h *Handler) queueStats(ctx context.Context, name string) *taskstorepb.QueueStats {
	res, err := h.queues.Queues(ctx, &taskstorepb.QueuesRequest{Prefix: name, Limit: 1, Stale: true})
	if err != nil {
		return nil
	}
	for _, q := range res.GetQueues() {
		if q.GetName() == name {
			return q
		}
	}
	return nil
}

func taskState(t *taskstorepb.Task, now time.Time) string {
	at := t.GetAt()
	switch {
	case at == nil || !at.AsTime().After(now):
		return "available"
	case t.GetClaimant() != "":
		return "claimed"
	default:
		return "delayed"
	}
}

// readError answers a failed task read: a queue on a shard hosted
// elsewhere points at a node that hosts it.
func (h *Handler) readError(w http.ResponseWriter, r *http.Request, st *taskstorepb.StatusResponse, name string, err error) {
	s, _ := status.FromError(err)
	switch s.Code() {
	case codes.InvalidArgument:
		h.renderError(w, http.StatusBadRequest, st.GetNode(), "Bad request", s.Message())
		return
	case codes.NotFound:
		h.renderError(w, http.StatusNotFound, st.GetNode(), "Not found", s.Message())
		return
	}
	msg, link := fmt.Sprintf("Reading queue %q failed: %s", name, errText(err)), ""
	for _, d := range s.Details() {
		nl, ok := d.(*taskstorepb.NotLeader)
		if !ok {
			continue
		}
		msg = fmt.Sprintf("Queue %q lives on shard %d, which is not hosted on this node.", name, nl.GetShard())
		for _, n := range st.GetNodes() {
			if n.GetAddress() != "" && (n.GetAddress() == nl.GetLeaderAddress() || n.GetId() == nl.GetLeaderId()) {
				msg += " Node " + n.GetId() + " hosts it."
				if n.GetHttpAddress() != "" {
					link = peerURL(r, n.GetHttpAddress(), queueURL(name))
				}
				break
			}
		}
	}
	h.renderErrorLink(w, http.StatusServiceUnavailable, st.GetNode(), "Unavailable", msg, link)
}

func errText(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}

// ---- /queues/{name}/tasks/{id}/value ----

func (h *Handler) value(w http.ResponseWriter, r *http.Request, name, id string) {
	res, err := h.queues.Tasks(r.Context(), &taskstorepb.TasksRequest{Queue: name, Ids: []string{id}, Stale: true})
	if err != nil {
		h.readError(w, r, h.cluster.Status(r.Context(), true), name, err)
		return
	}
	var task *taskstorepb.Task
	for _, t := range res.GetTasks() {
		if t.GetId() == id && t.GetQueue() == name {
			task = t
		}
	}
	if task == nil {
		h.renderError(w, http.StatusNotFound, "", "No such task", fmt.Sprintf("Queue %q holds no task %q.", name, id))
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "application/octet-stream")
	hd.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": safeFilename(id) + ".bin"}))
	hd.Set("Content-Length", strconv.Itoa(len(task.GetValue())))
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Cache-Control", "no-store")
	hd.Set("Content-Security-Policy", "default-src 'none'; sandbox")
	w.Write(task.GetValue())
}

// safeFilename keeps the characters of a task id that need no quoting.
func safeFilename(id string) string {
	b := []byte(id)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	if len(b) == 0 || len(b) > 100 {
		return "value"
	}
	return string(b)
}
