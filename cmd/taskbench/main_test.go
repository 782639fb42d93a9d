package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestPercentiles(t *testing.T) {
	var h hist
	if h.percentile(50) != 0 || h.max() != 0 || h.mean() != 0 {
		t.Fatal("empty histogram should answer 0")
	}
	// 1..1000 ms, recorded out of order.
	for i := 1000; i >= 1; i-- {
		h.record(time.Duration(i) * time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 500 * time.Millisecond}, {90, 900 * time.Millisecond}, {99, 990 * time.Millisecond},
		{99.9, 999 * time.Millisecond}, {100, 1000 * time.Millisecond}, {0.01, time.Millisecond}} {
		if got := h.percentile(c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if h.max() != time.Second {
		t.Errorf("max = %v", h.max())
	}
	if got := h.mean(); got != 500500*time.Microsecond {
		t.Errorf("mean = %v", got)
	}
	// Merging keeps every sample; recording after a percentile re-sorts.
	var a, b hist
	a.record(3 * time.Millisecond)
	a.record(1 * time.Millisecond)
	_ = a.percentile(50)
	b.record(2 * time.Millisecond)
	a.merge(&b)
	a.record(0)
	if a.count() != 4 || a.percentile(50) != time.Millisecond || a.percentile(100) != 3*time.Millisecond {
		t.Errorf("merged: count %d p50 %v p100 %v", a.count(), a.percentile(50), a.percentile(100))
	}
	s := h.summary()
	if s.Count != 1000 || s.P50 != 500 || s.P999 != 999 || s.Max != 1000 {
		t.Errorf("summary %+v", s)
	}
	// A single sample is every percentile.
	var one hist
	one.record(7 * time.Microsecond)
	if one.percentile(50) != 7*time.Microsecond || one.percentile(99.9) != 7*time.Microsecond {
		t.Error("single sample")
	}
}

func runCLI(t *testing.T, env map[string]string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := execute(context.Background(), args, &out, &errb, func(k string) string { return env[k] })
	return out.String(), errb.String(), code
}

func TestFlagValidation(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--endpoints", "x:1", "--workload", "bogus"}, "--workload"},
		{[]string{"--endpoints", "x:1", "--rate", "-5"}, "--rate"},
		{[]string{"--endpoints", "x:1", "--clients", "0"}, "--clients"},
		{[]string{"--endpoints", "x:1", "--duration", "0s"}, "--duration"},
		{[]string{"--endpoints", "x:1", "--via", "carrier-pigeon"}, "--via"},
		{[]string{"--endpoints", "x:1", "-o", "yaml"}, "-o"},
		{[]string{"--endpoints", "x:1", "--queues", "2", "--groups", "4"}, "--queues"},
		{[]string{"--endpoints", "x:1", "--batch", "0"}, "--batch"},
		{[]string{"--endpoints", "x:1", "--prefill", "-1"}, "--prefill"},
		{[]string{"--endpoints", "x:1", "--claim-limit", "0"}, "--claim-limit"},
		{[]string{"--endpoints", "x:1", "--claim-limit", "1001"}, "--claim-limit"},
		{[]string{"--endpoints", "x:1", "--workload", "produce", "--inflight", "0"}, "--inflight"},
		{[]string{"--endpoints", "x:1", "--workload", "produce", "--rate", "100"}, "--rate does not apply"},
		{[]string{"--baseline", "postgres", "--local", "--workload", "produce"}, "--workload produce"},
		{[]string{"--workload", "insert"}, "--endpoints"},
		{[]string{"--endpoints", "x:1", "--local", "3"}, "exclude"},
		{[]string{"--endpoints", "x:1", "extra-arg"}, "unknown command"},
		{[]string{"--endpoints", "x:1", "--profile", "/tmp/p"}, "--profile needs --local"},
	} {
		_, stderr, code := runCLI(t, nil, c.args...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("taskbench %v: exit %d, stderr %q; want an error about %s", c.args, code, stderr, c.want)
		}
	}
	out, _, code := runCLI(t, nil, "--help")
	if code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, w := range workloads {
		if !strings.Contains(out, "--workload "+w) {
			t.Errorf("--help has no example of %s", w)
		}
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP taskstore_shard_apply_seconds ...
# TYPE taskstore_shard_apply_seconds histogram
taskstore_shard_apply_seconds_bucket{shard="1",le="0.001"} 3
taskstore_shard_apply_seconds_sum{shard="1"} 0.5
taskstore_shard_apply_seconds_count{shard="0"} 9
taskstore_shard_apply_seconds_count{shard="1"} 10
taskstore_shard_apply_seconds_count{shard="2"} 5.5e+01
taskstore_shard_commit_index{shard="0"} 100
taskstore_shard_commit_index{shard="1"} 42
taskstore_shard_commit_index{shard="2"} 7
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if m.applies != 65 {
		t.Errorf("applies = %v, want 65 (shard 0, the meta group, left out)", m.applies)
	}
	if len(m.commit) != 2 || m.commit["1"] != 42 || m.commit["2"] != 7 {
		t.Errorf("commit = %v", m.commit)
	}
}

func TestLocalGOMAXPROCS(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "GOMAXPROCS" {
				return v
			}
			return ""
		}
	}
	for _, c := range []struct {
		procs, cpus int
		env, want   string
	}{
		{4, 2, "", "1"},  // 3 nodes and a proxy on 2 cores
		{3, 16, "", "5"}, // the cores shared out, rounded down
		{5, 4, "", "1"},  // never below one
		{4, 2, "2", "2"}, // the environment wins
	} {
		if got := localGOMAXPROCS(c.procs, c.cpus, env(c.env)); got != c.want {
			t.Errorf("localGOMAXPROCS(%d procs, %d cpus, env %q) = %s, want %s", c.procs, c.cpus, c.env, got, c.want)
		}
	}
}

func TestLayout(t *testing.T) {
	l := newLayout(&config{workload: "claim-move", queues: 4, groups: 2, prefix: "p"})
	if len(l.queues) != 8 {
		t.Fatalf("queues %v", l.queues)
	}
	for _, q := range l.queues {
		n := l.next[q]
		if n == "" || l.next[n] != q || strings.Split(n, "/")[0] != strings.Split(q, "/")[0] {
			t.Errorf("stage %s -> %s: want a partner in the same group", q, n)
		}
	}
}

// TestLocalEndToEnd starts a 3-node cluster from the built binaries
// ($TASKSTORE_BIN, as `make test` sets it) and runs two short workloads.
func TestLocalEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	bin := os.Getenv("TASKSTORE_BIN")
	if bin == "" {
		t.Skip("TASKSTORE_BIN not set (make test sets it)")
	}
	if _, err := os.Stat(filepath.Join(bin, "taskstored")); err != nil {
		t.Skipf("no taskstored in %s", bin)
	}
	env := map[string]string{"TASKSTORE_BIN": bin}
	profiles := t.TempDir()
	out, stderr, code := runCLI(t, env, "--local", "3", "--workload", "claim-delete", "--prefill", "200",
		"--clients", "4", "--duration", "2s", "-o", "json", "--profile", profiles)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var r result
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if r.Ops == 0 || r.Tasks == 0 || r.Latency.P50 <= 0 || r.MetricsError != "" || r.LogEntries <= 0 { // entries may be fewer than tasks: the leader coalesces writes, and an empty claim writes none
		t.Errorf("implausible result: %s", out)
	}
	if r.FailedOps > 0 {
		t.Errorf("%d failed ops: %v", r.FailedOps, r.Errors)
	}
	if want := localGOMAXPROCS(3, runtime.GOMAXPROCS(0), func(string) string { return "" }); r.LocalGOMAXPROCS != want {
		t.Errorf("local_gomaxprocs %q, want %q", r.LocalGOMAXPROCS, want)
	}
	checkLocalCosts(t, &r, "n1", "n2", "n3", "bench")
	// --profile: a CPU and an allocation profile of every node, gzipped
	// protobuf as go tool pprof reads them.
	for _, n := range []string{"n1", "n2", "n3"} {
		for _, kind := range []string{"cpu", "allocs"} {
			b, err := os.ReadFile(filepath.Join(profiles, n+"-"+kind+".pprof"))
			if err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
				t.Errorf("%s %s profile: %d bytes, %v", n, kind, len(b), err)
			}
		}
	}

	// Batched claims through a proxy: every claim that found work commits
	// up to --claim-limit tasks in one Modify.
	out, stderr, code = runCLI(t, env, "--local", "3", "--via", "proxy", "--workload", "claim-move", "--claim-limit", "5",
		"--prefill", "200", "--clients", "2", "--duration", "1s", "-o", "json")
	if code != 0 {
		t.Fatalf("claim-move --claim-limit 5: exit %d: %s", code, stderr)
	}
	r = result{}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if full := r.Ops - r.EmptyClaims; r.ClaimLimit != 5 || r.FailedOps != 0 || full == 0 || r.Tasks <= full || r.Tasks > 5*full {
		t.Errorf("claim-move --claim-limit 5: want 1 to 5 tasks per op, more than 1 on average, no failures: %s", out)
	}
	checkLocalCosts(t, &r, "n1", "n2", "n3", "proxy", "bench")
}

// checkLocalCosts checks the cost accounting of a --local run: every
// process named, with CPU read from /proc (getrusage for taskbench), and
// the nodes' bytes written.
func checkLocalCosts(t *testing.T, r *result, names ...string) {
	t.Helper()
	c := r.Costs
	if c == nil {
		t.Fatal("no costs")
	}
	if c.EntriesPerTask == nil || *c.EntriesPerTask < 0.1 || c.CPUMsPerTask == nil || *c.CPUMsPerTask <= 0 || !c.CPUComplete {
		t.Errorf("costs %+v", c)
	}
	if len(c.Processes) != len(names) {
		t.Fatalf("processes %+v, want %v", c.Processes, names)
	}
	for i, p := range c.Processes {
		src := "proc"
		if p.Name == "bench" {
			src = "rusage"
		}
		if p.Name != names[i] || p.CPUSource != src || p.CPUSeconds == nil || *p.CPUSeconds <= 0 ||
			p.CPUPercent == nil || *p.CPUPercent <= 0 || *p.CPUPercent > 100*float64(c.Cores)+10 {
			t.Errorf("process %d: %+v, want %s with CPU from %s", i, p, names[i], src)
		}
		// A node writes its log; /proc/<pid>/io of our own children is
		// readable.
		if strings.HasPrefix(p.Name, "n") && (p.WriteBytes == nil || *p.WriteBytes <= 0) {
			t.Errorf("%s: no bytes written", p.Name)
		}
		// taskstore_log_syncs_total, where the nodes export it.
		if p.SyncsPerTask != nil && *p.SyncsPerTask <= 0 {
			t.Errorf("%s: %v syncs per task", p.Name, *p.SyncsPerTask)
		}
	}
}
