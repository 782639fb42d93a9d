package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
)

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

func report(w io.Writer, format string, r *result) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	loop := "closed loop"
	if r.Loop == "open" {
		loop = fmt.Sprintf("open loop at %.0f ops/s", r.TargetRate)
	}
	if r.PGVersion != "" {
		fmt.Fprintf(w, "PostgreSQL %s at %s\n", r.PGVersion, r.Endpoints)
	}
	fmt.Fprintf(w, "workload %s via %s, %d clients, %s, %.1fs (value %d B, %d queues in %d groups",
		r.Workload, r.Via, r.Clients, loop, r.Elapsed, r.ValueSize, r.Queues, r.Groups)
	if r.Inflight > 0 {
		fmt.Fprintf(w, ", %d in flight per client", r.Inflight)
	}
	if r.Batch > 0 {
		fmt.Fprintf(w, ", batch %d", r.Batch)
	}
	if r.ClaimLimit > 1 {
		fmt.Fprintf(w, ", claim limit %d", r.ClaimLimit)
	}
	if r.Prefill > 0 {
		fmt.Fprintf(w, ", prefill %d", r.Prefill)
	}
	fmt.Fprintln(w, ")")
	if r.LocalGOMAXPROCS != "" {
		fmt.Fprintf(w, "local cluster: %d nodes, GOMAXPROCS %s per process\n", r.Local, r.LocalGOMAXPROCS)
	}
	fmt.Fprintf(w, "ops      %10d  %10.1f ops/s   (%d failed)\n", r.Ops, r.OpsPerSec, r.FailedOps)
	fmt.Fprintf(w, "rpcs     %10d  %10.1f rpcs/s\n", r.RPCs, r.RPCsPerSec)
	fmt.Fprintf(w, "tasks    %10d  %10.1f tasks/s\n", r.Tasks, r.TasksPerSec)
	if r.MetricsError != "" {
		fmt.Fprintf(w, "log      (metrics not read: %s)\n", r.MetricsError)
	} else if r.Baseline == "postgres" {
		fmt.Fprintf(w, "wal      %10.0f  %10.1f fsyncs/s   %.2f tasks per fsync (pg_stat_wal.wal_sync), %.0f commits\n",
			r.LogEntries, r.LogEntriesPerSec, r.TasksPerEntry, r.PGCommits)
	} else {
		fmt.Fprintf(w, "log      %10.0f  %10.1f entries/s  %.2f tasks per entry (the nodes share fdatasyncs between entries: see syncs/task)\n",
			r.LogEntries, r.LogEntriesPerSec, r.TasksPerEntry)
	}
	printCosts(w, r.Costs, r.Baseline == "postgres")
	if r.EmptyClaims > 0 {
		fmt.Fprintf(w, "empty claims %d (the queues ran dry: raise --prefill)\n", r.EmptyClaims)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "latency ms\tcount\tmean\tp50\tp90\tp99\tp99.9\tmax\t")
	row := func(name string, s latencySummary) {
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t\n", name, s.Count, s.Mean, s.P50, s.P90, s.P99, s.P999, s.Max)
	}
	row("op", r.Latency)
	kinds := make([]string, 0, len(r.RPCLatency))
	for k := range r.RPCLatency {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		row(k, r.RPCLatency[k])
	}
	tw.Flush()
	if len(r.Errors) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "errors by code:")
		codes := make([]string, 0, len(r.Errors))
		for k := range r.Errors {
			codes = append(codes, k)
		}
		slices.Sort(codes)
		for _, k := range codes {
			fmt.Fprintf(w, "  %-20s %d\n", k, r.Errors[k])
		}
	}
	return nil
}
