package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// A command name with spaces and parentheses; utime 1234, stime 56,
	// cutime 7, cstime 8 (fields 14 to 17), ppid 42.
	line := "4711 (my (odd) name) S 42 4711 4711 0 -1 4194560 100 0 0 0 1234 56 7 8 20 0 3 0 12345 1000000 200 18446744073709551615\n"
	s, err := parseProcStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if s.ppid != 42 || s.utime != 1234 || s.stime != 56 || s.cutime != 7 || s.cstime != 8 || s.ticks() != 1305 {
		t.Errorf("parsed %+v", s)
	}
	for _, bad := range []string{
		"4711 no parens S 42",
		"4711 (x) S 42 1 1 0 -1 0 0 0 0 0 12",            // too short
		"4711 (x) S 42 1 1 0 -1 0 0 0 0 0 x 56 7 8 20 0", // utime not a number
		"4711 (x) S 42 1 1 0 -1 0 0 0 0 0 1 56 -7 8 20",  // negative cutime
	} {
		if _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("parseProcStat(%q): want an error", bad)
		}
	}
}

func TestParseProcIO(t *testing.T) {
	text := "rchar: 100\nwchar: 200\nsyscr: 3\nsyscw: 4\nread_bytes: 4096\nwrite_bytes: 819200\ncancelled_write_bytes: 4096\n"
	v, err := parseProcIO([]byte(text))
	if err != nil || v != 819200 {
		t.Errorf("write_bytes = %d, %v; want 819200", v, err)
	}
	if _, err := parseProcIO([]byte("rchar: 1\ncancelled_write_bytes: 5\n")); err == nil {
		t.Error("no write_bytes: want an error")
	}
}

func TestAuxv(t *testing.T) {
	w := strconv.IntSize / 8
	var b []byte
	put := func(vs ...uint64) {
		for _, v := range vs {
			x := make([]byte, w)
			if w == 4 {
				binary.NativeEndian.PutUint32(x, uint32(v))
			} else {
				binary.NativeEndian.PutUint64(x, v)
			}
			b = append(b, x...)
		}
	}
	put(6, 4096, atClkTck, 250, 0, 0, atClkTck, 999)
	if v, ok := auxvValue(b, atClkTck); !ok || v != 250 {
		t.Errorf("AT_CLKTCK = %d, %v; want 250 (and nothing after AT_NULL)", v, ok)
	}
	if _, ok := auxvValue(b[:2*w], atClkTck); ok {
		t.Error("found a key that is not there")
	}
	// This machine's tick, as libc's sysconf sees it.
	if out, err := exec.Command("getconf", "CLK_TCK").Output(); err == nil {
		want, _ := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
		if clkTck() != want {
			t.Errorf("clkTck() = %v, getconf CLK_TCK = %v", clkTck(), want)
		}
	}
}

// fakeProc writes a /proc with the given processes: pid -> ppid, ticks,
// write_bytes (-1: no io file, as when it is unreadable).
func fakeProc(t *testing.T, procs map[int][3]int) string {
	dir := t.TempDir()
	for pid, p := range procs {
		d := filepath.Join(dir, strconv.Itoa(pid))
		os.MkdirAll(d, 0o755)
		// utime p[1], stime 2*p[1], cutime 1, cstime 0.
		stat := fmt.Sprintf("%d (proc %d) S %d 1 1 0 -1 0 0 0 0 0 %d %d 1 0 20 0 1 0 1 1 1\n", pid, pid, p[0], p[1], 2*p[1])
		os.WriteFile(filepath.Join(d, "stat"), []byte(stat), 0o644)
		if p[2] >= 0 {
			os.WriteFile(filepath.Join(d, "io"), fmt.Appendf(nil, "rchar: 1\nwrite_bytes: %d\n", p[2]), 0o644)
		}
	}
	os.MkdirAll(filepath.Join(dir, "self"), 0o755) // not a pid
	return dir
}

func TestProcTree(t *testing.T) {
	proc := fakeProc(t, map[int][3]int{
		1:  {0, 1000, 0},
		10: {1, 100, 4096},  // the postmaster
		11: {10, 10, 8192},  // a backend
		12: {11, 1, -1},     // a grandchild without io
		13: {10, 5, 0},      // another child
		20: {1, 7777, 9999}, // not ours
	})
	got := procTree(proc, 10)
	if len(got) != 4 || got[0] != 10 {
		t.Errorf("tree of 10 = %v, want 10, 11, 12, 13", got)
	}
	s := sampleProc(proc, 10, true)
	// (3*100+1) + (3*10+1) + (3*1+1) + (3*5+1) ticks.
	if want := 352 / clkTck(); !s.cpuOK || s.cpu != want {
		t.Errorf("tree cpu = %v (ok %v), want %v", s.cpu, s.cpuOK, want)
	}
	if !s.writeOK || s.writeBytes != 4096+8192 {
		t.Errorf("tree write bytes = %v (ok %v), want 12288", s.writeBytes, s.writeOK)
	}
	if s := sampleProc(proc, 10, false); s.cpu != 301/clkTck() || s.writeBytes != 4096 {
		t.Errorf("process alone: %+v", s)
	}
	if s := sampleProc(proc, 12, false); !s.cpuOK || s.writeOK {
		t.Errorf("no io file: %+v, want cpu only", s)
	}
	if s := sampleProc(proc, 99, true); s.cpuOK || s.writeOK {
		t.Errorf("missing process: %+v, want nothing", s)
	}
}

// TestSampleSelf reads this very process's /proc entry around a busy loop.
func TestSampleSelf(t *testing.T) {
	b := sampleProc("/proc", os.Getpid(), false)
	self0, ok := selfCPU()
	if !b.cpuOK || !ok {
		t.Fatalf("cannot read our own CPU time: %+v %v", b, ok)
	}
	// Spin until getrusage says we used 0.3 s of CPU (not 0.3 s of wall
	// time: on a loaded machine a wall-clock loop may get a tenth of that),
	// then /proc must say about the same.
	x := 0
	self1 := self0
	for deadline := time.Now().Add(2 * time.Minute); self1-self0 < 0.3 && time.Now().Before(deadline); {
		for range 1 << 20 {
			x++
		}
		self1, _ = selfCPU()
	}
	a := sampleProc("/proc", os.Getpid(), false)
	if d := self1 - self0; d < 0.3 || d > 10 {
		t.Fatalf("getrusage: %.3fs of CPU after spinning for 0.3s of it (%d)", d, x)
	}
	// /proc counts in clock ticks (10 ms) and was read after getrusage.
	if d := a.cpu - b.cpu; d < 0.25 || d > 10 {
		t.Errorf("/proc: %.3fs of CPU where getrusage counted %.3fs", d, self1-self0)
	}
}

func TestScrapeNodeCostMetrics(t *testing.T) {
	text := `# TYPE taskstore_log_syncs_total counter
taskstore_log_syncs_total 1500
# TYPE taskstore_log_append_entries histogram
taskstore_log_append_entries_bucket{le="1"} 10
taskstore_log_append_entries_bucket{le="+Inf"} 500
taskstore_log_append_entries_sum 2050
taskstore_log_append_entries_count 500
taskstore_log_bytes_written_total 1.2e+06
process_cpu_seconds_total 12.5
taskstore_shard_apply_seconds_count{shard="1"} 10
taskstore_shard_commit_index{shard="1"} 42
taskstore_shard_proposed_requests_total{shard="0"} 7
taskstore_shard_proposed_requests_total{shard="1"} 40
taskstore_shard_proposed_entries_total{shard="1"} 10
grpc_server_msg_received_total{grpc_method="Modify",grpc_service="taskstore.v1.TaskStore",grpc_type="unary"} 30
grpc_server_msg_received_total{grpc_method="Claim",grpc_service="taskstore.v1.TaskStore",grpc_type="unary"} 12
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, text)
	}))
	defer srv.Close()
	m, err := scrapeNode(t.Context(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if !m.hasSyncs || m.syncs != 1500 || !m.hasAppend || m.appendEntries != 2050 || m.appendBatches != 500 ||
		!m.hasLogBytes || m.logBytes != 1.2e6 || !m.hasCPU || m.cpuSeconds != 12.5 || m.applies != 10 || m.commit["1"] != 42 ||
		!m.hasProposed || m.proposedRequests != 40 || m.proposedEntries != 10 || !m.hasGRPCMsgs || m.grpcMsgs != 42 {
		t.Errorf("scraped %+v", m)
	}
	// An older node: none of them, and no error.
	old, err := parseMetrics(strings.NewReader("taskstore_shard_apply_seconds_count{shard=\"1\"} 3\n"))
	if err != nil || old.hasSyncs || old.hasAppend || old.hasLogBytes || old.hasCPU || old.applies != 3 {
		t.Errorf("older node: %+v, %v", old, err)
	}
}

// nodesScrape is logCounters of nodes n1..n3 with syncs, appended entries
// and batches, log bytes and CPU seconds each; nil leaves the node's cost
// counters out (an older build).
func nodesScrape(vals ...[]float64) logCounters {
	lc := logCounters{nodes: map[string]nodeCounters{}}
	for i, v := range vals {
		id := fmt.Sprintf("n%d", i+1)
		if v == nil {
			lc.nodes[id] = nodeCounters{}
			continue
		}
		lc.nodes[id] = nodeCounters{syncs: v[0], hasSyncs: true, appendEntries: v[1], appendBatches: v[2], hasAppend: true,
			logBytes: v[3], hasLogBytes: true, cpuSeconds: v[4], hasCPU: true}
	}
	return lc
}

func TestComputeCosts(t *testing.T) {
	// A local cluster: n1..n3 and a proxy with known pids, 1000 tasks in
	// 2 s, 1020 log entries.
	m := &costMeter{elapsed: 2 * time.Second, selfOK: true, selfBefore: 1, selfAfter: 1.3,
		procs:  []meteredProc{{"n1", 101, false}, {"n2", 102, false}, {"n3", 103, false}, {"proxy", 104, false}},
		before: []procSample{{1, true, 1000, true}, {2, true, 0, true}, {3, true, 0, false}, {4, true, 0, true}},
		after:  []procSample{{1.5, true, 301000, true}, {2.4, true, 250000, true}, {3.4, true, 0, false}, {4.3, true, 0, true}},
	}
	before := nodesScrape([]float64{100, 400, 100, 1e6, 50}, []float64{0, 0, 0, 0, 0}, []float64{0, 0, 0, 0, 0})
	after := nodesScrape([]float64{380, 1600, 380, 1.4e6, 99}, []float64{280, 1130, 280, 3e5, 99}, []float64{280, 1170, 280, 3e5, 99})
	c := computeCosts(costInputs{tasks: 1000, entries: ptr(1020), before: &before, after: &after, meter: m})
	check := func(name string, got *float64, want float64) {
		t.Helper()
		if got == nil || *got != want {
			g := "nil"
			if got != nil {
				g = fmt.Sprint(*got)
			}
			t.Errorf("%s = %s, want %v", name, g, want)
		}
	}
	check("entries/task", c.EntriesPerTask, 1.02)
	check("syncs/task", c.SyncsPerTask, 0.84)
	check("entries/sync", c.EntriesPerSync, round(3500.0/840, 2))
	check("log bytes/task", c.LogBytesPerTask, 1000)
	// n1 0.5 s, n2 0.4, n3 0.4, proxy 0.3, bench 0.3: 1.9 s.
	check("cpu-ms/task", c.CPUMsPerTask, 1.9)
	if !c.CPUComplete || c.Interval != 2 {
		t.Errorf("complete %v interval %v", c.CPUComplete, c.Interval)
	}
	if c.WriteBytesPerTask != nil {
		t.Errorf("bytes written/task %v: want unknown, n3's io was unreadable", *c.WriteBytesPerTask)
	}
	names := []string{}
	for _, p := range c.Processes {
		names = append(names, p.Name)
	}
	if strings.Join(names, " ") != "n1 n2 n3 proxy bench" {
		t.Fatalf("processes %v", names)
	}
	n1 := c.Processes[0]
	check("n1 cpu%", n1.CPUPercent, 25)
	check("n1 cpu-ms/task", n1.CPUMsPerTask, 0.5)
	check("n1 syncs/task", n1.SyncsPerTask, 0.28)
	check("n1 entries/sync", n1.EntriesPerSync, round(1200.0/280, 2))
	check("n1 bytes/task", n1.WriteBytesPerTask, 300)
	if n1.CPUSource != "proc" || c.Processes[4].CPUSource != "rusage" {
		t.Errorf("cpu sources %q %q", n1.CPUSource, c.Processes[4].CPUSource)
	}

	var out bytes.Buffer
	printCosts(&out, c, false)
	for _, want := range []string{
		"costs    entries/task 1.02  requests/entry -  msgs/request -  syncs/task 0.84 (n1 0.28 n2 0.28 n3 0.28)  entries/sync 4.17  log-bytes/task 1000 (n1 400 n2 300 n3 300)\n",
		"cpu-ms/task 1.90 (n1 0.50 n2 0.40 n3 0.40 proxy 0.30 bench 0.30)\n",
		"cpu% n1 25 n2 20 n3 20 proxy 15 bench 15 (of one core;",
		"bytes-written/task - (n1 300 n2 250 n3 - proxy 0)\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("costs block lacks %q:\n%s", want, out.String())
		}
	}

	// Nodes that count proposals and gRPC messages, and a proxy: 1100
	// commands in 275 entries; 2000 messages for 1000 requests.
	for id, n := range after.nodes {
		n.proposedRequests, n.proposedEntries, n.hasProposed = 1100.0/3, 275.0/3, true
		n.grpcMsgs, n.hasGRPCMsgs = 1000.0/3, true
		after.nodes[id] = n
		b := before.nodes[id]
		b.hasProposed, b.hasGRPCMsgs = true, true
		before.nodes[id] = b
	}
	c = computeCosts(costInputs{tasks: 1000, rpcs: 1000, entries: ptr(1020), before: &before, after: &after, meter: m, wantProxy: true,
		bProxy: &nodeCounters{grpcMsgs: 10, hasGRPCMsgs: true}, aProxy: &nodeCounters{grpcMsgs: 1010, hasGRPCMsgs: true}})
	check("requests/entry", c.RequestsPerEntry, 4)
	check("msgs/request", c.MsgsPerRequest, 2)
	out.Reset()
	printCosts(&out, c, false)
	if !strings.Contains(out.String(), "costs    entries/task 1.02  requests/entry 4.00  msgs/request 2.00  syncs/task") {
		t.Errorf("with proposal and message counts:\n%s", out.String())
	}
	// Through a proxy whose messages are unknown: no total.
	c = computeCosts(costInputs{tasks: 1000, rpcs: 1000, entries: ptr(1020), before: &before, after: &after, meter: m, wantProxy: true})
	if c.MsgsPerRequest != nil {
		t.Errorf("msgs/request %v without the proxy's count", *c.MsgsPerRequest)
	}

	// One node of an older build: no cluster-wide syncs (a partial sum
	// would read as a cost), the others' own figures still shown.
	after2 := nodesScrape([]float64{380, 1600, 380, 1.4e6, 99}, nil, []float64{280, 1170, 280, 3e5, 99})
	c = computeCosts(costInputs{tasks: 1000, entries: ptr(1020), before: &before, after: &after2, meter: m})
	if c.SyncsPerTask != nil || c.EntriesPerSync != nil || c.LogBytesPerTask != nil || c.Processes[0].SyncsPerTask == nil || c.Processes[1].SyncsPerTask != nil {
		t.Errorf("older n2: %+v", c)
	}
	out.Reset()
	printCosts(&out, c, false)
	if !strings.Contains(out.String(), "syncs/task - (n1 0.28 n2 - n3 0.28)  entries/sync -  log-bytes/task -") {
		t.Errorf("older n2:\n%s", out.String())
	}

	// A remote cluster via a proxy: nodes' CPU from their /metrics, the
	// proxy's unknown, so the total is a lower bound.
	remote := &costMeter{elapsed: 2 * time.Second, selfOK: true, selfBefore: 1, selfAfter: 1.3}
	c = computeCosts(costInputs{tasks: 1000, entries: ptr(1020), before: &before, after: &after, unknown: []string{"proxy"}, meter: remote})
	check("remote cpu-ms/task", c.CPUMsPerTask, 49+99+99+0.3)
	if c.CPUComplete || c.Processes[0].CPUSource != "metrics" || c.Processes[3].Name != "proxy" || c.Processes[3].CPUSeconds != nil {
		t.Errorf("remote: %+v", c)
	}
	out.Reset()
	printCosts(&out, c, false)
	if !strings.Contains(out.String(), "cpu-ms/task ≥247 (n1 49.0 n2 99.0 n3 99.0 proxy - bench 0.30)") ||
		!strings.Contains(out.String(), "cpu% n1 2450 n2 4950 n3 4950 proxy - bench 15") {
		t.Errorf("remote:\n%s", out.String())
	}

	// No tasks: no per-task figures, and no division by zero.
	c = computeCosts(costInputs{tasks: 0, entries: ptr(3), before: &before, after: &after, meter: m})
	if c.EntriesPerTask != nil || c.CPUMsPerTask != nil || c.SyncsPerTask != nil || c.Processes[0].CPUPercent == nil {
		t.Errorf("no tasks: %+v", c)
	}
}

func TestPostmasterPID(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte("12345\n/var/lib/x\n1700000000\n5432\n"), 0o600)
	if pid, err := postmasterPID(dir); err != nil || pid != 12345 {
		t.Errorf("pid %d, %v", pid, err)
	}
	os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte("garbage\n"), 0o600)
	if _, err := postmasterPID(dir); err == nil {
		t.Error("garbage: want an error")
	}
	if p := (&pgServer{data: t.TempDir()}).metered(); len(p) != 1 || p[0].pid != -1 || !p[0].tree {
		t.Errorf("no postmaster.pid: %+v, want postgres with an unknown pid", p)
	}
}
