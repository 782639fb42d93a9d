package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/client/clienttest"
)

type result struct {
	stdout, stderr string
	code           int
}

// run runs taskctl against the fake cluster.
func run(t *testing.T, fc *clienttest.Cluster, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	env := func(k string) string {
		if k == "TASKSTORE_ENDPOINTS" {
			return fc.Addrs()
		}
		return ""
	}
	code := execute(context.Background(), append([]string{"--timeout", "5s"}, args...), &out, &errb, env)
	return result{out.String(), errb.String(), code}
}

func mustRun(t *testing.T, fc *clienttest.Cluster, args ...string) string {
	t.Helper()
	r := run(t, fc, args...)
	if r.code != 0 {
		t.Fatalf("taskctl %v: exit %d, stderr:\n%s", args, r.code, r.stderr)
	}
	return r.stdout
}

func tasksJSON(t *testing.T, out string) []*taskstorepb.Task {
	t.Helper()
	var resp taskstorepb.TasksResponse
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("not a tasks response: %v\n%s", err, out)
	}
	return resp.Tasks
}

func TestStatusTableAndJSON(t *testing.T) {
	fc := clienttest.New(t, 3, 4)
	out := mustRun(t, fc, "status")
	for _, want := range []string{"NODES", "SHARDS", "ADDRESS", "HEALTH", "LEADS", "LAG", "n1", "n3", fc.Nodes()[1].Addr, "member", "alive"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}

	out = mustRun(t, fc, "-o", "json", "status")
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, out)
	}
	if _, ok := raw["nodes"]; !ok {
		t.Errorf("status JSON lacks nodes: %s", out)
	}
	var st taskstorepb.StatusResponse
	if err := protojson.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != 3 || len(st.Shards) != 4 || st.Shards[0].Leader == "" || len(st.Shards[0].Replicas) != 3 {
		t.Errorf("status = %v", &st)
	}

	out = mustRun(t, fc, "node", "list")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") {
		t.Errorf("node list:\n%s", out)
	}
	out = mustRun(t, fc, "-o", "json", "shard", "list")
	if strings.Contains(out, `"nodes"`) || !strings.Contains(out, `"shards"`) {
		t.Errorf("shard list JSON:\n%s", out)
	}
}

func TestTaskInsertListGet(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	out := mustRun(t, fc, "-o", "json", "task", "insert", "crawl/fetch", "--value", "https://example.com", "--priority", "5", "--id", "t1")
	tasks := tasksJSON(t, out)
	if len(tasks) != 1 || tasks[0].Id != "t1" || tasks[0].Version != 1 || tasks[0].Queue != "crawl/fetch" ||
		string(tasks[0].Value) != "https://example.com" || tasks[0].Priority != 5 {
		t.Fatalf("inserted %v", tasks)
	}
	if !strings.Contains(out, `"tasks"`) || !strings.Contains(out, `"value": "aHR0cHM6Ly9leGFtcGxlLmNvbQ=="`) {
		t.Errorf("insert JSON is not {\"tasks\":[...]} with a base64 value:\n%s", out)
	}

	mustRun(t, fc, "task", "insert", "crawl/fetch", "--value", strings.Repeat("long text ", 10), "--id", "t2")
	fc.SetHook(nil)
	if _, err := execInsertBinary(t, fc); err != nil {
		t.Fatal(err)
	}

	out = mustRun(t, fc, "task", "list", "crawl/fetch")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "VALUE") ||
		!strings.Contains(lines[0], "ATTEMPT") || !strings.Contains(lines[0], "ERR") {
		t.Fatalf("task list:\n%s", out)
	}
	if !strings.HasPrefix(lines[1], "t1 ") || !strings.Contains(lines[1], "https://example.com") {
		t.Errorf("first row is not the priority-5 task t1:\n%s", out)
	}
	if !strings.Contains(out, "long text long text") || strings.Contains(out, strings.Repeat("long text ", 10)) || !strings.Contains(out, "…") {
		t.Errorf("long value not truncated:\n%s", out)
	}
	if !strings.Contains(out, "<3 bytes> fffe00") {
		t.Errorf("binary value not shown as hex:\n%s", out)
	}

	out = mustRun(t, fc, "task", "get", "t2")
	if !strings.Contains(out, strings.Repeat("long text ", 9)) || !strings.Contains(out, "crawl/fetch") {
		t.Errorf("task get:\n%s", out)
	}
	if r := run(t, fc, "task", "get", "nope"); r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("task get of a missing task: %+v", r)
	}
}

// An --if-absent insert whose key is taken says that it inserted nothing
// and prints the holder (it printed the holder as if it were new).
func TestTaskInsertIfAbsentSaysTheKeyWasTaken(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	first := run(t, fc, "task", "insert", "mr/map", "--value", "a", "--key", "k7", "--if-absent", "--id", "h1")
	if first.code != 0 || strings.Contains(first.stderr, "taken") {
		t.Fatalf("first insert: %+v", first)
	}
	again := run(t, fc, "task", "insert", "mr/map", "--value", "b", "--key", "k7", "--if-absent")
	if again.code != 0 || !strings.Contains(again.stderr, `key "k7" is taken in mr/map: nothing inserted`) || !strings.Contains(again.stdout, "h1") {
		t.Fatalf("second insert: %+v", again)
	}
}

// execInsertBinary inserts a non-UTF-8 value through --file -.
func execInsertBinary(t *testing.T, fc *clienttest.Cluster) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	a := &app{ctx: context.Background(), stdout: &out, stderr: &errb, getenv: func(k string) string {
		if k == "TASKSTORE_ENDPOINTS" {
			return fc.Addrs()
		}
		return ""
	}}
	root := a.rootCmd()
	root.SetIn(bytes.NewReader([]byte{0xff, 0xfe, 0x00}))
	root.SetArgs([]string{"task", "insert", "crawl/fetch", "--file", "-", "--id", "t3"})
	root.SetOut(&out)
	root.SetErr(&errb)
	return out.String(), root.Execute()
}

func TestTaskClaimReleaseDelete(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	mustRun(t, fc, "task", "insert", "jobs/a", "--value", "x", "--id", "t1")

	out := mustRun(t, fc, "-o", "json", "task", "claim", "jobs/a", "--claimant", "w1", "--lease", "1m")
	tasks := tasksJSON(t, out)
	if len(tasks) != 1 || tasks[0].Claimant != "w1" || tasks[0].Version != 2 {
		t.Fatalf("claimed %v", tasks)
	}

	r := run(t, fc, "task", "claim", "jobs/a")
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "no task available") {
		t.Errorf("empty claim: %+v", r)
	}

	// Stale version: refused, every reference printed.
	r = run(t, fc, "task", "delete", "t1", "--version", "1")
	if r.code == 0 || !strings.Contains(r.stderr, "transaction refused") || !strings.Contains(r.stderr, "stale delete of t1 v1") ||
		!strings.Contains(r.stderr, "current v2") {
		t.Errorf("stale delete: %+v", r)
	}

	// Release acts as the current claimant by default.
	out = mustRun(t, fc, "-o", "json", "task", "release", "t1", "--version", "2")
	tasks = tasksJSON(t, out)
	if len(tasks) != 1 || tasks[0].Version != 3 || tasks[0].Claimant != "" {
		t.Fatalf("released %v", tasks)
	}

	out = mustRun(t, fc, "task", "delete", "t1", "--version", "3")
	if !strings.Contains(out, "deleted t1 version 3") {
		t.Errorf("delete output: %q", out)
	}
	if fc.Task("t1") != nil {
		t.Error("t1 still exists")
	}
	if r := run(t, fc, "task", "delete", "t1"); r.code == 0 || !strings.Contains(r.stderr, "version") {
		t.Errorf("delete without --version: %+v", r)
	}
}

// TestTaskDeleteClaimNext: a delete that claims the next task in the same
// request, for the deleted task's claimant.
func TestTaskDeleteClaimNext(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	for _, id := range []string{"n1", "n2"} {
		mustRun(t, fc, "task", "insert", "next/a", "--value", "x", "--id", id)
	}
	tasks := tasksJSON(t, mustRun(t, fc, "-o", "json", "task", "claim", "next/a", "--claimant", "w1"))
	if len(tasks) != 1 || tasks[0].Id != "n1" {
		t.Fatalf("claimed %v", tasks)
	}
	out := mustRun(t, fc, "-o", "json", "task", "delete", "n1", "--version", "2", "--claim-next", "next/a", "--lease", "1m")
	var resp taskstorepb.ModifyResponse
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("not a modify response: %v\n%s", err, out)
	}
	if len(resp.Claimed) != 1 || resp.Claimed[0].Id != "n2" || resp.Claimed[0].Claimant != "w1" || resp.Claimed[0].Version != 2 {
		t.Fatalf("claimed with the delete: %v", resp.Claimed)
	}
	if fc.Task("n1") != nil {
		t.Error("n1 still exists")
	}
	if n := len(fc.CallsTo("Modify")); n != 3 { // two inserts, one delete with its claim
		t.Errorf("%d Modify calls, want 3", n)
	}
	// Nothing left: the delete goes through and says so.
	r := run(t, fc, "task", "delete", "n2", "--version", "2", "--claim-next", "next/a")
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "deleted n2 version 2") || !strings.Contains(r.stderr, "no task available") {
		t.Errorf("delete and claim nothing: %+v", r)
	}
	// Another group's queue is refused, and nothing is deleted.
	mustRun(t, fc, "task", "insert", "next/a", "--id", "n3")
	if r := run(t, fc, "task", "delete", "n3", "--version", "1", "--claim-next", "other/a"); r.code == 0 || fc.Task("n3") == nil {
		t.Errorf("claim in another group: %+v", r)
	}
}

func TestQueueCommands(t *testing.T) {
	fc := clienttest.New(t, 3, 4)
	for _, q := range []string{"a/x", "a/x", "b/y", "c/z"} {
		mustRun(t, fc, "task", "insert", q)
	}
	out := mustRun(t, fc, "queue", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "QUEUE") || !strings.HasPrefix(lines[1], "a/x") {
		t.Fatalf("queue list:\n%s", out)
	}
	if f := strings.Fields(lines[1]); f[2] != "2" || f[3] != "2" {
		t.Errorf("a/x counts: %v", f)
	}

	out = mustRun(t, fc, "-o", "json", "queue", "list", "b/")
	var qr taskstorepb.QueuesResponse
	if err := protojson.Unmarshal([]byte(out), &qr); err != nil {
		t.Fatal(err)
	}
	if len(qr.Queues) != 1 || qr.Queues[0].Name != "b/y" || qr.Queues[0].Total != 1 {
		t.Errorf("queue list b/: %v", &qr)
	}

	out = mustRun(t, fc, "queue", "stats", "a/x")
	if !strings.Contains(out, "queue                a/x\n") || !strings.Contains(out, "total                2\n") {
		t.Errorf("queue stats:\n%s", out)
	}
	out = mustRun(t, fc, "queue", "stats", "empty/q")
	if !strings.Contains(out, "queue                empty/q\n") || !strings.Contains(out, "total                0\n") {
		t.Errorf("stats of an empty queue:\n%s", out)
	}

	out = mustRun(t, fc, "queue", "purge", "a/x")
	if out != "purged a/x: 2 task(s) deleted\n" {
		t.Errorf("purge: %q", out)
	}
	out = mustRun(t, fc, "queue", "list")
	if strings.Contains(out, "a/x") {
		t.Errorf("a/x still listed after purge:\n%s", out)
	}
}

func TestShardTransfer(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	out := mustRun(t, fc, "shard", "transfer", "1", "--to", "n2")
	if !strings.Contains(out, "shard 1: leader is now n2") || fc.Leader(1) != "n2" {
		t.Errorf("transfer: %q, leader %s", out, fc.Leader(1))
	}
	if r := run(t, fc, "shard", "transfer", "x"); r.code == 0 {
		t.Errorf("transfer of shard x succeeded")
	}
}

func TestBadFlagsAndUnreachable(t *testing.T) {
	fc := clienttest.New(t, 1, 1)
	if r := run(t, fc, "-o", "yaml", "status"); r.code == 0 || !strings.Contains(r.stderr, "table or json") {
		t.Errorf("-o yaml: %+v", r)
	}
	r := run(t, fc, "--endpoints", "127.0.0.1:1", "--timeout", "300ms", "status")
	if r.code == 0 || !strings.HasPrefix(r.stderr, "error: ") {
		t.Errorf("unreachable endpoint: %+v", r)
	}
}

// TestEveryCommandIsDocumented: every command has a one-line description, a
// longer explanation and an example.
func TestEveryCommandIsDocumented(t *testing.T) {
	a := &app{ctx: context.Background(), getenv: func(string) string { return "" }}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Short == "" || c.Long == "" || c.Example == "" {
			t.Errorf("%q: Short, Long and Example are required", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			if sub.Name() != "help" && sub.Name() != "completion" {
				walk(sub)
			}
		}
	}
	walk(a.rootCmd())
}

// TestShardTableMarksThePreferredLeader: REPLICAS marks the preferred
// leader with "*" (the list's order means nothing since the preference is
// a field of the map).
func TestShardTableMarksThePreferredLeader(t *testing.T) {
	var out bytes.Buffer
	err := printShards(&out, []*taskstorepb.ShardStatus{
		{Id: 1, Leader: "n1", Term: 2, Replicas: []string{"n1", "n2", "n3"}, PreferredLeader: "n3"},
		{Id: 2, Leader: "n2", Term: 2, Replicas: []string{"n2", "n3"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], " n1,n2,n3* ") || !strings.Contains(lines[2], " n2,n3 ") {
		t.Fatalf("shard table:\n%s", out.String())
	}
}

// TestTaskByIDInTwoGroups: the same id in two consistency groups (once,
// `task delete ID --version V` removed one of them, whichever a lookup found
// first), on two shards and on one (ids are unique per group). task get
// prints both and says so; task delete without --queue is refused, names
// both queues and deletes nothing; with --queue it deletes that queue's
// task only.
func TestTaskByIDInTwoGroups(t *testing.T) {
	for _, sameShard := range []bool{false, true} {
		t.Run(fmt.Sprintf("same shard %v", sameShard), func(t *testing.T) {
			testTaskByIDInTwoGroups(t, sameShard)
		})
	}
}

func testTaskByIDInTwoGroups(t *testing.T, sameShard bool) {
	fc := clienttest.New(t, 3, 2)
	var queues []string
	for i := 0; len(queues) < 2; i++ {
		q := fmt.Sprintf("g%d/work", i)
		if len(queues) == 0 || (fc.ShardOf(q) == fc.ShardOf(queues[0])) == sameShard {
			queues = append(queues, q)
		}
	}
	for _, q := range queues {
		mustRun(t, fc, "task", "insert", q, "--id", "theta-task-1", "--value", q)
	}
	r := run(t, fc, "-o", "json", "task", "get", "theta-task-1")
	if r.code != 0 {
		t.Fatalf("task get: exit %d\n%s", r.code, r.stderr)
	}
	if got := tasksJSON(t, r.stdout); len(got) != 2 || got[0].Queue != queues[0] || got[1].Queue != queues[1] {
		t.Errorf("task get printed %v, want the task of %s and of %s", got, queues[0], queues[1])
	}
	if !strings.Contains(r.stderr, "2 tasks have id") {
		t.Errorf("task get does not say the id is in two groups:\n%s", r.stderr)
	}
	r = run(t, fc, "task", "delete", "theta-task-1", "--version", "1")
	if r.code == 0 {
		t.Fatalf("task delete of an ambiguous id succeeded:\n%s", r.stdout)
	}
	for _, want := range append([]string{"--queue"}, queues...) {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the refusal lacks %q:\n%s", want, r.stderr)
		}
	}
	if fc.Count() != 2 {
		t.Fatalf("a refused delete left %d tasks, want 2", fc.Count())
	}
	mustRun(t, fc, "task", "delete", "theta-task-1", "--version", "1", "--queue", queues[1])
	got := tasksJSON(t, mustRun(t, fc, "-o", "json", "task", "get", "theta-task-1"))
	if len(got) != 1 || got[0].Queue != queues[0] {
		t.Errorf("after deleting the copy in %s: %v, want only the one in %s", queues[1], got, queues[0])
	}
}

// TestTaskListFilters finds tasks by state, claimant, key prefix, attempt
// and err, through the node's own TaskStore service; and
// a filter with ids is refused, not ignored.
func TestTaskListFilters(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	c, err := client.Dial(context.Background(), fc.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{
		{Id: "a", Queue: "jobs/q", Key: "user-1"},
		{Id: "b", Queue: "jobs/q", Key: "user-2", Attempt: 3, Err: "timeout talking to db"},
		{Id: "c", Queue: "jobs/q", Attempt: 5, Err: "bad input"},
		{Id: "d", Queue: "jobs/q", Delay: durationpb.New(time.Hour)},
	}}); err != nil {
		t.Fatal(err)
	}
	mustRun(t, fc, "task", "claim", "jobs/q", "--claimant", "w7", "--lease", "1h")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--state", "claimed"}, []string{"a"}},
		{[]string{"--claimant", "w7"}, []string{"a"}},
		{[]string{"--state", "delayed"}, []string{"d"}},
		{[]string{"--state", "available"}, []string{"b", "c"}},
		{[]string{"--key-prefix", "user-"}, []string{"b", "a"}},
		{[]string{"--min-attempt", "3"}, []string{"b", "c"}},
		{[]string{"--err", "timeout", "--min-attempt", "1"}, []string{"b"}},
	} {
		var got []string
		for _, task := range tasksJSON(t, mustRun(t, fc, append([]string{"-o", "json", "task", "list", "jobs/q"}, tc.args...)...)) {
			got = append(got, task.Id)
		}
		slices.Sort(got)
		want := slices.Sorted(slices.Values(tc.want))
		if !slices.Equal(got, want) {
			t.Errorf("task list %v: %v, want %v", tc.args, got, want)
		}
	}
	if r := run(t, fc, "task", "list", "jobs/q", "--state", "sleeping"); r.code == 0 || !strings.Contains(r.stderr, "available, claimed or delayed") {
		t.Errorf("--state sleeping: exit %d\n%s", r.code, r.stderr)
	}
	_, err = c.Tasks(ctx, &taskstorepb.TasksRequest{Ids: []string{"a"}, MinAttempt: 1})
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "not a lookup by ids") {
		t.Errorf("a filter with ids: %v, want InvalidArgument", err)
	}
}

// TestQueueMove sends a dead-letter queue back to work with taskctl:
// progress per batch on stderr, a summary, attempts reset.
func TestQueueMove(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	for i := range 5 {
		mustRun(t, fc, "task", "insert", "jobs/dead", "--id", fmt.Sprintf("d%d", i), "--value", "x")
	}
	r := run(t, fc, "queue", "move", "jobs/dead", "jobs/work", "--batch", "2", "--reset-attempts")
	if r.code != 0 {
		t.Fatalf("queue move: exit %d\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "moved 5 task(s) from jobs/dead to jobs/work, skipped 0") || strings.Count(r.stderr, "moved ") < 3 {
		t.Errorf("stdout:\n%s\nstderr:\n%s\nwant a summary of 5 moved and progress for each batch of 2", r.stdout, r.stderr)
	}
	if got := fc.Task("d4"); got == nil || got.Queue != "jobs/work" {
		t.Errorf("d4: %v, want it in jobs/work", got)
	}
	if r := run(t, fc, "queue", "move", "jobs/work", "mail/work"); r.code == 0 || !strings.Contains(r.stderr, "one consistency group") {
		t.Errorf("a move across groups: exit %d\n%s", r.code, r.stderr)
	}
}

// TestQueuePauseResume: queue pause stops claims of the
// queue (inserts go on), queue list and stats say so, a second pause says
// it already was, and queue resume lets the task be claimed.
func TestQueuePauseResume(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	if out := mustRun(t, fc, "queue", "pause", "jobs/q"); !strings.Contains(out, "jobs/q paused") {
		t.Fatalf("queue pause printed %q", out)
	}
	if out := mustRun(t, fc, "queue", "pause", "jobs/q"); !strings.Contains(out, "already paused") {
		t.Fatalf("a second queue pause printed %q", out)
	}
	mustRun(t, fc, "task", "insert", "jobs/q", "--id", "p1", "--value", "v")
	list := mustRun(t, fc, "queue", "list", "jobs/")
	if lines := strings.Split(strings.TrimSpace(list), "\n"); len(lines) != 2 || !regexp.MustCompile(`\syes\s+-\s+-$`).MatchString(strings.TrimSpace(lines[1])) {
		t.Fatalf("queue list of a paused queue:\n%s", list)
	}
	if out := mustRun(t, fc, "queue", "stats", "jobs/q"); !regexp.MustCompile(`paused\s+yes`).MatchString(out) {
		t.Fatalf("queue stats of a paused queue:\n%s", out)
	}
	if out := mustRun(t, fc, "-o", "json", "task", "claim", "jobs/q"); strings.Contains(out, "p1") {
		t.Fatalf("a claim of the paused queue returned a task:\n%s", out)
	}
	if out := mustRun(t, fc, "queue", "resume", "jobs/q"); !strings.Contains(out, "jobs/q resumed") {
		t.Fatalf("queue resume printed %q", out)
	}
	if out := mustRun(t, fc, "-o", "json", "task", "claim", "jobs/q"); !strings.Contains(out, "p1") {
		t.Fatalf("a claim after the resume did not return p1:\n%s", out)
	}
	if out := mustRun(t, fc, "queue", "resume", "jobs/q"); !strings.Contains(out, "was not paused") {
		t.Fatalf("a second queue resume printed %q", out)
	}
}

// TestQueueLimit: with queue limit 1, a claim of five
// takes one, the next finds nothing and says the limit is why, queue list
// and stats show it, and deleting the claimed task lets the other be
// claimed; a paused queue's empty claim says it is paused.
func TestQueueLimit(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	if out := mustRun(t, fc, "queue", "limit", "lim/q", "1"); !strings.Contains(out, "at most 1 claimed at once (was no limit)") {
		t.Fatalf("queue limit printed %q", out)
	}
	for _, id := range []string{"l1", "l2"} {
		mustRun(t, fc, "task", "insert", "lim/q", "--id", id)
	}
	first := tasksJSON(t, mustRun(t, fc, "-o", "json", "task", "claim", "lim/q", "--limit", "5"))
	if len(first) != 1 {
		t.Fatalf("a claim of 5 under a limit of 1 took %d tasks", len(first))
	}
	r := run(t, fc, "task", "claim", "lim/q")
	if r.code != 0 || !strings.Contains(r.stderr, "no task available: lim/q has 1 claimed, its limit") {
		t.Fatalf("a claim at the limit: exit %d, stderr %q", r.code, r.stderr)
	}
	if out := mustRun(t, fc, "queue", "list", "lim/"); !regexp.MustCompile(`lim/q\s.*\s-\s+1\s+-\s*$`).MatchString(strings.TrimSpace(out)) {
		t.Fatalf("queue list shows no LIMIT 1:\n%s", out)
	}
	if out := mustRun(t, fc, "queue", "stats", "lim/q"); !regexp.MustCompile(`max claimed\s+1`).MatchString(out) {
		t.Fatalf("queue stats shows no limit:\n%s", out)
	}
	mustRun(t, fc, "task", "delete", first[0].Id, "--version", fmt.Sprint(first[0].Version), "--queue", "lim/q")
	if next := tasksJSON(t, mustRun(t, fc, "-o", "json", "task", "claim", "lim/q")); len(next) != 1 || next[0].Id == first[0].Id {
		t.Fatalf("after the claimed task was deleted: %v, want the other task", next)
	}
	if out := mustRun(t, fc, "queue", "limit", "lim/q", "0"); !strings.Contains(out, "(was 1)") {
		t.Fatalf("removing the limit printed %q", out)
	}
	if r := run(t, fc, "queue", "limit", "lim/q", "many"); r.code == 0 || !strings.Contains(r.stderr, "whole number") {
		t.Fatalf("queue limit with a bad N: exit %d, stderr %q", r.code, r.stderr)
	}
	mustRun(t, fc, "queue", "pause", "lim/p")
	mustRun(t, fc, "task", "insert", "lim/p", "--id", "p1")
	if r := run(t, fc, "task", "claim", "lim/p"); !strings.Contains(r.stderr, "lim/p is paused") {
		t.Fatalf("a claim of a paused queue: stderr %q, want it to say the queue is paused", r.stderr)
	}
}

// TestInsertHeld: task insert --hold --delay inserts the
// task held by --claimant until its time: another claimant's delete is
// refused as claimed, the holder's goes through; --hold without --delay is
// refused.
func TestInsertHeld(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	got := tasksJSON(t, mustRun(t, fc, "-o", "json", "task", "insert", "ed/drafts", "--id", "d1", "--delay", "1h", "--hold", "--claimant", "editor"))
	if len(got) != 1 || got[0].Claimant != "editor" {
		t.Fatalf("held insert: %v, want claimant editor", got)
	}
	r := run(t, fc, "task", "delete", "d1", "--version", "1", "--queue", "ed/drafts", "--claimant", "someone-else")
	if r.code == 0 || !strings.Contains(r.stderr, "editor") {
		t.Fatalf("another claimant's delete of a held task: exit %d, stderr %q", r.code, r.stderr)
	}
	mustRun(t, fc, "task", "delete", "d1", "--version", "1", "--queue", "ed/drafts", "--claimant", "editor")
	if r := run(t, fc, "task", "insert", "ed/drafts", "--hold"); r.code == 0 || !strings.Contains(r.stderr, "--hold needs --delay") {
		t.Fatalf("--hold without --delay: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestDedupWindow: a task inserted with a key and a dedup
// window, once deleted, keeps its key: inserting it again is refused, and
// with --if-absent prints the deleted task and says nothing was inserted.
func TestDedupWindow(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	got := tasksJSON(t, mustRun(t, fc, "-o", "json", "task", "insert", "mail/send", "--id", "m1", "--key", "order-7", "--dedup-window", "1h"))
	if len(got) != 1 || got[0].DedupWindow.AsDuration() != time.Hour {
		t.Fatalf("insert with a dedup window: %v", got)
	}
	mustRun(t, fc, "task", "delete", "m1", "--version", "1", "--queue", "mail/send")
	r := run(t, fc, "task", "insert", "mail/send", "--id", "m2", "--key", "order-7")
	if r.code == 0 || !strings.Contains(r.stderr, "order-7") || !strings.Contains(r.stderr, "m1") {
		t.Fatalf("a second insert of the reserved key: exit %d, stderr %q", r.code, r.stderr)
	}
	r = run(t, fc, "-o", "json", "task", "insert", "mail/send", "--id", "m3", "--key", "order-7", "--if-absent")
	if r.code != 0 || !strings.Contains(r.stderr, "nothing inserted") || !strings.Contains(r.stdout, `"m1"`) {
		t.Fatalf("--if-absent of the reserved key: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if fc.Count() != 0 {
		t.Fatalf("%d tasks exist, want none", fc.Count())
	}
	if r := run(t, fc, "task", "insert", "mail/send", "--dedup-window", "1h"); r.code == 0 || !strings.Contains(r.stderr, "needs --key") {
		t.Fatalf("--dedup-window without --key: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestScheduleCommands: schedule add prints the next tick,
// list shows the timing, a bad cron expression or zone is refused, remove
// of a name two groups use asks for --queue, and remove deletes it.
func TestScheduleCommands(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	if out := mustRun(t, fc, "schedule", "add", "nightly", "--queue", "rep/run", "--cron", "0 2 * * *", "--tz", "Europe/Berlin"); !strings.Contains(out, "schedule nightly added: next tick ") {
		t.Fatalf("schedule add printed %q", out)
	}
	mustRun(t, fc, "schedule", "add", "nightly", "--queue", "ops/run", "--every", "90s", "--missed", "once")
	out := mustRun(t, fc, "schedule", "list")
	for _, want := range []string{"0 2 * * * (Europe/Berlin)", "every 1m30s", "once", "rep/run", "ops/run"} {
		if !strings.Contains(out, want) {
			t.Errorf("schedule list lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range [][]string{
		{"schedule", "add", "x", "--queue", "rep/run", "--cron", "61 * * * *"},
		{"schedule", "add", "x", "--queue", "rep/run", "--cron", "* * * * *", "--tz", "Mars/Base"},
		{"schedule", "add", "x", "--queue", "rep/run"},
		{"schedule", "add", "x/y", "--queue", "rep/run", "--every", "1m"},
	} {
		if r := run(t, fc, bad...); r.code == 0 {
			t.Errorf("%v was accepted", bad)
		}
	}
	if r := run(t, fc, "schedule", "remove", "nightly"); r.code == 0 || !strings.Contains(r.stderr, "--queue") {
		t.Fatalf("remove of a name in two groups: exit %d, stderr %q", r.code, r.stderr)
	}
	if out := mustRun(t, fc, "schedule", "remove", "nightly", "--queue", "ops/run"); !strings.Contains(out, "removed") {
		t.Fatalf("schedule remove printed %q", out)
	}
	if out := mustRun(t, fc, "schedule", "remove", "nightly"); !strings.Contains(out, "removed") {
		t.Fatalf("schedule remove of the last one printed %q", out)
	}
	if out := mustRun(t, fc, "schedule", "list"); strings.Contains(out, "nightly") {
		t.Fatalf("removed schedules are listed:\n%s", out)
	}
}

// task change sets a task's attempt and error (what a worker's change can
// set), as the current claimant by default; a change names a field.
func TestTaskChangeSetsAttemptAndError(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	mustRun(t, fc, "task", "insert", "jobs/a", "--value", "x", "--id", "t1")
	mustRun(t, fc, "task", "claim", "jobs/a", "--claimant", "w1", "--lease", "1m")
	out := mustRun(t, fc, "-o", "json", "task", "change", "t1", "--version", "2", "--attempt", "3", "--err", "boom", "--keep-claim")
	tasks := tasksJSON(t, out)
	if len(tasks) != 1 || tasks[0].Version != 3 || tasks[0].Attempt != 3 || tasks[0].Err != "boom" || tasks[0].Claimant != "w1" {
		t.Fatalf("changed %v", tasks)
	}
	if r := run(t, fc, "task", "change", "t1", "--version", "3"); r.code == 0 || !strings.Contains(r.stderr, "nothing to change") {
		t.Errorf("change without a field: %+v", r)
	}
	out = mustRun(t, fc, "-o", "json", "task", "change", "t1", "--version", "3", "--err", "")
	if tasks = tasksJSON(t, out); len(tasks) != 1 || tasks[0].Err != "" || tasks[0].Attempt != 3 || tasks[0].Version != 4 || tasks[0].Claimant != "" {
		t.Fatalf("error cleared, claim ended: %v", tasks)
	}
}

// An insert refused for a key whose task was deleted within its dedup
// window says so, rather than naming the deleted task as if it held the key.
func TestTaskInsertSaysTheKeysTaskWasDeleted(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	mustRun(t, fc, "task", "insert", "mr/map", "--value", "a", "--key", "k1", "--dedup-window", "1h", "--id", "d1")
	mustRun(t, fc, "task", "delete", "d1", "--version", "1")
	r := run(t, fc, "task", "insert", "mr/map", "--value", "b", "--key", "k1")
	if r.code == 0 || !strings.Contains(r.stderr, "the key's task d1 was deleted") || !strings.Contains(r.stderr, "dedup window") {
		t.Fatalf("insert with the key of a deleted task: %+v", r)
	}
	r = run(t, fc, "task", "insert", "mr/map", "--value", "b", "--key", "k1", "--if-absent")
	if r.code != 0 || !strings.Contains(r.stderr, "the task that held it, as it was deleted") {
		t.Fatalf("insert --if-absent with the key of a deleted task: %+v", r)
	}
	// A key held by a live task says nothing about a deletion.
	mustRun(t, fc, "task", "insert", "mr/map", "--value", "c", "--key", "k2", "--id", "l1")
	if r := run(t, fc, "task", "insert", "mr/map", "--value", "d", "--key", "k2"); r.code == 0 || strings.Contains(r.stderr, "deleted") {
		t.Fatalf("insert with a live task's key: %+v", r)
	}
}
