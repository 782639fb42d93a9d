package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// suiteOpts are the suite's flags.
type suiteOpts struct {
	benchtime time.Duration
	prefill   int
	postgres  bool
	output    string
}

// suiteRow is one run of the suite: the taskbench arguments that reproduce
// it and what it measured (or why it did not run).
type suiteRow struct {
	Args    []string `json:"args"`
	Result  *result  `json:"result,omitempty"`
	Skipped string   `json:"skipped,omitempty"`
	Error   string   `json:"error,omitempty"`
}

func (r *suiteRow) command() string { return "taskbench " + strings.Join(r.Args, " ") }

// suiteReport is the suite's outcome; -o json prints it.
type suiteReport struct {
	Benchtime float64    `json:"benchtime_s"`
	Rows      []suiteRow `json:"rows"`
	// ProxyVsPostgres is the tasks/s of claim-delete via a proxy divided by
	// PostgreSQL's (the target is at least 3); 0 when either is missing.
	ProxyVsPostgres  float64 `json:"proxy_vs_postgres,omitempty"`
	DirectVsPostgres float64 `json:"direct_vs_postgres,omitempty"`
	// BatchedProxyVsPostgres is the same with --claim-limit 10 on both.
	BatchedProxyVsPostgres float64 `json:"batched_proxy_vs_postgres,omitempty"`
}

// runner runs taskbench with args and returns its result.
type runner func(ctx context.Context, args []string) (*result, error)

func suiteCmd(ctx context.Context, stdout, stderr io.Writer, getenv func(string) string) *cobra.Command {
	o := &suiteOpts{}
	cmd := &cobra.Command{
		Use:   "suite",
		Short: "Run the standard benchmark suite (make bench) and print one table",
		Long: `suite runs, each on a fresh local 3-node cluster (--local 3) for --benchtime:
single inserts with 1 and 32 clients, batched inserts, claim+delete direct and
through a proxy, an open-loop claim+delete at half the direct maximum, the
same claim+delete against a throwaway PostgreSQL (--baseline postgres --local;
skipped with a message when PostgreSQL is not installed), and claim+delete
with workers that claim 10 tasks at a time (--claim-limit 10), through a
proxy and against PostgreSQL. It prints one table, each row with the
taskbench command that reproduces it, and the ratios of the proxy's
claim+delete to PostgreSQL's.`,
		Example:       "  taskbench suite --benchtime 10s\n  make bench BENCHTIME=5s",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.benchtime <= 0 {
				return fmt.Errorf("--benchtime %v: must be positive", o.benchtime)
			}
			if o.prefill < 0 {
				return fmt.Errorf("--prefill %d: must not be negative (0: automatic)", o.prefill)
			}
			if o.output != "text" && o.output != "json" {
				return fmt.Errorf("-o %q: want text or json", o.output)
			}
			run := func(ctx context.Context, args []string) (*result, error) {
				return runArgs(ctx, args, stderr, getenv)
			}
			var pgSkip string
			if !o.postgres {
				pgSkip = "--postgres=false"
			} else if err := pgAvailable(getenv); err != nil {
				pgSkip = err.Error()
			}
			return runSuite(ctx, o, pgSkip, run, stdout, stderr)
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&o.benchtime, "benchtime", 10*time.Second, "measured duration of each run")
	fl.IntVar(&o.prefill, "prefill", 0, "tasks queued before each claim-delete run; 0: 10000 per second of --benchtime, at least 20000, "+
		"so that none runs dry (PostgreSQL claims ~6500/s here; the --claim-limit 10 rows queue 4 times as many)")
	fl.BoolVar(&o.postgres, "postgres", true, "run the PostgreSQL baseline (needs PostgreSQL's binaries)")
	fl.StringVarP(&o.output, "output", "o", "text", "text or json")
	return cmd
}

// runArgs parses args as the taskbench command line does and runs the
// benchmark in this process.
func runArgs(ctx context.Context, args []string, stderr io.Writer, getenv func(string) string) (*result, error) {
	c := &config{}
	cmd := &cobra.Command{Use: "taskbench"}
	addFlags(cmd, c)
	fs := cmd.Flags()
	fs.SetOutput(io.Discard)
	if err := fs.Parse(bareLocal(args)); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	c.prefix = "bench-" + randomID()
	return bench(ctx, c, stderr, getenv)
}

// suiteArgs are the rows' arguments; the open loop's rate comes from row
// 4's result, so it is filled in when that is known.
func suiteArgs(o *suiteOpts) [][]string {
	d := o.benchtime.String()
	p := fmt.Sprint(suitePrefill(o))
	// Claiming 10 at a time, PostgreSQL goes through ~25000 tasks/s here.
	p10 := fmt.Sprint(4 * suitePrefill(o))
	return [][]string{
		{"--local", "3", "--workload", "insert", "--clients", "1", "--duration", d},
		{"--local", "3", "--workload", "insert", "--clients", "32", "--duration", d},
		{"--local", "3", "--workload", "insert-batch", "--batch", "100", "--clients", "8", "--duration", d},
		{"--local", "3", "--workload", "claim-delete", "--prefill", p, "--clients", "16", "--duration", d},
		{"--local", "3", "--via", "proxy", "--workload", "claim-delete", "--prefill", p, "--clients", "16", "--duration", d},
		{"--local", "3", "--workload", "claim-delete", "--prefill", p, "--clients", "32", "--rate", "RATE", "--duration", d},
		{"--baseline", "postgres", "--local", "--workload", "claim-delete", "--prefill", p, "--clients", "16", "--duration", d},
		{"--local", "3", "--via", "proxy", "--workload", "claim-delete", "--claim-limit", "10", "--prefill", p10, "--batch", "1000", "--clients", "16", "--duration", d},
		{"--baseline", "postgres", "--local", "--workload", "claim-delete", "--claim-limit", "10", "--prefill", p10, "--batch", "1000", "--clients", "16", "--duration", d},
	}
}

// suitePrefill is --prefill, or when 0 enough for the fastest claim-delete
// seen here (PostgreSQL, ~6500 tasks/s) with room to spare.
func suitePrefill(o *suiteOpts) int {
	if o.prefill > 0 {
		return o.prefill
	}
	return max(20000, int(math.Ceil(o.benchtime.Seconds()))*10000)
}

// Rows with a special role (0-based).
const (
	rowDirect   = 3
	rowProxy    = 4
	rowOpen     = 5
	rowPostgres = 6
	// --claim-limit 10
	rowBatchedProxy    = 7
	rowBatchedPostgres = 8
)

func runSuite(ctx context.Context, o *suiteOpts, pgSkip string, run runner, stdout, stderr io.Writer) error {
	all := suiteArgs(o)
	rep := &suiteReport{Benchtime: o.benchtime.Seconds()}
	failed := 0
	for i, args := range all {
		row := suiteRow{Args: args}
		switch {
		case i == rowOpen:
			if d := rep.Rows[rowDirect].Result; d != nil && d.TasksPerSec >= 2 {
				rate := fmt.Sprint(math.Floor(d.TasksPerSec / 2))
				row.Args = append([]string(nil), args...)
				for j := range row.Args {
					if row.Args[j] == "RATE" {
						row.Args[j] = rate
					}
				}
			} else {
				row.Skipped = fmt.Sprintf("needs the rate of #%d", rowDirect+1)
			}
		case (i == rowPostgres || i == rowBatchedPostgres) && pgSkip != "":
			row.Skipped = pgSkip
		}
		if row.Skipped == "" {
			fmt.Fprintf(stderr, "[%d/%d] %s\n", i+1, len(all), row.command())
			res, err := run(ctx, row.Args)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				failed++
				row.Error = err.Error()
				fmt.Fprintf(stderr, "[%d/%d] failed: %v\n", i+1, len(all), err)
			}
			row.Result = res
		} else {
			fmt.Fprintf(stderr, "[%d/%d] skipped: %s\n", i+1, len(all), row.Skipped)
		}
		rep.Rows = append(rep.Rows, row)
	}
	if pg := rep.Rows[rowPostgres].Result; pg != nil && pg.TasksPerSec > 0 {
		if r := rep.Rows[rowProxy].Result; r != nil {
			rep.ProxyVsPostgres = round(r.TasksPerSec/pg.TasksPerSec, 2)
		}
		if r := rep.Rows[rowDirect].Result; r != nil {
			rep.DirectVsPostgres = round(r.TasksPerSec/pg.TasksPerSec, 2)
		}
	}
	if pg := rep.Rows[rowBatchedPostgres].Result; pg != nil && pg.TasksPerSec > 0 {
		if r := rep.Rows[rowBatchedProxy].Result; r != nil {
			rep.BatchedProxyVsPostgres = round(r.TasksPerSec/pg.TasksPerSec, 2)
		}
	}
	if err := printSuite(stdout, o.output, rep); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d runs failed", failed, len(all))
	}
	return nil
}

// printSuite prints the suite's one table (a Markdown table, aligned, so it
// reads in a terminal and pastes into docs/performance.md).
func printSuite(w io.Writer, format string, rep *suiteReport) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	// PostgreSQL's claim-delete tasks/s by claim limit, for "vs PG".
	pg := map[int]float64{}
	for _, i := range []int{rowPostgres, rowBatchedPostgres} {
		if r := rep.Rows[i].Result; r != nil && r.TasksPerSec > 0 {
			pg[max(1, r.ClaimLimit)] = r.TasksPerSec
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| #\t| command\t| ops/s\t| tasks/s\t| log entries/s\t| entries/task\t| req/entry\t| msgs/req\t| syncs/task\t| cpu-ms/task\t| B written/task\t| op p50 / p99 / p99.9 ms\t| failed ops\t| vs PG\t|")
	fmt.Fprintln(tw, "|--\t|--\t|--:\t|--:\t|--:\t|--:\t|--:\t|--:\t|--:\t|--:\t|--:\t|--\t|--:\t|--:\t|")
	for i, row := range rep.Rows {
		cmd := "`" + row.command() + "`"
		if row.Skipped != "" {
			fmt.Fprintf(tw, "| %d\t| %s\t| skipped: %s\t|\t|\t|\t|\t|\t|\t|\t|\t|\t|\t|\t|\n", i+1, cmd, oneLine(row.Skipped))
			continue
		}
		r := row.Result
		if r == nil {
			fmt.Fprintf(tw, "| %d\t| %s\t| error: %s\t|\t|\t|\t|\t|\t|\t|\t|\t|\t|\t|\t|\n", i+1, cmd, oneLine(row.Error))
			continue
		}
		entries := "?"
		if r.MetricsError == "" {
			entries = fmt.Sprintf("%.0f", r.LogEntriesPerSec)
		}
		perTask, reqs, msgs, syncs, cpu, written := "-", "-", "-", "-", "-", "-"
		if c := r.Costs; c != nil {
			perTask, syncs, cpu, written = fmtNum(c.EntriesPerTask), fmtNum(c.SyncsPerTask), c.fmtCPUPerTask(), fmtBytes(c.WriteBytesPerTask)
			reqs, msgs = fmtNum(c.RequestsPerEntry), fmtNum(c.MsgsPerRequest)
		}
		failed := fmt.Sprint(r.FailedOps)
		if r.EmptyClaims > 0 {
			failed += fmt.Sprintf(" (%d empty claims)", r.EmptyClaims)
		}
		vs := ""
		if base := pg[max(1, r.ClaimLimit)]; base > 0 && r.Workload == "claim-delete" && r.Loop == "closed" {
			vs = fmt.Sprintf("%.2f×", r.TasksPerSec/base)
		}
		fmt.Fprintf(tw, "| %d\t| %s\t| %.0f\t| %.0f\t| %s\t| %s\t| %s\t| %s\t| %s\t| %s\t| %s\t| %s / %s / %s\t| %s\t| %s\t|\n", i+1, cmd,
			r.OpsPerSec, r.TasksPerSec, entries, perTask, reqs, msgs, syncs, cpu, written,
			fmtMS(r.Latency.P50), fmtMS(r.Latency.P99), fmtMS(r.Latency.P999), failed, vs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nEach run %v measured, on its own fresh cluster or server. Log entries: Raft entries the shard leaders\n"+
		"committed (one fsync each); for PostgreSQL (#%d, #%d), WAL fsyncs (pg_stat_wal.wal_sync). \"vs PG\": against\n"+
		"PostgreSQL with the same claim limit.\n"+
		"Costs per task over the measured interval: entries/task (PostgreSQL: committed transactions), req/entry\n"+
		"(commands the shard leaders proposed per log entry: writes that queued behind an entry in flight share the\n"+
		"next), msgs/req (gRPC messages the nodes and the proxy received per request sent), syncs/task\n"+
		"(fsync+fdatasync of all nodes' logs, taskstore_log_syncs_total; PostgreSQL: WAL fsyncs), cpu-ms/task (every\n"+
		"process: nodes, proxy, taskbench, PostgreSQL's whole tree; ≥ when one was unreadable), B written/task (the\n"+
		"servers' /proc/<pid>/io write_bytes); \"-\": not measured. taskbench -o json has the per-process figures.\n",
		time.Duration(rep.Benchtime*float64(time.Second)), rowPostgres+1, rowBatchedPostgres+1)
	if rep.ProxyVsPostgres > 0 {
		fmt.Fprintf(w, "claim-delete tasks/s, via proxy (#%d) / PostgreSQL (#%d): %.2f× (direct, #%d: %.2f×); the target is ≥ 3×.\n",
			rowProxy+1, rowPostgres+1, rep.ProxyVsPostgres, rowDirect+1, rep.DirectVsPostgres)
	} else {
		fmt.Fprintf(w, "claim-delete via proxy / PostgreSQL: not measured (#%d or #%d missing).\n", rowProxy+1, rowPostgres+1)
	}
	if rep.BatchedProxyVsPostgres > 0 {
		fmt.Fprintf(w, "claiming 10 at a time, via proxy (#%d) / PostgreSQL (#%d): %.2f×.\n",
			rowBatchedProxy+1, rowBatchedPostgres+1, rep.BatchedProxyVsPostgres)
	}
	return nil
}

// fmtMS prints a latency with three significant digits or so, as
// docs/performance.md does.
func fmtMS(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.ReplaceAll(s, "|", "/")
}
