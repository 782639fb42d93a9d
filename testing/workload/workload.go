package workload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// Config shapes a workload. Zero fields take the defaults of Defaults.
type Config struct {
	// Prefix starts every consistency group of the run (groups are
	// Prefix0, Prefix1, ...), so that a run's tasks can be listed apart.
	Prefix string
	// Groups is the number of consistency groups (spread over shards).
	Groups int

	Inserters  int // insert new tasks into <group>/in
	Workers    int // claim <group>/in, commit by delete or move, or abandon
	TxnWorkers int // claim <group>/mid, commit by a dependency transaction
	Zombies    int // claim, sleep past the lease, let another claim, commit late
	Impatient  int // inserts and commits with a short deadline (unknown outcomes)
	Readers    int // read random known tasks by id

	// Lease of the workers' claims; ZombieLease of the zombies'.
	Lease       time.Duration
	ZombieLease time.Duration
	// OpTimeout bounds each operation; ImpatientTimeout the impatient
	// client's.
	OpTimeout        time.Duration
	ImpatientTimeout time.Duration
	// Pace is the pause between two operations of one goroutine.
	Pace time.Duration
	// AbandonRate is the fraction of claims a worker never commits (a
	// crashed worker: the lease runs out and the task is claimed again).
	AbandonRate float64
	// BadDependRate is the fraction of transactions that depend on a stale
	// version, and must be refused.
	BadDependRate float64
}

// Defaults is a modest load for a 2-core machine under -race.
// Scaled returns c with k times its inserters, workers, transaction
// workers, impatient clients and readers (zombies stay: they exist to be
// refused, not to load the cluster). k <= 1 returns c.
func (c Config) Scaled(k int) Config {
	if k <= 1 {
		return c
	}
	c.Inserters, c.Workers, c.TxnWorkers, c.Impatient, c.Readers =
		k*c.Inserters, k*c.Workers, k*c.TxnWorkers, k*c.Impatient, k*c.Readers
	return c
}

var Defaults = Config{
	Prefix: "wl", Groups: 4,
	Inserters: 2, Workers: 2, TxnWorkers: 1, Zombies: 1, Impatient: 1, Readers: 1,
	Lease: 3 * time.Second, ZombieLease: 800 * time.Millisecond,
	OpTimeout: 20 * time.Second, ImpatientTimeout: 250 * time.Millisecond,
	Pace: 5 * time.Millisecond, AbandonRate: 0.05, BadDependRate: 0.15,
}

func (c Config) withDefaults() Config {
	d := Defaults
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	if c.Groups == 0 {
		c.Groups = d.Groups
	}
	if c.Lease == 0 {
		c.Lease = d.Lease
	}
	if c.ZombieLease == 0 {
		c.ZombieLease = d.ZombieLease
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = d.OpTimeout
	}
	if c.ImpatientTimeout == 0 {
		c.ImpatientTimeout = d.ImpatientTimeout
	}
	if c.Pace == 0 {
		c.Pace = d.Pace
	}
	return c
}

// Group returns the name of group g.
func (c Config) Group(g int) string { return fmt.Sprintf("%s%d", c.Prefix, g) }

// Queue stages of a group.
const (
	StageIn     = "in"   // inserted here
	StageMid    = "mid"  // moved here by a worker, consumed by transactions
	StageDone   = "done" // moved here by a worker; terminal, depended on
	StageOut    = "out"  // children inserted by transactions; terminal
	StageZombie = "z"    // zombie rounds
)

// Queue returns the queue of stage in group g.
func (c Config) Queue(g int, stage string) string { return c.Group(g) + "/" + stage }

// Workload is a running workload.
type Workload struct {
	cfg  Config
	h    *History
	dial func(ctx context.Context) (*client.Client, error)

	stop    chan struct{}
	stopped sync.Once
	wg      sync.WaitGroup
	seq     atomic.Uint64

	mu    sync.Mutex // guards done, known
	done  map[int][]Ref
	known []string
}

// Start launches the workload's goroutines. dial makes a client per
// goroutine (each has its own routing table and sessions). Stop ends it.
func Start(cfg Config, h *History, dial func(ctx context.Context) (*client.Client, error)) (*Workload, error) {
	cfg = cfg.withDefaults()
	w := &Workload{cfg: cfg, h: h, dial: dial, stop: make(chan struct{}), done: map[int][]Ref{}}
	type role struct {
		name string
		n    int
		run  func(cl *client.Client, name string, rng *rand.Rand)
	}
	roles := []role{
		{"insert", cfg.Inserters, w.inserter},
		{"worker", cfg.Workers, w.worker},
		{"txn", cfg.TxnWorkers, w.txnWorker},
		{"zombie", cfg.Zombies, w.zombie},
		{"impatient", cfg.Impatient, w.impatient},
		{"reader", cfg.Readers, w.reader},
	}
	var clients []*client.Client
	for _, r := range roles {
		for i := 0; i < r.n; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), cfg.OpTimeout)
			cl, err := dial(ctx)
			cancel()
			if err != nil {
				for _, c := range clients {
					c.Close()
				}
				return nil, fmt.Errorf("workload: dial: %w", err)
			}
			clients = append(clients, cl)
			name := fmt.Sprintf("%s%d", r.name, i)
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(len(clients))))
			w.wg.Add(1)
			go func() {
				defer w.wg.Done()
				defer cl.Close()
				r.run(cl, name, rng)
			}()
		}
	}
	return w, nil
}

// Stop asks every goroutine to finish its current operation and waits for
// them. Operations in flight keep their own deadline (OpTimeout), so they
// are not turned into unknown outcomes by the stop.
func (w *Workload) Stop() {
	w.stopped.Do(func() { close(w.stop) })
	w.wg.Wait()
}

// Config is the workload's configuration, with defaults applied.
func (w *Workload) Config() Config { return w.cfg }

func (w *Workload) stopping() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// sleep pauses for d or until Stop; it reports whether to go on.
func (w *Workload) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.stop:
		return false
	case <-t.C:
		return true
	}
}

func (w *Workload) newID(kind string) string {
	return fmt.Sprintf("%s-%s%d", w.cfg.Prefix, kind, w.seq.Add(1))
}

func (w *Workload) remember(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.known) < 4096 {
		w.known = append(w.known, id)
	} else {
		w.known[rand.IntN(len(w.known))] = id
	}
}

func (w *Workload) ctx(timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout == 0 {
		timeout = w.cfg.OpTimeout
	}
	return context.WithTimeout(context.Background(), timeout)
}

// insert records one insert of a fresh id into queue.
func (w *Workload) insert(cl *client.Client, worker, queue string, timeout time.Duration) (string, bool) {
	id := w.newID("t")
	op := w.h.Begin(&Op{Worker: worker, Kind: KindInsert, Inserts: []Insert{{ID: id, Queue: queue}}})
	ctx, cancel := w.ctx(timeout)
	t, err := cl.Insert(ctx, queue, []byte(id), client.WithID(id))
	cancel()
	if err == nil {
		op.Tasks = []TaskVersion{FromTask(t)}
	}
	w.h.Finish(op, err)
	if err == nil || op.Outcome == Unknown {
		w.remember(id)
	}
	return id, err == nil
}

// claim records one claim.
func (w *Workload) claim(cl *client.Client, worker, claimant, queue string, lease time.Duration, limit uint32, wait time.Duration) []TaskVersion {
	op := w.h.Begin(&Op{Worker: worker, Kind: KindClaim, Claimant: claimant, Queues: []string{queue}, Lease: lease})
	ctx, cancel := w.ctx(0)
	req := &taskstorepb.ClaimRequest{Claimant: claimant, Queues: []string{queue}, Lease: durationpb.New(lease), Limit: limit}
	if wait > 0 {
		req.Wait = durationpb.New(wait)
	}
	resp, err := cl.Claim(ctx, req)
	cancel()
	if err == nil {
		for _, t := range resp.Tasks {
			op.Tasks = append(op.Tasks, FromTask(t))
		}
	}
	w.h.Finish(op, err)
	return op.Tasks
}

// modify records one transaction.
func (w *Workload) modify(cl *client.Client, op *Op, req *taskstorepb.ModifyRequest, timeout time.Duration) (*taskstorepb.ModifyResponse, error) {
	w.h.Begin(op)
	ctx, cancel := w.ctx(timeout)
	resp, err := cl.Modify(ctx, req)
	cancel()
	if err == nil {
		for _, t := range resp.Inserted {
			op.Tasks = append(op.Tasks, FromTask(t))
		}
		for _, t := range resp.Changed {
			op.Tasks = append(op.Tasks, FromTask(t))
		}
	}
	w.h.Finish(op, err)
	return resp, err
}

// commitDelete deletes a claimed version.
func (w *Workload) commitDelete(cl *client.Client, worker string, t TaskVersion, timeout time.Duration, zombie, usurped bool) error {
	op := &Op{Worker: worker, Kind: KindCommit, Claimant: t.Claimant, Deletes: []Ref{{t.ID, t.Version}}, Zombie: zombie, Usurped: usurped}
	_, err := w.modify(cl, op, &taskstorepb.ModifyRequest{Claimant: t.Claimant,
		Deletes: []*taskstorepb.TaskRef{{Id: t.ID, Version: t.Version, Queue: t.Queue}}}, timeout)
	return err
}

// commitMove moves a claimed version to another queue of its group.
func (w *Workload) commitMove(cl *client.Client, worker string, t TaskVersion, to string) (*taskstorepb.ModifyResponse, error) {
	op := &Op{Worker: worker, Kind: KindCommit, Claimant: t.Claimant, Changes: []Change{{t.ID, t.Version, to}}}
	return w.modify(cl, op, &taskstorepb.ModifyRequest{Claimant: t.Claimant,
		Changes: []*taskstorepb.TaskChange{{Id: t.ID, Version: t.Version, Queue: t.Queue, NewQueue: to}}}, 0)
}

// release ends a claim and makes the task available at once.
func (w *Workload) release(cl *client.Client, worker string, t TaskVersion) {
	op := &Op{Worker: worker, Kind: KindCommit, Claimant: t.Claimant, Changes: []Change{{ID: t.ID, Version: t.Version}}}
	w.modify(cl, op, &taskstorepb.ModifyRequest{Claimant: t.Claimant,
		Changes: []*taskstorepb.TaskChange{{Id: t.ID, Version: t.Version, Queue: t.Queue, Delay: durationpb.New(0)}}}, 0)
}

func (w *Workload) inserter(cl *client.Client, name string, rng *rand.Rand) {
	for !w.stopping() {
		w.insert(cl, name, w.cfg.Queue(rng.IntN(w.cfg.Groups), StageIn), 0)
		if !w.sleep(w.cfg.Pace) {
			return
		}
	}
}

// worker claims from <group>/in and, per task: abandons it (lease runs
// out), moves it to mid or done, or deletes it.
func (w *Workload) worker(cl *client.Client, name string, rng *rand.Rand) {
	claimant := w.cfg.Prefix + "-" + name
	for !w.stopping() {
		g := rng.IntN(w.cfg.Groups)
		tasks := w.claim(cl, name, claimant, w.cfg.Queue(g, StageIn), w.cfg.Lease, uint32(1+rng.IntN(2)), 100*time.Millisecond)
		for _, t := range tasks {
			switch r := rng.Float64(); {
			case r < w.cfg.AbandonRate:
				// crashed worker: never commits
			case r < 0.45:
				w.commitMove(cl, name, t, w.cfg.Queue(g, StageMid))
			case r < 0.7:
				if resp, err := w.commitMove(cl, name, t, w.cfg.Queue(g, StageDone)); err == nil && len(resp.Changed) == 1 {
					w.mu.Lock()
					w.done[g] = append(w.done[g], Ref{resp.Changed[0].Id, resp.Changed[0].Version})
					w.mu.Unlock()
				}
			default:
				w.commitDelete(cl, name, t, 0, false, false)
			}
		}
		if !w.sleep(w.cfg.Pace) {
			return
		}
	}
}

// txnWorker claims from <group>/mid and commits each task by a transaction
// that deletes it, inserts a child into <group>/out and depends on a task
// of <group>/done; some depend on a stale version and must be refused, after
// which the task is released or left to its lease.
func (w *Workload) txnWorker(cl *client.Client, name string, rng *rand.Rand) {
	claimant := w.cfg.Prefix + "-" + name
	for !w.stopping() {
		g := rng.IntN(w.cfg.Groups)
		tasks := w.claim(cl, name, claimant, w.cfg.Queue(g, StageMid), w.cfg.Lease, 1, 100*time.Millisecond)
		for _, t := range tasks {
			child := t.ID + ".c"
			op := &Op{Worker: name, Kind: KindTxn, Claimant: claimant,
				Deletes: []Ref{{t.ID, t.Version}}, Inserts: []Insert{{child, w.cfg.Queue(g, StageOut)}}}
			req := &taskstorepb.ModifyRequest{Claimant: claimant,
				Deletes: []*taskstorepb.TaskRef{{Id: t.ID, Version: t.Version, Queue: t.Queue}},
				Inserts: []*taskstorepb.TaskInsert{{Id: child, Queue: w.cfg.Queue(g, StageOut), Value: []byte(t.ID)}}}
			w.mu.Lock()
			if done := w.done[g]; len(done) > 0 {
				d := done[rng.IntN(len(done))]
				if rng.Float64() < w.cfg.BadDependRate {
					d.Version-- // a stale version: done tasks are at version >= 3
				}
				op.Depends = []Ref{d}
				req.Depends = []*taskstorepb.TaskRef{{Id: d.ID, Version: d.Version, Queue: w.cfg.Queue(g, StageDone)}}
			}
			w.mu.Unlock()
			_, err := w.modify(cl, op, req, 0)
			if err == nil {
				w.remember(child)
			} else if op.Outcome == Failed && rng.IntN(2) == 0 {
				w.release(cl, name, t)
			}
		}
		if !w.sleep(w.cfg.Pace) {
			return
		}
	}
}

// zombie runs rounds: insert a task into its own queue, claim it with a
// short lease, sleep past the lease, have a second claimant claim it, then
// try to commit the first claim's version (which must be refused when the
// second claim got the task), and let the second claimant delete it.
func (w *Workload) zombie(cl *client.Client, name string, rng *rand.Rand) {
	zombie, usurper := w.cfg.Prefix+"-"+name, w.cfg.Prefix+"-"+name+"-usurper"
	for !w.stopping() {
		g := rng.IntN(w.cfg.Groups)
		queue := w.cfg.Queue(g, StageZombie) + name
		w.insert(cl, name, queue, 0)
		held := w.claim(cl, name, zombie, queue, w.cfg.ZombieLease, 1, 0)
		if len(held) == 0 {
			continue
		}
		// Pause past the lease, as a stopped or partitioned worker would.
		time.Sleep(w.cfg.ZombieLease + w.cfg.ZombieLease/2 + 200*time.Millisecond)
		taken := w.claim(cl, name, usurper, queue, w.cfg.Lease, 10, 0)
		usurped := false
		for _, t := range taken {
			usurped = usurped || t.ID == held[0].ID
		}
		w.commitDelete(cl, name, held[0], 0, true, usurped)
		for _, t := range taken {
			w.commitDelete(cl, name, t, 0, false, false)
		}
		if !w.sleep(w.cfg.Pace) {
			return
		}
	}
}

// impatient inserts and commits with a short deadline, so that faults turn
// its operations into unknown outcomes (its claims use the normal deadline:
// see docs/testing.md).
func (w *Workload) impatient(cl *client.Client, name string, rng *rand.Rand) {
	claimant := w.cfg.Prefix + "-" + name
	for !w.stopping() {
		g := rng.IntN(w.cfg.Groups)
		w.insert(cl, name, w.cfg.Queue(g, StageIn), w.cfg.ImpatientTimeout)
		for _, t := range w.claim(cl, name, claimant, w.cfg.Queue(g, StageIn), w.cfg.Lease, 1, 0) {
			w.commitDelete(cl, name, t, w.cfg.ImpatientTimeout, false, false)
		}
		if !w.sleep(w.cfg.Pace) {
			return
		}
	}
}

// reader reads known tasks by id (a linearizable read at each shard's
// leader).
func (w *Workload) reader(cl *client.Client, name string, rng *rand.Rand) {
	for !w.stopping() {
		w.mu.Lock()
		var ids []string
		for i := 0; i < 3 && len(w.known) > 0; i++ {
			ids = append(ids, w.known[rng.IntN(len(w.known))])
		}
		w.mu.Unlock()
		if len(ids) > 0 {
			op := w.h.Begin(&Op{Worker: name, Kind: KindRead, Reads: ids})
			ctx, cancel := w.ctx(0)
			resp, err := cl.Tasks(ctx, &taskstorepb.TasksRequest{Ids: ids, OmitValues: true})
			cancel()
			if err == nil {
				for _, t := range resp.Tasks {
					op.Tasks = append(op.Tasks, FromTask(t))
				}
			}
			w.h.Finish(op, err)
		}
		if !w.sleep(10 * w.cfg.Pace) {
			return
		}
	}
}

// ReadFinal lists every task of every queue whose name starts with prefix,
// through linearizable reads at the shard leaders.
func ReadFinal(ctx context.Context, cl *client.Client, prefix string) (*Final, error) {
	f := &Final{Start: time.Now()}
	queues, err := cl.ListQueues(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	for _, q := range queues {
		token := ""
		for {
			resp, err := cl.Tasks(ctx, &taskstorepb.TasksRequest{Queue: q.Name, Limit: 1000, PageToken: token, OmitValues: true})
			if err != nil {
				return nil, fmt.Errorf("list %s: %w", q.Name, err)
			}
			for _, t := range resp.Tasks {
				f.Tasks = append(f.Tasks, FromTask(t))
			}
			if token = resp.NextPageToken; token == "" {
				break
			}
		}
	}
	f.End = time.Now()
	return f, nil
}
