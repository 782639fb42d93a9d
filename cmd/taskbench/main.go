// Command taskbench drives a Taskstore cluster with a configurable workload
// and reports throughput, latency percentiles, errors by gRPC code, and how
// many tasks each Raft log entry carried, and what each task cost (entries,
// fdatasyncs, CPU, bytes written).
//
// It talks to a running cluster (--endpoints) directly or through proxies
// (--via proxy), or starts a local one itself (--local 3) from the
// taskstored and taskproxy binaries next to it. docs/performance.md has the
// method and the numbers.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/e1158ecb/taskstore/api/limits"
	"github.com/e1158ecb/taskstore/cmd/internal/buildinfo"
	"github.com/e1158ecb/taskstore/internal/tracing"
)

var workloads = []string{"insert", "insert-batch", "produce", "claim-delete", "claim-move", "mixed"}

// config is every flag.
type config struct {
	endpoints string
	local     int
	shards    int
	via       string
	workload  string
	clients   int
	duration  time.Duration
	rate      float64
	valueSize int
	queues    int
	groups    int
	batch     int
	inflight  int  // produce: inserts in flight per worker
	claim     int  // tasks per claim in the claim workloads
	twoCalls  bool // claim workloads: claim, then commit, in two requests
	prefill   int
	output    string
	prefix    string
	baseline  string // "" (Taskstore) or "postgres"
	pgDSN     string
	profile   string // directory for CPU and allocation profiles (--local only)
}

func (c *config) validate() error {
	if !slices.Contains(workloads, c.workload) {
		return fmt.Errorf("--workload %q: want one of %v", c.workload, workloads)
	}
	switch c.baseline {
	case "":
		if c.local < 0 {
			return fmt.Errorf("--local needs a node count, e.g. --local 3 (a bare --local is for --baseline postgres)")
		}
		if c.pgDSN != "" {
			return fmt.Errorf("--pg-dsn is for --baseline postgres")
		}
	case "postgres":
		if c.profile != "" {
			return fmt.Errorf("--profile is for a --local Taskstore cluster, not --baseline postgres")
		}
		return c.validateBaseline()
	default:
		return fmt.Errorf("--baseline %q: the only baseline is postgres", c.baseline)
	}
	if c.via != "direct" && c.via != "proxy" {
		return fmt.Errorf("--via %q: want direct or proxy", c.via)
	}
	if c.output != "text" && c.output != "json" {
		return fmt.Errorf("-o %q: want text or json", c.output)
	}
	if c.local < 0 {
		return fmt.Errorf("--local %d: must be positive", c.local)
	}
	if c.local == 0 && c.endpoints == "" {
		return fmt.Errorf("give --endpoints (a running cluster) or --local N (start one)")
	}
	if c.local > 0 && c.endpoints != "" {
		return fmt.Errorf("--endpoints and --local exclude each other")
	}
	if c.clients < 1 {
		return fmt.Errorf("--clients %d: must be at least 1", c.clients)
	}
	if c.duration <= 0 {
		return fmt.Errorf("--duration %v: must be positive", c.duration)
	}
	if c.rate < 0 {
		return fmt.Errorf("--rate %v: must not be negative (0 is closed loop)", c.rate)
	}
	if c.valueSize < 0 {
		return fmt.Errorf("--value-size %d: must not be negative", c.valueSize)
	}
	if c.groups < 1 || c.queues < 1 {
		return fmt.Errorf("--queues and --groups must be at least 1")
	}
	if c.queues < c.groups {
		return fmt.Errorf("--queues %d < --groups %d: every group needs a queue", c.queues, c.groups)
	}
	if c.batch < 1 {
		return fmt.Errorf("--batch %d: must be at least 1", c.batch)
	}
	if c.inflight < 1 {
		return fmt.Errorf("--inflight %d: must be at least 1", c.inflight)
	}
	if c.workload == "produce" && c.rate > 0 {
		return fmt.Errorf("--workload produce is closed loop: each worker keeps --inflight inserts in flight; --rate does not apply")
	}
	if maxClaim := limits.DefaultCommands.MaxClaimLimit; c.claim < 1 || c.claim > maxClaim {
		return fmt.Errorf("--claim-limit %d: must be between 1 and %d", c.claim, maxClaim)
	}
	if c.prefill < 0 {
		return fmt.Errorf("--prefill %d: must not be negative", c.prefill)
	}
	if c.shards < 0 {
		return fmt.Errorf("--shards %d: must not be negative", c.shards)
	}
	if c.profile != "" && c.local == 0 {
		return fmt.Errorf("--profile needs --local (it knows the HTTP addresses of the processes it starts); for a running cluster fetch http://NODE_HTTP/debug/pprof/profile?seconds=N yourself")
	}
	return nil
}

// validateBaseline checks the flags of --baseline postgres: the workload
// flags mean what they mean against Taskstore; the cluster flags do not apply.
func (c *config) validateBaseline() error {
	switch {
	case c.workload == "produce":
		return fmt.Errorf("--workload produce: not with --baseline postgres (compare with its insert workload: one row per transaction)")
	case c.via != "direct":
		return fmt.Errorf("--via %s: not with --baseline postgres (taskbench talks to PostgreSQL directly)", c.via)
	case c.endpoints != "":
		return fmt.Errorf("--endpoints: not with --baseline postgres (use --pg-dsn, or --local for a throwaway server)")
	case c.shards != 0:
		return fmt.Errorf("--shards: not with --baseline postgres")
	case c.local != 0 && c.pgDSN != "":
		return fmt.Errorf("--pg-dsn and --local exclude each other")
	case c.local == 0 && c.pgDSN == "":
		return fmt.Errorf("--baseline postgres needs --pg-dsn (or $PGDSN), or --local to start a throwaway server")
	}
	// The rest as for Taskstore, with the local cluster's checks satisfied.
	d := *c
	d.baseline, d.pgDSN, d.local, d.endpoints = "", "", 1, ""
	return d.validate()
}

// bareLocal rewrites a --local without a count (last, or followed by
// something that is not a number) to --local=-1, which validate accepts for
// --baseline postgres only: "--baseline postgres --local" reads naturally,
// and PostgreSQL has no node count.
func bareLocal(args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if a == "--local" {
			if i+1 == len(args) {
				out = append(out, "--local=-1")
				continue
			}
			if _, err := strconv.Atoi(args[i+1]); err != nil {
				out = append(out, "--local=-1")
				continue
			}
		}
		out = append(out, a)
	}
	return out
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// Off unless OTEL_* asks: the benchmark's clients then trace their calls.
	shutdownTracing, err := tracing.Setup(ctx, "taskbench")
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		os.Exit(1)
	}
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	tracing.Flush(slog.Default(), shutdownTracing)
	stop()
	os.Exit(code)
}

func execute(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	cmd := rootCmd(ctx, stdout, stderr, getenv)
	cmd.SetArgs(bareLocal(args))
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	if err := cmd.Execute(); err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return 1
	}
	return 0
}

func rootCmd(ctx context.Context, stdout, stderr io.Writer, getenv func(string) string) *cobra.Command {
	c := &config{}
	cmd := &cobra.Command{
		Use:   "taskbench",
		Short: "Benchmark a Taskstore cluster",
		Long: `taskbench runs one workload against a Taskstore cluster for --duration and
reports operations and tasks per second, latency percentiles (p50 p90 p99
p99.9), errors by gRPC code, the Raft log entries the shard leaders
committed meanwhile ("tasks per entry": how many tasks one entry carried),
and what each task cost (the costs block: entries, the fdatasyncs of every
node's shared log, which its shards' entries share, CPU, bytes written).

Workloads (an "op" is one unit of the workload; its latency covers all of it):
  insert        one task per Modify
  insert-batch  --batch tasks of one queue (one consistency group) per Modify
  produce       one task per Modify through a client.Producer: each worker
                keeps --inflight inserts in flight (default 64), over the
                client's Produce streams, many per message; an op sends one
                insert (waiting first for the oldest once --inflight are in
                flight); the "produce" latency runs from send to answer
  claim-delete  delete the task claimed last and claim the next of its queue in
                one request (a Modify that carries a claim: one RPC, one log
                entry); needs --prefill
  claim-move    the same, moving the task to the next stage queue of its group;
                tasks cycle between two stages; needs --prefill
  mixed         half inserts, half claim-deletes

A worker's first claim, and any after a commit found its queue empty, is a
plain Claim in the same op. --two-calls gives the claim workloads their older
shape: claim, then delete or move, two requests (and two log entries) per op.
Against PostgreSQL the default is one transaction that deletes or moves and
claims the next (one round trip, pipelined), and --two-calls two
transactions.

--claim-limit N makes a claim take up to N tasks of its queue, and the worker
then deletes or moves all of them in one Modify, all or nothing (one
statement against PostgreSQL): a worker that takes its work in batches. An
op is still one claim and one commit; tasks/s counts the tasks. (In mixed,
an insert still adds one task while a claim removes up to N.)

Queues: --queues queues spread over --groups consistency groups, named
<prefix>-g<G>/q<I> (a fresh random prefix per run unless --prefix is given).
A prefill inserts --prefill tasks in batches before the clock starts.

Closed loop (default): --clients workers each issue the next op as soon as the
last returns. Open loop (--rate R): ops are scheduled every 1/R s across the
workers and latency counts from the scheduled time, so a stall shows in the
percentiles instead of silently lowering the offered load.

--local N starts N taskstored processes (and a taskproxy with --via proxy) on
loopback from the binaries next to taskbench, $TASKSTORE_BIN or PATH, with
data in a temporary directory that is removed afterwards.

--baseline postgres runs the same workloads, with the same flags and report,
against PostgreSQL: a queue table (id, queue, priority, at, claimant,
version, value) indexed on (queue, priority desc, at, id); a claim is one
UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1), a delete
or move checks id and version. Default durability (fsync and
synchronous_commit on). "log entries" are then WAL fsyncs (pg_stat_wal).
Give --pg-dsn (default $PGDSN), or --local to start a throwaway server with
initdb and pg_ctl from /usr/lib/postgresql/*/bin (Debian's postgresql
package; as root they run as the user postgres via runuser), on 127.0.0.1,
removed afterwards.

After the counts comes a "costs" block, per task over the measured interval
(not the prefill), each process's share in parentheses: log entries,
fsync+fdatasync calls of the nodes' logs (taskstore_log_syncs_total) and
entries per sync, log bytes, CPU milliseconds of every process (the nodes and
proxy of a --local cluster, a --local PostgreSQL's whole process tree, from
/proc/<pid>/stat; taskbench itself from getrusage; a remote node's from its
process_cpu_seconds_total), CPU% of one core, and bytes written to storage
(/proc/<pid>/io). "-" is a figure that could not be measured; -o json has it
all under "costs". docs/performance.md, "Cost columns", has the details.

"taskbench suite" runs the standard suite (make bench) and prints one table.`,
		Example: `  # single inserts, one client, then 32, on a fresh local 3-node cluster
  taskbench --local 3 --workload insert --clients 1 --duration 10s
  taskbench --local 3 --workload insert --clients 32 --duration 10s
  # a producer: 16 workers with 64 single-task inserts in flight each
  taskbench --local 3 --via proxy --workload produce --inflight 64 --clients 16 --duration 10s
  # batched inserts: 100 tasks per request
  taskbench --local 3 --workload insert-batch --batch 100 --clients 8 --duration 10s
  # claim+delete through a proxy, 20k tasks queued first
  taskbench --local 3 --via proxy --workload claim-delete --prefill 20000 --clients 16 --duration 10s
  # workers that claim 10 tasks at a time and delete them in one request
  taskbench --local 3 --via proxy --workload claim-delete --claim-limit 10 --prefill 100000 --clients 16 --duration 10s
  # pipeline stage: claim and move to the next queue of the group
  taskbench --local 3 --workload claim-move --prefill 20000 --clients 16 --duration 10s
  # mixed at a fixed 2000 ops/s (open loop), JSON out
  taskbench --endpoints 127.0.0.1:7101 --workload mixed --prefill 5000 --rate 2000 --clients 64 -o json
  # the same claim+delete against a throwaway PostgreSQL (FOR UPDATE SKIP LOCKED)
  taskbench --baseline postgres --local --workload claim-delete --prefill 20000 --clients 16 --duration 10s`,
		Version:       buildinfo.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if c.baseline != "" && c.pgDSN == "" && c.local == 0 {
				c.pgDSN = getenv("PGDSN")
			}
			if err := c.validate(); err != nil {
				return err
			}
			if c.prefix == "" {
				c.prefix = "bench-" + randomID()
			}
			return run(ctx, c, stdout, stderr, getenv)
		},
	}
	addFlags(cmd, c)
	cmd.AddCommand(suiteCmd(ctx, stdout, stderr, getenv))
	return cmd
}

// addFlags defines every flag of a benchmark run on cmd (the suite parses
// its rows' arguments with it too).
func addFlags(cmd *cobra.Command, c *config) {
	fl := cmd.Flags()
	fl.StringVar(&c.endpoints, "endpoints", "", "comma-separated gRPC addresses of nodes (or proxies, with --via proxy) of a running cluster")
	fl.IntVar(&c.local, "local", 0, "start a local cluster of this many nodes instead of --endpoints (with --baseline postgres: a bare --local starts a throwaway PostgreSQL)")
	fl.IntVar(&c.shards, "shards", 0, "with --local: number of shards (0: taskstored's default)")
	fl.StringVar(&c.via, "via", "direct", "direct (client routes to shard leaders) or proxy (endpoints are taskproxy instances)")
	fl.StringVar(&c.workload, "workload", "insert", "insert, insert-batch, produce, claim-delete, claim-move or mixed")
	fl.IntVar(&c.clients, "clients", 1, "concurrent workers")
	fl.DurationVar(&c.duration, "duration", 30*time.Second, "how long to measure")
	fl.Float64Var(&c.rate, "rate", 0, "open loop: total ops per second to offer; 0 is closed loop (as fast as the workers go)")
	fl.IntVar(&c.valueSize, "value-size", 64, "bytes of value per task")
	fl.IntVar(&c.queues, "queues", 8, "number of queues")
	fl.IntVar(&c.groups, "groups", 8, "number of consistency groups the queues are spread over")
	fl.IntVar(&c.batch, "batch", 100, "tasks per request for insert-batch (and the prefill)")
	fl.IntVar(&c.inflight, "inflight", 64, "produce: inserts each worker keeps in flight")
	fl.IntVar(&c.claim, "claim-limit", 1, "claim workloads: tasks per claim (1 to 1000); a worker then deletes or moves all of them in one request")
	fl.BoolVar(&c.twoCalls, "two-calls", false, "claim workloads: claim, then commit, in two requests, instead of a commit that claims the next task")
	fl.IntVar(&c.prefill, "prefill", 0, "tasks to insert before measuring (claim workloads need them)")
	fl.StringVarP(&c.output, "output", "o", "text", "text or json")
	fl.StringVar(&c.prefix, "prefix", "", "queue name prefix (default: bench-<random>)")
	fl.StringVar(&c.baseline, "baseline", "", "postgres: run the workload against PostgreSQL instead (FOR UPDATE SKIP LOCKED queue)")
	fl.StringVar(&c.profile, "profile", "", "with --local: write CPU and allocation profiles of every process over the measured interval to this directory (NAME-cpu.pprof, NAME-allocs.pprof; read with go tool pprof)")
	fl.StringVar(&c.pgDSN, "pg-dsn", "", "with --baseline postgres: connection string (default $PGDSN), e.g. postgres://user@host:5432/db")
}
