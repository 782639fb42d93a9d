package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

func TestBaselineFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--baseline", "mysql", "--local"}, "--baseline"},
		{[]string{"--baseline", "postgres"}, "--pg-dsn"},
		{[]string{"--baseline", "postgres", "--local", "--via", "proxy"}, "--via"},
		{[]string{"--baseline", "postgres", "--local", "--shards", "2"}, "--shards"},
		{[]string{"--baseline", "postgres", "--endpoints", "x:1"}, "--endpoints"},
		{[]string{"--baseline", "postgres", "--local", "--pg-dsn", "host=x"}, "exclude"},
		{[]string{"--baseline", "postgres", "--local", "--clients", "0"}, "--clients"},
		{[]string{"--baseline", "postgres", "--local", "--workload", "bogus"}, "--workload"},
		{[]string{"--local", "--workload", "insert"}, "node count"},
		{[]string{"--endpoints", "x:1", "--pg-dsn", "host=x"}, "--pg-dsn"},
		{[]string{"suite", "--benchtime", "0s"}, "--benchtime"},
		{[]string{"suite", "-o", "yaml"}, "-o"},
	} {
		_, stderr, code := runCLI(t, nil, c.args...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("taskbench %v: exit %d, stderr %q; want an error about %s", c.args, code, stderr, c.want)
		}
	}
	for _, c := range []struct{ in, want []string }{
		{[]string{"--local"}, []string{"--local=-1"}},
		{[]string{"--local", "--workload", "x"}, []string{"--local=-1", "--workload", "x"}},
		{[]string{"--local", "3", "--workload", "x"}, []string{"--local", "3", "--workload", "x"}},
		{[]string{"--local=2", "--", "--local"}, []string{"--local=2", "--", "--local"}},
	} {
		if got := bareLocal(c.in); !slices.Equal(got, c.want) {
			t.Errorf("bareLocal(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// $PGDSN is the default of --pg-dsn: the run gets as far as connecting.
	_, stderr, code := runCLI(t, map[string]string{"PGDSN": "host=127.0.0.1 port=1 connect_timeout=2"},
		"--baseline", "postgres", "--workload", "insert", "--duration", "1s")
	if code == 0 || !strings.Contains(stderr, "127.0.0.1") {
		t.Errorf("with $PGDSN: exit %d, stderr %q; want a failure to connect to 127.0.0.1:1", code, stderr)
	}
}

// pgTestServer starts a throwaway PostgreSQL for the test, or skips when
// its binaries are not installed (CI does not install them).
func pgTestServer(t *testing.T) *pgServer {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	if err := pgAvailable(os.Getenv); err != nil {
		t.Skipf("PostgreSQL baseline not tested: %v", err)
	}
	srv, err := startLocalPostgres(context.Background(), 40, os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.stop)
	return srv
}

func TestPostgresBaseline(t *testing.T) {
	srv := pgTestServer(t)
	ctx := context.Background()
	s, err := openPG(ctx, srv.dsn, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()

	for _, tc := range []struct {
		limit    int
		twoCalls bool
	}{{1, false}, {7, false}, {1, true}, {7, true}} {
		limit := tc.limit
		t.Run(fmt.Sprintf("claim-delete drains the prefill exactly once, claim limit %d, two calls %v", limit, tc.twoCalls), func(t *testing.T) {
			const n, clients = 600, 6
			cfg := &config{workload: "claim-delete", queues: 4, groups: 2, prefix: fmt.Sprintf("drain%d%v", limit, tc.twoCalls), batch: 100, claim: limit,
				clients: clients, valueSize: 16, twoCalls: tc.twoCalls}
			lay := newLayout(cfg)
			value := make([]byte, cfg.valueSize)
			if err := prefill(ctx, cfg, lay, n, s.batchInsert(value)); err != nil {
				t.Fatal(err)
			}
			if got, err := s.count(ctx, lay.queues); err != nil || got != n {
				t.Fatalf("after the prefill: %d tasks, %v; want %d", got, err, n)
			}
			var done atomic.Int64
			workers := make([]*worker, clients)
			var wg sync.WaitGroup
			for i := range workers {
				w := newWorker(i, nil, cfg, lay, value)
				w.pg = s
				workers[i] = w
				wg.Go(func() {
					for k := 0; done.Load() < n && k < 10*n; k++ {
						before := w.tasks
						if err := w.op(ctx); err != nil {
							w.failed++
						}
						done.Add(w.tasks - before)
					}
				})
			}
			wg.Wait()
			var tasks, failed int64
			for _, w := range workers {
				tasks += w.tasks
				failed += w.failed
				if len(w.errs) > 0 {
					t.Errorf("worker %d: errors %v", w.id, w.errs)
				}
			}
			// A task deleted twice would have been refused (and counted as an
			// error), one never claimed would still be in the table.
			if tasks != n || failed != 0 {
				t.Errorf("deleted %d tasks with %d failed ops; want %d and 0", tasks, failed, n)
			}
			if got, err := s.count(ctx, lay.queues); err != nil || got != 0 {
				t.Errorf("after claim-delete: %d tasks left (%v); want the table empty", got, err)
			}
			for _, q := range lay.queues {
				if ts, err := s.claim(ctx, q, limit); len(ts) != 0 || err != nil {
					t.Errorf("claim on the drained %s: %v, err %v", q, ts, err)
				}
			}
		})
	}

	t.Run("claims by priority then age, once per lease; stale versions are refused", func(t *testing.T) {
		q := "order-g0/q0"
		for _, p := range []int{1, 5, 5} {
			if _, err := s.pool.Exec(ctx, `INSERT INTO `+pgTable+` (queue, priority, value) VALUES ($1, $2, 'x')`, q, p); err != nil {
				t.Fatal(err)
			}
		}
		var first int64
		if err := s.pool.QueryRow(ctx, `SELECT min(id) FROM `+pgTable+` WHERE queue = $1 AND priority = 5`, q).Scan(&first); err != nil {
			t.Fatal(err)
		}
		t1, ok, err := claimOne(ctx, s, q)
		if err != nil || !ok || t1.id != first || t1.version != 2 || t1.queue != q {
			t.Fatalf("first claim = %+v, %v, %v; want the older priority-5 task %d at version 2", t1, ok, err, first)
		}
		t2, _, _ := claimOne(ctx, s, q)
		t3, _, _ := claimOne(ctx, s, q)
		if t2.id == t1.id || t3.id == t1.id || t2.id == t3.id || t2.id < t1.id {
			t.Errorf("claims %d %d %d: each task once, priority 5 before 1", t1.id, t2.id, t3.id)
		}
		if tk, ok, err := claimOne(ctx, s, q); ok || err != nil {
			t.Errorf("every task is leased, yet claimed %+v (%v)", tk, err)
		}

		// The version before the claim is dead: delete and move refuse it.
		for name, err := range map[string]error{
			"delete": s.delete(ctx, []pgTask{{id: t1.id, version: t1.version - 1}}),
			"move":   s.move(ctx, []pgTask{{id: t1.id, version: t1.version - 1}}, []string{"order-g0/q1"}),
		} {
			if code := codeOf(err); code != "FailedPrecondition" {
				t.Errorf("%s of a stale version: %v (%s), want FailedPrecondition", name, err, code)
			}
		}
		if got, _ := s.count(ctx, []string{q}); got != 3 {
			t.Errorf("%d tasks after refused deletes, want 3", got)
		}
		// The current version commits, once.
		if err := s.delete(ctx, []pgTask{t1}); err != nil {
			t.Errorf("delete of the claimed version: %v", err)
		}
		if err := s.delete(ctx, []pgTask{t1}); codeOf(err) != "FailedPrecondition" {
			t.Errorf("second delete of the same version: %v, want FailedPrecondition", err)
		}
		// A move ends the claim: the task is available at once in its new queue.
		if err := s.move(ctx, []pgTask{t2}, []string{"order-g0/q1"}); err != nil {
			t.Errorf("move: %v", err)
		}
		if tk, ok, err := claimOne(ctx, s, "order-g0/q1"); !ok || err != nil || tk.id != t2.id || tk.version != t2.version+2 {
			t.Errorf("claim after move = %+v, %v, %v; want task %d at version %d", tk, ok, err, t2.id, t2.version+2)
		}
		if err := s.purge(ctx, []string{q, "order-g0/q1"}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a claim of several takes the best first; a partly stale commit changes nothing", func(t *testing.T) {
		q := "many-g0/q0"
		for _, p := range []int{1, 9, 5, 9} {
			if _, err := s.pool.Exec(ctx, `INSERT INTO `+pgTable+` (queue, priority, value) VALUES ($1, $2, 'x')`, q, p); err != nil {
				t.Fatal(err)
			}
		}
		ts, err := s.claim(ctx, q, 3)
		if err != nil || len(ts) != 3 {
			t.Fatalf("claim of 3: %v, %v", ts, err)
		}
		var prios []int
		for _, tk := range ts {
			var p int
			if err := s.pool.QueryRow(ctx, `SELECT priority FROM `+pgTable+` WHERE id = $1`, tk.id).Scan(&p); err != nil {
				t.Fatal(err)
			}
			prios = append(prios, p)
		}
		slices.Sort(prios)
		if !slices.Equal(prios, []int{5, 9, 9}) {
			t.Errorf("claimed priorities %v, want the three best (5 9 9)", prios)
		}
		// A stale version anywhere refuses the whole delete or move, as a
		// Modify would.
		stale := slices.Clone(ts)
		stale[1].version--
		next := []string{"many-g0/q1", "many-g0/q1", "many-g0/q1"}
		for name, err := range map[string]error{
			"delete": s.delete(ctx, stale),
			"move":   s.move(ctx, stale, next),
		} {
			if code := codeOf(err); code != "FailedPrecondition" {
				t.Errorf("%s with one stale version of three: %v (%s), want FailedPrecondition", name, err, code)
			}
		}
		if got, _ := s.count(ctx, []string{q}); got != 4 {
			t.Errorf("%d tasks left after the refused delete and move, want all 4", got)
		}
		if err := s.move(ctx, ts[:2], next[:2]); err != nil {
			t.Errorf("move of two claimed tasks: %v", err)
		}
		if err := s.delete(ctx, ts[2:]); err != nil {
			t.Errorf("delete of the third: %v", err)
		}
		if moved, _ := s.count(ctx, []string{"many-g0/q1"}); moved != 2 {
			t.Errorf("%d tasks moved, want 2", moved)
		}
		if left, _ := s.count(ctx, []string{q}); left != 1 {
			t.Errorf("%d tasks left in %s, want the unclaimed one", left, q)
		}
		if err := s.purge(ctx, []string{q, "many-g0/q1"}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a commit that claims: one transaction, nothing claimed when the commit is refused", func(t *testing.T) {
		q, next := "cc-g0/q0", "cc-g0/q1"
		for range 4 {
			if _, err := s.pool.Exec(ctx, `INSERT INTO `+pgTable+` (queue, value) VALUES ($1, 'x')`, q); err != nil {
				t.Fatal(err)
			}
		}
		held, err := s.claim(ctx, q, 1)
		if err != nil || len(held) != 1 {
			t.Fatalf("claim: %v, %v", held, err)
		}
		stale := []pgTask{{id: held[0].id, version: held[0].version - 1, queue: q}}
		for name, queues := range map[string][]string{"delete": nil, "move": {next}} {
			if ts, err := s.commitAndClaim(ctx, stale, queues, q, 2); codeOf(err) != "FailedPrecondition" || len(ts) != 0 {
				t.Errorf("%s of a stale version and claim: %v, %v; want FailedPrecondition and nothing", name, ts, err)
			}
		}
		var claimed int64
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+pgTable+` WHERE queue = $1 AND claimant <> ''`, q).Scan(&claimed); err != nil || claimed != 1 {
			t.Fatalf("%d claimed tasks after the refused commits (%v), want 1", claimed, err)
		}
		// Move the held task and claim two more of its queue.
		ts, err := s.commitAndClaim(ctx, held, []string{next}, q, 2)
		if err != nil || len(ts) != 2 || ts[0].id == held[0].id || ts[1].id == held[0].id || ts[0].version != 2 {
			t.Fatalf("move and claim: %+v, %v; want two other tasks at version 2", ts, err)
		}
		if moved, _ := s.count(ctx, []string{next}); moved != 1 {
			t.Errorf("%d tasks in %s, want the moved one", moved, next)
		}
		// Delete them and claim the last; then delete it, finding nothing.
		last, err := s.commitAndClaim(ctx, ts, nil, q, 2)
		if err != nil || len(last) != 1 {
			t.Fatalf("delete two and claim: %+v, %v; want the last task", last, err)
		}
		if none, err := s.commitAndClaim(ctx, last, nil, q, 2); err != nil || len(none) != 0 {
			t.Errorf("delete the last and claim: %+v, %v; want nothing claimed", none, err)
		}
		if left, _ := s.count(ctx, []string{q}); left != 0 {
			t.Errorf("%d tasks left in %s, want 0", left, q)
		}
		if err := s.purge(ctx, []string{q, next}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("every workload through the command line", func(t *testing.T) {
		for _, wl := range workloads {
			if wl == "produce" {
				continue // Taskstore's producer: the baseline compares it with its insert workload
			}
			prefix := "cli-" + wl
			out, stderr, code := runCLI(t, nil, "--baseline", "postgres", "--pg-dsn", srv.dsn, "--workload", wl,
				"--prefill", "300", "--clients", "3", "--duration", "700ms", "--batch", "20", "--claim-limit", "4", "--prefix", prefix, "-o", "json")
			if code != 0 {
				t.Errorf("%s: exit %d: %s", wl, code, stderr)
				continue
			}
			var r result
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Errorf("%s: not JSON: %v\n%s", wl, err, out)
				continue
			}
			if r.Ops == 0 || r.Tasks == 0 || r.FailedOps != 0 || len(r.Errors) != 0 || r.Latency.P50 <= 0 ||
				r.Baseline != "postgres" || r.Via != "postgres" || r.PGVersion == "" {
				t.Errorf("%s: implausible result: %s", wl, out)
			}
			// Every commit fsyncs the WAL (several commits may share one).
			if r.MetricsError != "" || r.LogEntries <= 0 || r.PGCommits < r.LogEntries {
				t.Errorf("%s: WAL fsyncs %v, commits %v, metrics error %q", wl, r.LogEntries, r.PGCommits, r.MetricsError)
			}
			if wl == "insert-batch" && r.Tasks != 20*r.Ops {
				t.Errorf("insert-batch: %d tasks in %d ops, want 20 per op", r.Tasks, r.Ops)
			}
			// Ops whose claim found tasks committed several each.
			if full := r.Ops - r.EmptyClaims; strings.HasPrefix(wl, "claim") && (r.ClaimLimit != 4 || r.Tasks <= full || r.Tasks > 4*full) {
				t.Errorf("%s with --claim-limit 4: claim limit %d, %d tasks in %d non-empty ops; want 1 to 4 per op, more than 1 on average",
					wl, r.ClaimLimit, r.Tasks, full)
			}
			// A --pg-dsn run deletes its rows afterwards.
			c := &config{workload: wl, queues: 8, groups: 8, prefix: prefix}
			if n, err := s.count(ctx, newLayout(c).queues); err != nil || n != 0 {
				t.Errorf("%s: %d rows left behind (%v)", wl, n, err)
			}
		}
	})
}

// claimOne claims one task of queue; ok is false when there is none.
func claimOne(ctx context.Context, s *pgStore, queue string) (t pgTask, ok bool, err error) {
	ts, err := s.claim(ctx, queue, 1)
	if len(ts) == 1 {
		t, ok = ts[0], true
	}
	return t, ok, err
}

// TestPostgresLocal runs --baseline postgres --local end to end: a server
// of its own, started and removed.
func TestPostgresLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	if err := pgAvailable(os.Getenv); err != nil {
		t.Skipf("PostgreSQL baseline not tested: %v", err)
	}
	before, _ := filepath.Glob(filepath.Join(os.TempDir(), "taskbench-pg-*"))
	out, stderr, code := runCLI(t, map[string]string{}, "--baseline", "postgres", "--local", "--workload", "claim-delete",
		"--prefill", "2000", "--clients", "4", "--duration", "1s")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"PostgreSQL ", "workload claim-delete via postgres, 4 clients", "tasks per fsync", "(0 failed)",
		"(of one core;"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	// The server's processes (the postmaster's tree) were read from /proc.
	if !regexp.MustCompile(`costs +xacts/task [0-9.]+  wal-fsyncs/task [0-9.]+  entries/sync [0-9.]+  wal-bytes/task [0-9]+`).MatchString(out) ||
		!regexp.MustCompile(`cpu-ms/task [0-9.]+ \(postgres [0-9.]+ bench [0-9.]+\)`).MatchString(out) ||
		!regexp.MustCompile(`bytes-written/task [0-9]+ \(postgres [0-9]+\)`).MatchString(out) {
		t.Errorf("PostgreSQL's CPU or bytes written not measured:\n%s", out)
	}
	after, _ := filepath.Glob(filepath.Join(os.TempDir(), "taskbench-pg-*"))
	for _, d := range after {
		if !slices.Contains(before, d) {
			t.Errorf("%s left behind", d)
		}
	}
}

func TestSuite(t *testing.T) {
	fake := func(ops float64) *result {
		return &result{Workload: "x", Loop: "closed", OpsPerSec: ops, TasksPerSec: ops, LogEntriesPerSec: 2 * ops, TasksPerEntry: 0.5,
			Latency: latencySummary{P50: 1.5, P99: 12.34, P999: 123.4}}
	}
	var ran [][]string
	run := func(ctx context.Context, args []string) (*result, error) {
		ran = append(ran, args)
		cfg := &config{}
		cmd := &cobra.Command{}
		addFlags(cmd, cfg) // the arguments must parse as taskbench's
		if err := cmd.Flags().Parse(bareLocal(args)); err != nil {
			return nil, fmt.Errorf("bad args %v: %v", args, err)
		}
		r := fake(100 * float64(len(ran)))
		r.Workload = cfg.workload
		if len(ran) == 5 { // the proxy's claim-delete, one process unreadable
			r.Costs = &costs{EntriesPerTask: ptr(2), SyncsPerTask: ptr(3.1), CPUMsPerTask: ptr(1.234), WriteBytesPerTask: ptr(61234.4)}
		}
		if len(ran) == 7 { // PostgreSQL: no log sync counter of its own
			r.Costs = &costs{EntriesPerTask: ptr(2.01), SyncsPerTask: ptr(0.49), CPUMsPerTask: ptr(0.5), CPUComplete: true}
		}
		if cfg.claim > 1 {
			r.ClaimLimit = cfg.claim
		}
		if cfg.rate > 0 {
			r.Loop = "open"
		}
		if len(ran) == 2 {
			return nil, fmt.Errorf("cluster did not start\nlogs in /tmp/x")
		}
		return r, nil
	}
	var out, errb strings.Builder
	o := &suiteOpts{benchtime: 5 * time.Second, output: "text"}
	err := runSuite(context.Background(), o, "", run, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "1 of 9 runs failed") {
		t.Errorf("runSuite: %v, want one failed run", err)
	}
	if len(ran) != 9 {
		t.Fatalf("ran %d rows", len(ran))
	}
	// #6 is the open loop at half of #4's 400 tasks/s, prefill automatic.
	if !slices.Contains(ran[5], "--rate") || ran[5][slices.Index(ran[5], "--rate")+1] != "200" {
		t.Errorf("open loop row %v: want --rate 200", ran[5])
	}
	if !slices.Contains(ran[7], "--claim-limit") || !slices.Contains(ran[8], "--claim-limit") || !slices.Contains(ran[8], "postgres") {
		t.Errorf("batched rows %v / %v", ran[7], ran[8])
	}
	if !slices.Contains(ran[3], "50000") || !slices.Contains(ran[6], "postgres") {
		t.Errorf("rows %v / %v", ran[3], ran[6])
	}
	text := out.String()
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) < 9 || strings.Count(lines[0], "|") != 15 {
		t.Fatalf("not one table:\n%s", text)
	}
	// "vs PG" compares each claim-delete row with PostgreSQL at the same
	// claim limit: #5 (500) with #7 (700), #8 (800) with #9 (900).
	for row, want := range map[string]string{"| 4 ": "0.57×", "| 5 ": "0.71×", "| 8 ": "0.89×"} {
		if i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, row) }); i < 0 || !strings.Contains(lines[i], want) {
			t.Errorf("row %q: want %s against PostgreSQL at its claim limit:\n%s", row, want, text)
		}
	}
	for _, want := range []string{
		"| 2 ", "error: cluster did not start", // the failed row, first line only
		"`taskbench --baseline postgres --local --workload claim-delete --prefill 50000 --clients 16 --duration 5s`",
		"| 700 ", "1.50 / 12.3 / 123", "0.71×", // #5 (500 tasks/s) against #7 (700)
		"via proxy (#5) / PostgreSQL (#7): 0.71× (direct, #4: 0.57×)",
		// #8 (800 tasks/s, 10 per claim) against #9 (900, 10 per claim)
		"| 800 ", "0.89×", "claiming 10 at a time, via proxy (#8) / PostgreSQL (#9): 0.89×.",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}
	// Cost columns: entries/task, requests/entry, msgs/request, syncs/task,
	// cpu-ms/task (≥: a process unread), bytes written/task; "-" where a
	// run has no costs.
	squeezed := regexp.MustCompile(` +`).ReplaceAllString(text, " ")
	for _, want := range []string{
		"| 500 | 500 | 1000 | 2.00 | - | - | 3.10 | ≥1.23 | 61234 | 1.50 / 12.3 / 123 |",
		"| 700 | 700 | 1400 | 2.01 | - | - | 0.49 | 0.50 | - | 1.50 / 12.3 / 123 |",
		"| 100 | 100 | 200 | - | - | - | - | - | - | 1.50 / 12.3 / 123 |",
	} {
		if !strings.Contains(squeezed, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}

	// Without PostgreSQL the row says why and there is no ratio.
	ran = nil
	out.Reset()
	if err := runSuite(context.Background(), o, "PostgreSQL not found", run, &out, &errb); err == nil {
		t.Error("want the failed row reported")
	}
	if len(ran) != 7 || strings.Count(out.String(), "skipped: PostgreSQL not found") != 2 ||
		!strings.Contains(out.String(), "not measured") {
		t.Errorf("ran %d rows; table:\n%s", len(ran), out.String())
	}
}
