package main

// Cost accounting: what every task cost, over the measured interval only
// (not the prefill): log entries, fsyncs (per node and in all), CPU time
// per process, bytes written. Absolute rates on a shared machine move by
// 2x from run to run; per-task costs and ratios move much less.
// docs/performance.md, "Cost columns", says how each figure is measured.

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// meteredProc is a process whose CPU time and bytes written taskbench reads
// from /proc: the processes of a --local cluster, a --local PostgreSQL.
type meteredProc struct {
	name string // n1, n2, ..., proxy, postgres
	pid  int
	tree bool // with every descendant (PostgreSQL's backends and workers)
}

// costMeter samples the metered processes, and taskbench itself, at the
// start and the end of the measured interval.
type costMeter struct {
	proc          string // /proc
	procs         []meteredProc
	before, after []procSample
	selfBefore    float64
	selfAfter     float64
	selfOK        bool
	start         time.Time
	elapsed       time.Duration
}

// startCosts takes the first sample; call it right before measuring.
func startCosts(procs []meteredProc) *costMeter {
	m := &costMeter{proc: "/proc", procs: procs}
	m.before = m.sample()
	m.selfBefore, m.selfOK = selfCPU()
	m.start = time.Now()
	return m
}

// stop takes the second sample; call it right after measuring.
func (m *costMeter) stop() {
	m.elapsed = time.Since(m.start)
	var ok bool
	m.selfAfter, ok = selfCPU()
	m.selfOK = m.selfOK && ok
	m.after = m.sample()
}

func (m *costMeter) sample() []procSample {
	out := make([]procSample, len(m.procs))
	for i, p := range m.procs {
		out[i] = sampleProc(m.proc, p.pid, p.tree)
	}
	return out
}

// costs is the cost accounting of a run; -o json prints it as "costs".
// A null figure could not be measured (the text report prints "-").
type costs struct {
	// Log entries per task: Raft entries the shard leaders appended (the
	// result's log_entries); for PostgreSQL, committed transactions.
	EntriesPerTask *float64 `json:"entries_per_task"`
	// Requests per entry: commands the shard leaders proposed over the
	// log entries that carried them (taskstore_shard_proposed_*_total);
	// above 1 when writes queued behind an entry in flight share the next.
	// Unknown for PostgreSQL and for builds without the counters.
	RequestsPerEntry *float64 `json:"requests_per_entry"`
	// Messages per request: gRPC messages the nodes and the proxy received
	// (grpc_server_msg_received_total) per request taskbench sent; a
	// unary call through a proxy is 2 (proxy, leader). Peers' gossip and
	// status calls count too; Raft's own traffic is not gRPC.
	MsgsPerRequest *float64 `json:"msgs_per_request"`
	// fsync+fdatasync calls per task of all nodes together
	// (taskstore_log_syncs_total); for PostgreSQL, WAL fsyncs
	// (pg_stat_wal.wal_sync).
	SyncsPerTask *float64 `json:"syncs_per_task"`
	// Entries written per sync: taskstore_log_append_entries _sum over
	// _count, all nodes; for PostgreSQL, transactions per WAL fsync.
	EntriesPerSync *float64 `json:"entries_per_sync"`
	// Log bytes per task: taskstore_log_bytes_written_total of all nodes;
	// for PostgreSQL, pg_stat_wal.wal_bytes.
	LogBytesPerTask *float64 `json:"log_bytes_per_task"`
	// CPU milliseconds per task of every process below; a lower bound
	// when CPUComplete is false (some process's CPU could not be read).
	CPUMsPerTask *float64 `json:"cpu_ms_per_task"`
	CPUComplete  bool     `json:"cpu_complete"`
	// Bytes written to storage per task (/proc/<pid>/io write_bytes) of
	// the server processes (not taskbench), when all could be read.
	WriteBytesPerTask *float64 `json:"write_bytes_per_task"`
	// Interval is the seconds between the two samples; Cores is the CPUs
	// taskbench may use (a CPU% of 100 is one core).
	Interval  float64    `json:"interval_s"`
	Cores     int        `json:"cores"`
	Processes []procCost `json:"processes"`
}

// procCost is one process's share: a node, the proxy, PostgreSQL (its
// whole process tree) or taskbench itself ("bench").
type procCost struct {
	Name string `json:"name"`
	PID  int    `json:"pid,omitempty"`
	// Where the CPU time came from: "proc" (/proc/<pid>/stat), "rusage"
	// (taskbench's getrusage), "metrics" (process_cpu_seconds_total of a
	// node's /metrics, when its pid is unknown: a remote cluster).
	CPUSource    string   `json:"cpu_source,omitempty"`
	CPUSeconds   *float64 `json:"cpu_s"`
	CPUPercent   *float64 `json:"cpu_percent"` // of one core
	CPUMsPerTask *float64 `json:"cpu_ms_per_task"`
	// Nodes only.
	Syncs             *float64 `json:"syncs,omitempty"`
	SyncsPerTask      *float64 `json:"syncs_per_task,omitempty"`
	EntriesPerSync    *float64 `json:"entries_per_sync,omitempty"`
	LogBytesPerTask   *float64 `json:"log_bytes_per_task,omitempty"`
	WriteBytes        *float64 `json:"write_bytes"`
	WriteBytesPerTask *float64 `json:"write_bytes_per_task"`
	server            bool     // not taskbench: counts in WriteBytesPerTask
}

func ptr(v float64) *float64 { return &v }

// per is v/tasks rounded, or nil when either is unknown or tasks is 0.
func per(v *float64, tasks int64, digits int) *float64 {
	if v == nil || tasks <= 0 {
		return nil
	}
	return ptr(round(*v/float64(tasks), digits))
}

// ratio is a/b rounded, or nil.
func ratio(a, b *float64, digits int) *float64 {
	if a == nil || b == nil || *b == 0 {
		return nil
	}
	return ptr(round(*a / *b, digits))
}

// costInputs is everything the accounting is computed from.
type costInputs struct {
	tasks int64
	rpcs  int64 // requests taskbench sent
	// proxy: the proxy's /metrics was read before and after (bProxy,
	// aProxy) or must be (wantProxy).
	wantProxy      bool
	bProxy, aProxy *nodeCounters
	// entries and syncs of the whole system when known otherwise than
	// from the nodes (the Raft entries of the result; PostgreSQL's).
	entries, syncs, entriesPerSync, logBytes *float64
	// The nodes' /metrics before and after (nil: not scraped).
	before, after *logCounters
	// Nodes whose pid is unknown, by id, listed (with "-") even when
	// their /metrics could not be read: a remote cluster's proxy.
	unknown []string
	meter   *costMeter
}

// computeCosts turns the samples and scrapes into per-task figures.
func computeCosts(in costInputs) *costs {
	c := &costs{Cores: runtime.GOMAXPROCS(0), CPUComplete: true}
	m := in.meter
	secs := m.elapsed.Seconds()
	c.Interval = round(secs, 3)
	tasks := in.tasks
	cpu := func(p *procCost, s *float64, source string) {
		if s == nil || secs <= 0 {
			c.CPUComplete = false
			return
		}
		p.CPUSource = source
		p.CPUSeconds = ptr(round(*s, 3))
		p.CPUPercent = ptr(round(100**s/secs, 1))
		p.CPUMsPerTask = per(ptr(1000**s), tasks, 3)
	}
	for i, mp := range m.procs {
		p := procCost{Name: mp.name, PID: mp.pid, server: true}
		b, a := m.before[i], m.after[i]
		var s *float64
		if b.cpuOK && a.cpuOK {
			s = ptr(a.cpu - b.cpu)
		}
		cpu(&p, s, "proc")
		if b.writeOK && a.writeOK {
			p.WriteBytes = ptr(a.writeBytes - b.writeBytes)
			p.WriteBytesPerTask = per(p.WriteBytes, tasks, 0)
		}
		c.Processes = append(c.Processes, p)
	}
	// find returns the process named name, adding it (nothing known yet)
	// if it is not listed.
	find := func(name string) *procCost {
		i := slices.IndexFunc(c.Processes, func(p procCost) bool { return p.Name == name })
		if i < 0 {
			c.Processes = append(c.Processes, procCost{Name: name, server: true})
			i = len(c.Processes) - 1
		}
		return &c.Processes[i]
	}

	// The nodes' own counters, and their CPU from /metrics when the pid
	// is not known.
	var syncs, appended, batches, logBytes *float64
	if in.before != nil && in.after != nil {
		ids := make([]string, 0, len(in.after.nodes))
		for id := range in.after.nodes {
			if _, ok := in.before.nodes[id]; ok {
				ids = append(ids, id)
			}
		}
		slices.SortFunc(ids, nodeOrder)
		allSyncs, allAppend, allBytes := len(ids) > 0, len(ids) > 0, len(ids) > 0
		allProposed, allMsgs := len(ids) > 0, len(ids) > 0
		var sy, ap, ba, lb, preq, pent, msgs float64
		for _, id := range ids {
			b, a := in.before.nodes[id], in.after.nodes[id]
			if b.hasProposed && a.hasProposed {
				preq += a.proposedRequests - b.proposedRequests
				pent += a.proposedEntries - b.proposedEntries
			} else {
				allProposed = false
			}
			if b.hasGRPCMsgs && a.hasGRPCMsgs {
				msgs += a.grpcMsgs - b.grpcMsgs
			} else {
				allMsgs = false
			}
			p := find(id)
			if p.CPUSource == "" {
				var s *float64
				if b.hasCPU && a.hasCPU {
					s = ptr(a.cpuSeconds - b.cpuSeconds)
				}
				if p.PID == 0 {
					cpu(p, s, "metrics")
				}
			}
			if b.hasSyncs && a.hasSyncs {
				d := a.syncs - b.syncs
				sy += d
				p.Syncs = ptr(d)
				p.SyncsPerTask = per(&d, tasks, 3)
			} else {
				allSyncs = false
			}
			if b.hasAppend && a.hasAppend {
				e, n := a.appendEntries-b.appendEntries, a.appendBatches-b.appendBatches
				ap += e
				ba += n
				p.EntriesPerSync = ratio(&e, &n, 2)
			} else {
				allAppend = false
			}
			if b.hasLogBytes && a.hasLogBytes {
				d := a.logBytes - b.logBytes
				lb += d
				p.LogBytesPerTask = per(&d, tasks, 0)
			} else {
				allBytes = false
			}
		}
		if allSyncs {
			syncs = &sy
		}
		if allAppend {
			appended, batches = &ap, &ba
		}
		if allBytes {
			logBytes = &lb
		}
		if allProposed {
			c.RequestsPerEntry = ratio(&preq, &pent, 2)
		}
		if in.wantProxy {
			if b, a := in.bProxy, in.aProxy; b != nil && a != nil && b.hasGRPCMsgs && a.hasGRPCMsgs {
				msgs += a.grpcMsgs - b.grpcMsgs
			} else {
				allMsgs = false
			}
		}
		if allMsgs && in.rpcs > 0 {
			c.MsgsPerRequest = per(&msgs, in.rpcs, 2)
		}
	}
	for _, name := range in.unknown {
		if p := find(name); p.CPUSeconds == nil && p.CPUSource == "" {
			c.CPUComplete = false
		}
	}
	self := procCost{Name: "bench", PID: os.Getpid()}
	var s *float64
	if m.selfOK {
		s = ptr(m.selfAfter - m.selfBefore)
	}
	cpu(&self, s, "rusage")
	c.Processes = append(c.Processes, self)

	// Totals.
	entries := in.entries
	c.EntriesPerTask = per(entries, tasks, 3)
	if in.syncs != nil {
		syncs = in.syncs
	}
	c.SyncsPerTask = per(syncs, tasks, 3)
	if in.entriesPerSync != nil {
		c.EntriesPerSync = in.entriesPerSync
	} else {
		c.EntriesPerSync = ratio(appended, batches, 2)
	}
	if in.logBytes != nil {
		logBytes = in.logBytes
	}
	c.LogBytesPerTask = per(logBytes, tasks, 0)
	var cpuSum, wb float64
	wbOK, servers := true, 0
	for _, p := range c.Processes {
		if p.CPUSeconds != nil {
			cpuSum += *p.CPUSeconds
		}
		if p.server {
			servers++
			if p.WriteBytes == nil {
				wbOK = false
			} else {
				wb += *p.WriteBytes
			}
		}
	}
	c.CPUMsPerTask = per(ptr(1000*cpuSum), tasks, 3)
	if wbOK && servers > 0 {
		c.WriteBytesPerTask = per(&wb, tasks, 0)
	}
	return c
}

// nodeOrder sorts n2 before n10.
func nodeOrder(a, b string) int {
	ta, na := splitNum(a)
	tb, nb := splitNum(b)
	if ta != tb {
		return strings.Compare(ta, tb)
	}
	return na - nb
}

func splitNum(s string) (string, int) {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	n, _ := strconv.Atoi(s[i:])
	return s[:i], n
}

// fmtNum prints a per-task figure with about three significant digits,
// "-" when unknown.
func fmtNum(v *float64) string {
	if v == nil {
		return "-"
	}
	switch a := *v; {
	case a >= 100 || a <= -100:
		return fmt.Sprintf("%.0f", a)
	case a >= 10 || a <= -10:
		return fmt.Sprintf("%.1f", a)
	default:
		return fmt.Sprintf("%.2f", a)
	}
}

// fmtBytes prints a byte count per task, "-" when unknown.
func fmtBytes(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f", *v)
}

// fmtCPUPerTask is the total CPU per task, "≥" when a process is missing.
func (c *costs) fmtCPUPerTask() string {
	s := fmtNum(c.CPUMsPerTask)
	if c.CPUMsPerTask != nil && !c.CPUComplete {
		s = "≥" + s
	}
	return s
}

// printCosts writes the "costs" block of the text report: per task, with
// each process's share in parentheses. postgres names PostgreSQL's units.
func printCosts(w io.Writer, c *costs, postgres bool) {
	if c == nil {
		return
	}
	entries, syncs, logb := "entries/task", "syncs/task", "log-bytes/task"
	if postgres {
		entries, syncs, logb = "xacts/task", "wal-fsyncs/task", "wal-bytes/task"
	}
	nodeOnly := func(get func(p *procCost) *float64) string {
		var parts []string
		any := false
		for i := range c.Processes {
			p := &c.Processes[i]
			if !p.server || p.Name == "proxy" || p.Name == "postgres" {
				continue
			}
			v := get(p)
			any = any || v != nil
			parts = append(parts, p.Name+" "+fmtNum(v))
		}
		if !any {
			return ""
		}
		return " (" + strings.Join(parts, " ") + ")"
	}
	shared := "" // how many requests shared an entry, a message: Taskstore only
	if !postgres {
		shared = fmt.Sprintf("  requests/entry %s  msgs/request %s", fmtNum(c.RequestsPerEntry), fmtNum(c.MsgsPerRequest))
	}
	fmt.Fprintf(w, "costs    %s %s%s  %s %s%s  entries/sync %s  %s %s%s\n",
		entries, fmtNum(c.EntriesPerTask), shared,
		syncs, fmtNum(c.SyncsPerTask), nodeOnly(func(p *procCost) *float64 { return p.SyncsPerTask }),
		fmtNum(c.EntriesPerSync),
		logb, fmtBytes(c.LogBytesPerTask), nodeOnly(func(p *procCost) *float64 { return p.LogBytesPerTask }))
	var ms, pct []string
	for _, p := range c.Processes {
		ms = append(ms, p.Name+" "+fmtNum(p.CPUMsPerTask))
		v := "-"
		if p.CPUPercent != nil {
			v = fmt.Sprintf("%.0f", *p.CPUPercent)
		}
		pct = append(pct, p.Name+" "+v)
	}
	fmt.Fprintf(w, "         cpu-ms/task %s (%s)\n", c.fmtCPUPerTask(), strings.Join(ms, " "))
	fmt.Fprintf(w, "         cpu%% %s (of one core; %d cores, %.1fs)\n", strings.Join(pct, " "), c.Cores, c.Interval)
	var wb []string
	for _, p := range c.Processes {
		if p.server {
			wb = append(wb, p.Name+" "+fmtBytes(p.WriteBytesPerTask))
		}
	}
	line := "         bytes-written/task " + fmtBytes(c.WriteBytesPerTask)
	if len(wb) > 0 {
		line += " (" + strings.Join(wb, " ") + ")"
	}
	fmt.Fprintln(w, line)
}

// localMetered lists the processes of a local cluster.
func (lc *localCluster) metered() []meteredProc {
	if lc == nil {
		return nil
	}
	out := make([]meteredProc, 0, len(lc.procs))
	for i, p := range lc.procs {
		out = append(out, meteredProc{name: lc.names[i], pid: p.Process.Pid})
	}
	return out
}

// postmasterPID reads the postmaster's pid from the first line of
// postmaster.pid in the data directory.
func postmasterPID(data string) (int, error) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("postmaster.pid: first line %q is not a pid", line)
	}
	return pid, nil
}

// metered is the local PostgreSQL server: the postmaster and all its
// children, or nothing when its pid cannot be read.
func (s *pgServer) metered() []meteredProc {
	if s == nil {
		return nil
	}
	pid, err := postmasterPID(s.data)
	if err != nil {
		pid = -1 // unreadable: "-" in the report
	}
	return []meteredProc{{name: "postgres", pid: pid, tree: true}}
}

// setClusterCosts fills r.Costs for a Taskstore run from the samples and
// the nodes' /metrics before and after (scrapeErr: either scrape failed).
func (r *result) setClusterCosts(cfg *config, m *costMeter, before, after logCounters, scrapeErr error) {
	in := costInputs{tasks: r.Tasks, rpcs: r.RPCs, meter: m}
	if scrapeErr == nil {
		in.entries = ptr(r.LogEntries)
		in.before, in.after = &before, &after
		in.wantProxy = cfg.via == "proxy"
		in.bProxy, in.aProxy = before.proxy, after.proxy
	} else if cfg.local == 0 {
		in.unknown = append(in.unknown, "nodes")
	}
	if cfg.local == 0 && cfg.via == "proxy" {
		in.unknown = append(in.unknown, "proxy")
	}
	r.Costs = computeCosts(in)
}

// setPGCosts fills r.Costs for a PostgreSQL run: its "entries" are the
// committed transactions, its syncs the WAL fsyncs, its log bytes the WAL
// bytes (countersOK: pg_stat_wal and pg_stat_database were read).
func (r *result) setPGCosts(m *costMeter, countersOK bool, walBefore, walAfter *float64) {
	in := costInputs{tasks: r.Tasks, meter: m}
	if countersOK {
		in.entries, in.syncs = ptr(r.PGCommits), ptr(r.LogEntries)
		in.entriesPerSync = ratio(in.entries, in.syncs, 2)
	}
	if walBefore != nil && walAfter != nil {
		in.logBytes = ptr(*walAfter - *walBefore)
	}
	if len(m.procs) == 0 {
		in.unknown = []string{"postgres"} // --pg-dsn: not ours to read
	}
	r.Costs = computeCosts(in)
}

// walBytes is pg_stat_wal.wal_bytes (PostgreSQL 14+), or nil. Read right
// after counters, which has the backends flush their statistics.
func (s *pgStore) walBytes(ctx context.Context) *float64 {
	var v float64
	if err := s.pool.QueryRow(ctx, `SELECT wal_bytes::float8 FROM pg_stat_wal`).Scan(&v); err != nil {
		return nil
	}
	return &v
}
