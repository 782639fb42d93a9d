package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// opTimeout bounds one RPC; a slower one counts as an error.
const opTimeout = 10 * time.Second

func randomID() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// layout names the queues: queue i is in group i%groups. For claim-move
// every queue has a partner stage, "<queue>-next", in the same group.
type layout struct {
	queues []string
	next   map[string]string // claim-move: stage -> following stage
}

func newLayout(c *config) layout {
	var l layout
	for i := range c.queues {
		l.queues = append(l.queues, fmt.Sprintf("%s-g%d/q%d", c.prefix, i%c.groups, i))
	}
	if c.workload == "claim-move" {
		l.next = map[string]string{}
		base := l.queues
		l.queues = nil
		for _, q := range base {
			n := q + "-next"
			l.next[q], l.next[n] = n, q
			l.queues = append(l.queues, q, n)
		}
	}
	return l
}

// worker is one client goroutine's state and tallies.
type worker struct {
	id     int
	c      *client.Client
	pg     *pgStore // --baseline postgres: the same ops against PostgreSQL
	cfg    *config
	lay    layout
	value  []byte
	rng    *mrand.Rand
	turn   int
	ops    hist             // one per op, the unit of the workload
	rpcs   map[string]*hist // per RPC kind
	errs   map[string]int   // gRPC code name -> count
	tasks  int64            // tasks inserted, deleted or moved
	empty  int64            // claims that found nothing
	nrpcs  int64
	failed int64 // ops with an error
	// held: tasks the last commit claimed with it, which the next op
	// commits (claim workloads without --two-calls).
	held   []*taskstorepb.Task
	pgHeld []pgTask // the same against PostgreSQL
	// produce: the worker's producer and its inserts in flight, oldest
	// first.
	prod   *client.Producer
	window []sent
}

// sent is an insert of the produce workload in flight.
type sent struct {
	f     *client.Pending
	start time.Time
}

func newWorker(id int, c *client.Client, cfg *config, lay layout, value []byte) *worker {
	return &worker{id: id, c: c, cfg: cfg, lay: lay, value: value,
		rng: mrand.New(mrand.NewPCG(uint64(id), uint64(time.Now().UnixNano()))), turn: id,
		rpcs: map[string]*hist{}, errs: map[string]int{}}
}

func (w *worker) queue() string {
	w.turn++
	return w.lay.queues[w.turn%len(w.lay.queues)]
}

// rpc times fn under kind and tallies its error.
func (w *worker) rpc(ctx context.Context, kind string, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	start := time.Now()
	err := fn(ctx)
	h := w.rpcs[kind]
	if h == nil {
		h = &hist{}
		w.rpcs[kind] = h
	}
	h.record(time.Since(start))
	w.nrpcs++
	if err != nil {
		w.errs[codeOf(err)]++
	}
	return err
}

func codeOf(err error) string {
	if code, ok := pgCode(err); ok {
		return code
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return codes.DeadlineExceeded.String()
	}
	if errors.Is(err, context.Canceled) {
		return codes.Canceled.String()
	}
	if s, ok := status.FromError(err); ok {
		return s.Code().String()
	}
	return codes.Unknown.String()
}

func (w *worker) insert(ctx context.Context, n int) error {
	q := w.queue()
	ins := make([]*taskstorepb.TaskInsert, n)
	for i := range ins {
		ins[i] = &taskstorepb.TaskInsert{Queue: q, Value: w.value}
	}
	err := w.rpc(ctx, "insert", func(ctx context.Context) error {
		_, err := w.c.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: ins})
		return err
	})
	if err == nil {
		w.tasks += int64(n)
	}
	return err
}

// produce sends one insert through the worker's Producer; once --inflight
// are in flight it first waits for the oldest and tallies it (its latency
// runs from when it was sent). The last window of a run is not tallied.
func (w *worker) produce(ctx context.Context) error {
	if w.prod == nil {
		w.prod = w.c.NewProducer(client.WithInflight(w.cfg.inflight))
	}
	var err error
	if len(w.window) >= w.cfg.inflight {
		old := w.window[0]
		w.window = w.window[1:]
		_, err = old.f.Result()
		h := w.rpcs["produce"]
		if h == nil {
			h = &hist{}
			w.rpcs["produce"] = h
		}
		h.record(time.Since(old.start))
		w.nrpcs++
		if err != nil {
			w.errs[codeOf(err)]++
		} else {
			w.tasks++
		}
	}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	f := w.prod.Insert(octx, &taskstorepb.TaskInsert{Queue: w.queue(), Value: w.value})
	go func() { <-f.Done(); cancel() }()
	w.window = append(w.window, sent{f: f, start: time.Now()})
	return err
}

// claimThen claims up to --claim-limit tasks and deletes them, or moves
// them to their next stage, in one Modify. By default that Modify also
// claims the next tasks of the same queue (one request and one log entry
// per task, as a Worker does), which the next op commits: a plain Claim is
// made only when the worker holds nothing (its first op, or after a commit
// found the queue empty or failed). --two-calls claims and commits in two
// requests every op.
func (w *worker) claimThen(ctx context.Context, move bool) error {
	tasks := w.held
	w.held = nil
	if len(tasks) == 0 {
		q := w.queue()
		err := w.rpc(ctx, "claim", func(ctx context.Context) error {
			resp, err := w.c.Claim(ctx, &taskstorepb.ClaimRequest{Queues: []string{q}, Limit: uint32(w.cfg.claim)})
			tasks = resp.GetTasks()
			return err
		})
		if err != nil {
			return err
		}
		if len(tasks) == 0 {
			w.empty++
			return nil
		}
	}
	req := &taskstorepb.ModifyRequest{}
	kind := "delete"
	if move {
		kind = "move"
		req.Changes = make([]*taskstorepb.TaskChange, len(tasks))
		for i, t := range tasks {
			req.Changes[i] = &taskstorepb.TaskChange{Id: t.Id, Version: t.Version, Queue: t.Queue, NewQueue: w.lay.next[t.Queue]}
		}
	} else {
		req.Deletes = make([]*taskstorepb.TaskRef, len(tasks))
		for i, t := range tasks {
			req.Deletes[i] = &taskstorepb.TaskRef{Id: t.Id, Version: t.Version, Queue: t.Queue}
		}
	}
	if !w.cfg.twoCalls {
		// Claimed from one queue, so all in its group.
		req.Claim = &taskstorepb.ModifyClaim{Queues: []string{tasks[0].Queue}, Limit: uint32(w.cfg.claim)}
		kind += "+claim"
	}
	err := w.rpc(ctx, kind, func(ctx context.Context) error {
		resp, err := w.c.Modify(ctx, req)
		w.held = resp.GetClaimed()
		return err
	})
	if err == nil {
		w.tasks += int64(len(tasks))
	}
	return err
}

// op runs one unit of the workload.
func (w *worker) op(ctx context.Context) error {
	insert, claimThen := w.insert, w.claimThen
	if w.pg != nil {
		insert, claimThen = w.pgInsert, w.pgClaimThen
	}
	switch w.cfg.workload {
	case "insert":
		return insert(ctx, 1)
	case "insert-batch":
		return insert(ctx, w.cfg.batch)
	case "produce":
		return w.produce(ctx)
	case "claim-delete":
		return claimThen(ctx, false)
	case "claim-move":
		return claimThen(ctx, true)
	default: // mixed
		if w.rng.IntN(2) == 0 {
			return insert(ctx, 1)
		}
		return claimThen(ctx, false)
	}
}

// prefill inserts n tasks spread evenly over the queues, in batches of
// --batch (100 to 1000), with the workers' concurrency, through insert (one
// batch of n tasks into queue). Not measured.
func prefill(ctx context.Context, cfg *config, lay layout, n int, insert func(ctx context.Context, queue string, n int) error) error {
	if n == 0 {
		return nil
	}
	type job struct {
		queue string
		n     int
	}
	jobs := make(chan job)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(jobs)
		per, extra := n/len(lay.queues), n%len(lay.queues)
		for i, q := range lay.queues {
			left := per
			if i < extra {
				left++
			}
			for left > 0 {
				b := min(left, max(cfg.batch, 100), 1000)
				left -= b
				select {
				case jobs <- job{q, b}:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		return nil
	})
	for range min(cfg.clients, 16) {
		g.Go(func() error {
			for j := range jobs {
				if err := insert(ctx, j.queue, j.n); err != nil {
					return fmt.Errorf("prefill: %w", err)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// clusterInsert is prefill's insert for a Taskstore cluster: one Modify.
func clusterInsert(c *client.Client, value []byte) func(ctx context.Context, queue string, n int) error {
	return func(ctx context.Context, queue string, n int) error {
		ins := make([]*taskstorepb.TaskInsert, n)
		for i := range ins {
			ins[i] = &taskstorepb.TaskInsert{Queue: queue, Value: value}
		}
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: ins})
		return err
	}
}

// result is everything the report shows; -o json prints it as is.
type result struct {
	Workload  string `json:"workload"`
	Via       string `json:"via"`
	Endpoints string `json:"endpoints"`
	Local     int    `json:"local_nodes,omitempty"`
	// GOMAXPROCS of each process of a --local cluster.
	LocalGOMAXPROCS string  `json:"local_gomaxprocs,omitempty"`
	Clients         int     `json:"clients"`
	Loop            string  `json:"loop"`
	TargetRate      float64 `json:"target_rate,omitempty"`
	Duration        float64 `json:"duration_s"`
	Elapsed         float64 `json:"elapsed_s"`
	ValueSize       int     `json:"value_size"`
	Queues          int     `json:"queues"`
	Groups          int     `json:"groups"`
	Batch           int     `json:"batch,omitempty"`
	Inflight        int     `json:"inflight,omitempty"` // produce: inserts in flight per worker
	ClaimLimit      int     `json:"claim_limit,omitempty"`
	// Claim workloads: claim and commit in two requests (--two-calls)
	// instead of a commit that carries the next claim.
	TwoCalls bool `json:"two_calls,omitempty"`
	Prefill  int  `json:"prefill"`

	Ops         int64                     `json:"ops"`
	OpsPerSec   float64                   `json:"ops_per_sec"`
	FailedOps   int64                     `json:"failed_ops"`
	RPCs        int64                     `json:"rpcs"`
	RPCsPerSec  float64                   `json:"rpcs_per_sec"`
	Tasks       int64                     `json:"tasks"`
	TasksPerSec float64                   `json:"tasks_per_sec"`
	EmptyClaims int64                     `json:"empty_claims"`
	Errors      map[string]int            `json:"errors_by_code"`
	Latency     latencySummary            `json:"op_latency"`
	RPCLatency  map[string]latencySummary `json:"rpc_latency"`

	// Log entries the shard leaders committed during the run (one fsync of
	// the leader's log each), from /metrics.
	// With --baseline postgres: WAL fsyncs (pg_stat_wal.wal_sync), the
	// equivalent of a leader's log fsync, and committed transactions.
	LogEntries       float64 `json:"log_entries"`
	LogEntriesPerSec float64 `json:"log_entries_per_sec"`
	TasksPerEntry    float64 `json:"tasks_per_log_entry"`
	CommitIndexDelta float64 `json:"commit_index_delta"`
	MetricsError     string  `json:"metrics_error,omitempty"`

	Baseline  string  `json:"baseline,omitempty"`   // "postgres" when --baseline postgres
	PGVersion string  `json:"pg_version,omitempty"` // server_version
	PGCommits float64 `json:"pg_commits,omitempty"` // pg_stat_database.xact_commit delta

	Costs *costs `json:"costs,omitempty"` // per task, over the measured interval (cost.go)
}

func run(ctx context.Context, cfg *config, stdout, stderr io.Writer, getenv func(string) string) error {
	res, err := bench(ctx, cfg, stderr, getenv)
	if err != nil {
		return err
	}
	return report(stdout, cfg.output, res)
}

// bench runs one benchmark as cfg says and returns its result; progress
// goes to stderr with -o text.
func bench(ctx context.Context, cfg *config, stderr io.Writer, getenv func(string) string) (*result, error) {
	if cfg.baseline == "postgres" {
		return benchPostgres(ctx, cfg, stderr, getenv)
	}
	endpoints := cfg.endpoints
	var lc *localCluster
	var opts []client.Option
	opts = append(opts, client.WithClaimant("taskbench-"+randomID()))
	if cfg.local > 0 {
		if cfg.output == "text" {
			fmt.Fprintf(stderr, "starting a local cluster of %d nodes...\n", cfg.local)
		}
		var err error
		lc, err = startLocal(ctx, cfg.local, cfg.shards, cfg.via == "proxy", getenv)
		if err != nil {
			return nil, err
		}
		defer lc.stop()
		endpoints = strings.Join(lc.nodes, ",")
		if cfg.via == "proxy" {
			endpoints = lc.proxy
		}
	}
	if cfg.via == "proxy" {
		opts = append(opts, client.WithProxyOnly())
	}
	c, err := client.Dial(ctx, endpoints, opts...)
	if err != nil {
		return nil, err
	}
	defer c.Close()

	lay := newLayout(cfg)
	value := make([]byte, cfg.valueSize)
	rand.Read(value)
	if cfg.prefill > 0 {
		if cfg.output == "text" {
			fmt.Fprintf(stderr, "prefilling %d tasks over %d queues...\n", cfg.prefill, len(lay.queues))
		}
		if err := prefill(ctx, cfg, lay, cfg.prefill, clusterInsert(c, value)); err != nil {
			return nil, err
		}
	}

	res := newResult(cfg, endpoints, len(lay.queues))
	if lc != nil {
		res.LocalGOMAXPROCS = lc.gomaxprocs
	}
	before, merr := scrapeCluster(ctx, c)
	before.scrapeProxy(ctx, lc.proxyHTTP())

	if cfg.output == "text" {
		fmt.Fprintf(stderr, "running %s for %v with %d clients...\n", cfg.workload, cfg.duration, cfg.clients)
	}
	workers := make([]*worker, cfg.clients)
	for i := range workers {
		workers[i] = newWorker(i, c, cfg, lay, value)
	}
	var profiles func() error
	if cfg.profile != "" {
		profiles = startProfiles(ctx, cfg.profile, lc.profiled, cfg.duration)
	}
	meter := startCosts(lc.metered())
	elapsed, err := measure(ctx, cfg, workers)
	meter.stop()
	if err != nil {
		return nil, err
	}
	if profiles != nil {
		if err := profiles(); err != nil {
			return nil, err
		}
		if cfg.output == "text" {
			fmt.Fprintf(stderr, "profiles written to %s (go tool pprof -top %s/n1-cpu.pprof)\n", cfg.profile, cfg.profile)
		}
	}

	after, merr2 := scrapeCluster(context.WithoutCancel(ctx), c)
	after.scrapeProxy(context.WithoutCancel(ctx), lc.proxyHTTP())
	res.tally(workers, elapsed)
	secs := elapsed.Seconds()
	if err := errors.Join(merr, merr2); err != nil {
		res.MetricsError = err.Error()
	} else {
		res.setLogEntries(after.entries()-before.entries(), secs)
		res.CommitIndexDelta = after.commitIndex - before.commitIndex
	}
	res.setClusterCosts(cfg, meter, before, after, errors.Join(merr, merr2))
	return res, nil
}

// setLogEntries records n log entries (fsyncs) over secs of measuring.
func (r *result) setLogEntries(n, secs float64) {
	r.LogEntries = n
	r.LogEntriesPerSec = round(n/secs, 1)
	if n > 0 {
		r.TasksPerEntry = round(float64(r.Tasks)/n, 2)
	}
}

func newResult(cfg *config, endpoints string, queues int) *result {
	res := &result{Workload: cfg.workload, Via: cfg.via, Endpoints: endpoints, Local: cfg.local, Clients: cfg.clients,
		Loop: "closed", TargetRate: cfg.rate, Duration: cfg.duration.Seconds(), ValueSize: cfg.valueSize,
		Queues: queues, Groups: cfg.groups, Prefill: cfg.prefill}
	if cfg.rate > 0 {
		res.Loop = "open"
	}
	if cfg.workload == "insert-batch" {
		res.Batch = cfg.batch
	}
	if cfg.workload == "produce" {
		res.Inflight = cfg.inflight
	}
	if cfg.workload != "insert" && cfg.workload != "insert-batch" && cfg.workload != "produce" {
		res.ClaimLimit = cfg.claim
		res.TwoCalls = cfg.twoCalls
	}
	return res
}

// measure runs the workers for cfg.duration, closed or open loop, and
// returns the time it took.
func measure(ctx context.Context, cfg *config, workers []*worker) (time.Duration, error) {
	start := time.Now()
	end := start.Add(cfg.duration)
	var wg sync.WaitGroup
	if cfg.rate > 0 {
		interval := time.Duration(float64(time.Second) / cfg.rate)
		var next atomic.Int64
		for _, w := range workers {
			wg.Go(func() {
				for ctx.Err() == nil {
					k := next.Add(1) - 1
					sched := start.Add(time.Duration(k) * interval)
					if !sched.Before(end) {
						return
					}
					if d := time.Until(sched); d > 0 {
						select {
						case <-time.After(d):
						case <-ctx.Done():
							return
						}
					}
					err := w.op(ctx)
					w.ops.record(time.Since(sched))
					if err != nil {
						w.failed++
					}
				}
			})
		}
	} else {
		for _, w := range workers {
			wg.Go(func() {
				for ctx.Err() == nil && time.Now().Before(end) {
					t0 := time.Now()
					err := w.op(ctx)
					w.ops.record(time.Since(t0))
					if err != nil {
						w.failed++
					}
				}
			})
		}
	}
	wg.Wait()
	return time.Since(start), ctx.Err()
}

// tally merges the workers' counts and histograms into res.
func (res *result) tally(workers []*worker, elapsed time.Duration) {
	var all hist
	rpcs := map[string]*hist{}
	res.Errors = map[string]int{}
	for _, w := range workers {
		all.merge(&w.ops)
		for k, h := range w.rpcs {
			if rpcs[k] == nil {
				rpcs[k] = &hist{}
			}
			rpcs[k].merge(h)
		}
		for k, n := range w.errs {
			res.Errors[k] += n
		}
		res.Tasks += w.tasks
		res.EmptyClaims += w.empty
		res.RPCs += w.nrpcs
		res.FailedOps += w.failed
	}
	secs := elapsed.Seconds()
	res.Elapsed = round(secs, 3)
	res.Ops = int64(all.count())
	res.OpsPerSec = round(float64(res.Ops)/secs, 1)
	res.RPCsPerSec = round(float64(res.RPCs)/secs, 1)
	res.TasksPerSec = round(float64(res.Tasks)/secs, 1)
	res.Latency = all.summary()
	res.RPCLatency = map[string]latencySummary{}
	for k, h := range rpcs {
		res.RPCLatency[k] = h.summary()
	}
}
