package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// More aliases of the API's messages, for Results.
type (
	TaskInsert = taskstorepb.TaskInsert
	TaskChange = taskstorepb.TaskChange
	TaskRef    = taskstorepb.TaskRef
)

// NewInsert builds an insert for Result.Inserts (or a ModifyRequest), with
// the same options as Insert.
func NewInsert(queue string, value []byte, opts ...InsertOption) *TaskInsert {
	in := &taskstorepb.TaskInsert{Queue: queue, Value: value}
	for _, o := range opts {
		o(in)
	}
	return in
}

// Ref names the version of t, for Result.Depends and Result.Deletes.
func Ref(t *Task) *TaskRef {
	return &taskstorepb.TaskRef{Id: t.Id, Version: t.Version, Queue: t.Queue}
}

// Handler does the work of one claimed task. It returns what to commit, or an
// error to have the task retried later (see Worker).
//
// ctx ends when the Worker's Run context does (shutdown) or when the task is
// lost: a lease renewal was refused because the claimed version no longer
// exists, or the lease could not be renewed before it ran out. In the second
// case context.Cause(ctx) matches ErrTaskLost, and nothing the handler
// returns is committed.
//
// t is the task as claimed. The Worker renews its lease, which changes its
// version, so the handler must not change or delete t itself: it says what to
// do in the Result. Handlers run concurrently when the Worker's concurrency
// is above 1.
type Handler func(ctx context.Context, t *Task) (Result, error)

// Result is what a Handler commits for its task, in one atomic transaction
// that names the task's current version. The zero Result deletes the task.
// Every queue named must be in the task's consistency group.
type Result struct {
	// MoveTo moves the task to this queue instead of deleting it, with
	// attempt and err cleared. The task's own queue puts it back (see Later),
	// keeping attempt and err.
	MoveTo string
	// Value, when not nil, replaces the value of a moved task.
	Value []byte
	// Delay makes a moved task available only after this long.
	Delay time.Duration
	// Inserts are follow-up tasks, created only if the commit succeeds.
	Inserts []*TaskInsert
	// Deletes are other task versions to delete in the same transaction, for
	// example the inputs the handler consumed.
	Deletes []*TaskRef
	// Depends are task versions that must still exist unchanged for the
	// commit to succeed, for example the inputs the result was derived from.
	Depends []*TaskRef
}

// Later is the Result that puts t back into its queue, unchanged, available
// again after d. It does not count as a failed attempt. Use it for a task
// whose time has not come, such as a barrier whose children are not done.
func Later(t *Task, d time.Duration) Result { return Result{MoveTo: t.Queue, Delay: d} }

// Permanent marks a handler's error as one that retrying cannot fix (bad
// input): the task goes to the dead-letter queue at once.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// ErrTaskLost is the cause (context.Cause) of a handler's context that ended
// because the Worker no longer holds the task: a lease renewal was refused,
// or could not be made before the lease ran out. Another worker may be
// running the task; this one's result is not committed.
var ErrTaskLost = errors.New("taskstore: task lost")

// WorkerOption configures a Worker.
type WorkerOption func(*workerOptions)

type workerOptions struct {
	claimant     string
	lease        time.Duration
	renewEvery   time.Duration // 0: lease/3; <0: no renewal
	concurrency  int
	maxAttempts  int
	backoffBase  time.Duration
	backoffMax   time.Duration
	deadLetter   string
	claimWait    time.Duration
	errorBackoff time.Duration
}

// WithLease sets the lease of each claim (default 30s, at most 24h). A task
// whose worker dies is claimable again after at most this long.
func WithLease(d time.Duration) WorkerOption { return func(o *workerOptions) { o.lease = d } }

// WithRenewal renews the lease every d while a handler runs (default: a third
// of the lease). Zero turns renewal off, for handlers that always finish well
// within the lease: one that takes longer may then be run by another worker
// too, and whichever commits second is refused.
func WithRenewal(d time.Duration) WorkerOption {
	return func(o *workerOptions) {
		if d <= 0 {
			d = -1
		}
		o.renewEvery = d
	}
}

// WithConcurrency runs up to n handlers at once (default 1). The Worker
// claims only as many tasks as it has free handlers.
func WithConcurrency(n int) WorkerOption { return func(o *workerOptions) { o.concurrency = n } }

// WithWorkerClaimant sets the claimant the Worker claims and commits as
// (default: the Client's claimant followed by "/w" and a number unique in the
// process). Give each Worker its own.
func WithWorkerClaimant(name string) WorkerOption {
	return func(o *workerOptions) { o.claimant = name }
}

// WithMaxAttempts sets how many times a task is tried before it goes to the
// dead-letter queue (default 5). Attempts are counted in the task's attempt
// field, so they survive worker restarts; 1 means no retry.
func WithMaxAttempts(n int) WorkerOption { return func(o *workerOptions) { o.maxAttempts = n } }

// WithRetryBackoff sets the delay before the first retry and the largest one
// (defaults 1s and 5m). The delay doubles with every failed attempt, and up
// to a quarter of it is added at random so that tasks that failed together
// do not all come back together.
func WithRetryBackoff(base, max time.Duration) WorkerOption {
	return func(o *workerOptions) { o.backoffBase, o.backoffMax = base, max }
}

// WithDeadLetter sets the queue that takes tasks out of attempts (default
// "<group>/dead", group being the task's consistency group). It must be in
// the same group as the Worker's queues.
func WithDeadLetter(queue string) WorkerOption {
	return func(o *workerOptions) { o.deadLetter = queue }
}

// workerSeq numbers Workers for their default claimant.
var workerSeq atomic.Uint64

// Worker claims tasks from queues and runs a Handler on each:
//
//  1. It claims with a waiting claim, so an idle Worker blocks in the
//     cluster instead of polling, and never claims more tasks than it has
//     free handlers.
//  2. While a handler runs, the Worker renews the task's lease (a change that
//     keeps the claim, every third of the lease); each renewal makes a new
//     version, which replaces the held one. A refused renewal means the task
//     is lost: the handler's context is cancelled (cause ErrTaskLost) and
//     nothing is committed.
//  3. When the handler returns a Result, the Worker commits it in one Modify
//     naming the held version: delete the task (or move it), with the
//     Result's inserts, deletes and depends. The same request claims the
//     next task for the freed handler (one round trip and one log entry per
//     task while work is queued) when the Worker's queues are all in the
//     task's consistency group; when it finds none, the Worker goes back to
//     a waiting claim. If the task was lost meanwhile
//     (a paused process, a partition), the version is gone and the cluster
//     refuses the commit: a task version is committed at most once.
//  4. When the handler returns an error (or panics), the task is changed to
//     come back after an exponential backoff with attempt+1 and err set to the
//     error's text; after the last attempt, or at once for a Permanent error,
//     it is moved to the dead-letter queue instead. A commit the cluster
//     refuses for reasons other than the task itself (a duplicate insert, a
//     stale dependency) or finds invalid counts as a failed attempt too.
//  5. When Run's context ends, claiming stops and handlers see their context
//     cancelled. A task whose handler then fails is released for another
//     worker at once, without counting an attempt; a handler that succeeds is
//     still committed.
//
// So a task runs at least once and its result is committed at most once per
// claimed version; handlers should be idempotent in their outside effects.
//
// A Worker is safe for concurrent use; Stats may be called while it runs.
type Worker struct {
	c       *Client
	queues  []string
	handler Handler
	o       workerOptions
	log     *slog.Logger
	running atomic.Bool

	stats struct {
		claimed, committed, retried, deadLettered, lost, released, errors atomic.Uint64
	}
}

// WorkerStats counts what a Worker did since it was made.
type WorkerStats struct {
	Claimed      uint64 // tasks claimed
	Committed    uint64 // results committed (Later included)
	Retried      uint64 // failures recorded for a later retry
	DeadLettered uint64 // tasks moved to the dead-letter queue
	Lost         uint64 // tasks lost: renewal or commit refused on the task's version
	Released     uint64 // tasks given back on shutdown
	Errors       uint64 // commits whose outcome is unknown (cluster unavailable)
}

// NewWorker returns a Worker that runs handler on tasks of queues. Queues of
// several consistency groups are allowed; the Worker claims from each in
// turn.
func NewWorker(c *Client, queues []string, handler Handler, opts ...WorkerOption) (*Worker, error) {
	o := workerOptions{
		lease:        30 * time.Second,
		concurrency:  1,
		maxAttempts:  5,
		backoffBase:  time.Second,
		backoffMax:   5 * time.Minute,
		claimWait:    30 * time.Second,
		errorBackoff: time.Second,
	}
	for _, f := range opts {
		f(&o)
	}
	switch {
	case c == nil:
		return nil, fmt.Errorf("worker: no client: %w", ErrInvalid)
	case handler == nil:
		return nil, fmt.Errorf("worker: no handler: %w", ErrInvalid)
	case len(queues) == 0 || slices.Contains(queues, ""):
		return nil, fmt.Errorf("worker: name at least one queue, none empty: %w", ErrInvalid)
	case o.lease <= 0 || o.lease > 24*time.Hour:
		return nil, fmt.Errorf("worker: lease %v is outside (0, 24h]: %w", o.lease, ErrInvalid)
	case o.concurrency < 1 || o.concurrency > 1000:
		return nil, fmt.Errorf("worker: concurrency %d is outside [1, 1000]: %w", o.concurrency, ErrInvalid)
	case o.maxAttempts < 1:
		return nil, fmt.Errorf("worker: max attempts %d is below 1: %w", o.maxAttempts, ErrInvalid)
	case o.backoffBase <= 0 || o.backoffMax < o.backoffBase:
		return nil, fmt.Errorf("worker: bad retry backoff %v..%v: %w", o.backoffBase, o.backoffMax, ErrInvalid)
	case o.renewEvery >= o.lease:
		return nil, fmt.Errorf("worker: renewal every %v is not shorter than the lease %v: %w", o.renewEvery, o.lease, ErrInvalid)
	}
	if o.renewEvery == 0 {
		o.renewEvery = o.lease / 3
	}
	if o.claimant == "" {
		o.claimant = c.Claimant() + "/w" + strconv.FormatUint(workerSeq.Add(1), 10)
	}
	w := &Worker{c: c, queues: slices.Clone(queues), handler: handler, o: o}
	w.log = c.log.With("component", "worker", "claimant", o.claimant)
	return w, nil
}

// Claimant is the name the Worker claims and commits as.
func (w *Worker) Claimant() string { return w.o.claimant }

// Stats returns the Worker's counters.
func (w *Worker) Stats() WorkerStats {
	return WorkerStats{
		Claimed:      w.stats.claimed.Load(),
		Committed:    w.stats.committed.Load(),
		Retried:      w.stats.retried.Load(),
		DeadLettered: w.stats.deadLettered.Load(),
		Lost:         w.stats.lost.Load(),
		Released:     w.stats.released.Load(),
		Errors:       w.stats.errors.Load(),
	}
}

// Run claims and handles tasks until ctx ends, then waits for the running
// handlers to return and their tasks to be committed or released, and
// returns nil. It returns early with an error only when claiming cannot work
// (an invalid queue name, a closed Client); other claim errors are logged and
// retried. Run must not be called again while it runs.
func (w *Worker) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("worker: Run is already running")
	}
	defer w.running.Store(false)
	var wg sync.WaitGroup
	defer wg.Wait()

	slots := make(chan struct{}, w.o.concurrency) // a token per running handler
	pause := w.o.errorBackoff
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		n := 1
	more:
		for n < w.o.concurrency {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break more
			}
		}
		resp, err := w.c.Claim(ctx, &taskstorepb.ClaimRequest{
			Claimant: w.o.claimant, Queues: w.queues, Limit: uint32(n),
			Lease: durationpb.New(w.o.lease), Wait: durationpb.New(w.o.claimWait),
		})
		claimed := time.Now()
		tasks := resp.GetTasks()
		for _, t := range tasks {
			w.stats.claimed.Add(1)
			wg.Go(func() {
				defer func() { <-slots }()
				// A commit may bring this slot's next task with it.
				for next, at := t, claimed; next != nil; {
					next, at = w.handle(ctx, next, at)
				}
			})
		}
		for range n - len(tasks) {
			<-slots
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			pause = w.o.errorBackoff
			continue
		case errors.Is(err, ErrInvalid) || errors.Is(err, ErrTooLarge) || errors.Is(err, ErrUnsupported) || errors.Is(err, ErrClosed):
			w.log.Error("claim failed; stopping", "queues", w.queues, "err", err)
			return fmt.Errorf("worker: claim: %w", err)
		}
		w.log.Warn("claim failed; retrying", "queues", w.queues, "err", err, "pause", pause)
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return nil
		}
		pause = min(2*pause, time.Minute)
	}
}

// held is a claimed task whose version changes with each lease renewal.
type held struct {
	mu       sync.Mutex // guards task and leaseEnd
	task     *Task
	leaseEnd time.Time // by this machine's clock, conservatively
}

func (h *held) get() (*Task, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.task, h.leaseEnd
}

// handle runs the handler on one claimed task, renewing its lease meanwhile,
// then commits the outcome. A successful commit may carry the claim of the
// slot's next task (see commit); handle returns it, with the time the claim
// was sent, or nil.
func (w *Worker) handle(ctx context.Context, t *Task, claimed time.Time) (next *Task, nextClaimed time.Time) {
	ctx, span := w.startHandle(ctx, t)
	defer span.End()
	log := w.log.With("task", t.Id, "queue", t.Queue)
	h := &held{task: t, leaseEnd: claimed.Add(w.o.lease)}
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	stop, renewed := make(chan struct{}), make(chan struct{})
	if w.o.renewEvery > 0 {
		go func() {
			defer close(renewed)
			w.renew(ctx, h, stop, cancel, log)
		}()
	} else {
		close(renewed)
	}
	res, herr := w.run(hctx, t, log)
	close(stop)
	<-renewed // an in-flight renewal decides which version is held

	if cause := context.Cause(hctx); errors.Is(cause, ErrTaskLost) {
		w.stats.lost.Add(1)
		log.Warn("task lost while running; result dropped", "err", cause)
		return nil, time.Time{}
	}
	cur, _ := h.get()
	// Commits outlive Run's context: a finished result is worth keeping.
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), max(w.o.lease, 10*time.Second))
	defer ccancel()
	if herr != nil {
		w.fail(cctx, ctx.Err() != nil, cur, herr, log)
		return nil, time.Time{}
	}
	// While running, the commit claims the slot's next task too.
	claimNext := w.nextClaim(ctx, cur)
	sent := time.Now() // the lease of a claimed task starts after this
	claimedNext, err := w.commit(cctx, cur, res, claimNext)
	if err == nil {
		w.stats.committed.Add(1)
		log.Debug("committed", "version", cur.Version, "move_to", res.MoveTo, "inserts", len(res.Inserts), "claimed", len(claimedNext))
		if len(claimedNext) == 0 {
			return nil, time.Time{}
		}
		w.stats.claimed.Add(uint64(len(claimedNext)))
		return claimedNext[0], sent
	}
	if w.lostBy(err, cur, log) {
		return nil, time.Time{}
	}
	var dep *DependencyError
	if errors.As(err, &dep) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrTooLarge) {
		// The result itself cannot be committed: a failed attempt.
		w.fail(cctx, false, cur, fmt.Errorf("commit: %w", err), log)
		return
	}
	w.stats.errors.Add(1)
	log.Error("commit failed, outcome unknown; the lease will run out if it did not apply", "version", cur.Version, "err", err)
	return nil, time.Time{}
}

// nextClaim is the claim a commit of t carries for the slot t frees: one
// task of the Worker's queues, when they are all in t's consistency group
// (a transaction stays in one group) and the Worker is still running. Nil
// otherwise: the slot goes back to Run, which claims with a wait (and
// spreads claims over several groups).
func (w *Worker) nextClaim(ctx context.Context, t *Task) *taskstorepb.ModifyClaim {
	if ctx.Err() != nil {
		return nil
	}
	group := taskstorepb.GroupOf(t.Queue)
	for _, q := range w.queues {
		if taskstorepb.GroupOf(q) != group {
			return nil
		}
	}
	return &taskstorepb.ModifyClaim{Queues: w.queues, Limit: 1, Lease: durationpb.New(w.o.lease)}
}

// run calls the handler, turning a panic into an error.
func (w *Worker) run(ctx context.Context, t *Task, log *slog.Logger) (res Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			log.Error("handler panicked", "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return w.handler(ctx, proto.Clone(t).(*Task))
}

// renew extends the lease of h every renewEvery until stop is closed. A
// renewal that has started is finished even after stop, so that the held
// version is known. When the task is lost it cancels the handler's context
// with ErrTaskLost.
func (w *Worker) renew(ctx context.Context, h *held, stop <-chan struct{}, cancel context.CancelCauseFunc, log *slog.Logger) {
	timer := time.NewTimer(w.o.renewEvery)
	defer timer.Stop()
	for {
		select {
		case <-stop:
			return
		case <-timer.C:
		}
		t, leaseEnd := h.get()
		start := time.Now()
		// Past the (conservative) lease end a renewal may still succeed if
		// nobody claimed the task: worth one short try.
		rctx, rcancel := context.WithDeadline(context.WithoutCancel(ctx), later(leaseEnd, start.Add(time.Second)))
		resp, err := w.c.Modify(rctx, &taskstorepb.ModifyRequest{Claimant: w.o.claimant,
			Changes: []*taskstorepb.TaskChange{{Id: t.Id, Version: t.Version, Queue: t.Queue,
				KeepClaim: true, Delay: durationpb.New(w.o.lease)}}})
		rcancel()
		var dep *DependencyError
		switch {
		case err == nil && len(resp.Changed) == 1:
			h.mu.Lock()
			h.task, h.leaseEnd = resp.Changed[0], start.Add(w.o.lease)
			h.mu.Unlock()
			log.Debug("lease renewed", "version", resp.Changed[0].Version)
			timer.Reset(w.o.renewEvery)
		case errors.As(err, &dep):
			cancel(fmt.Errorf("%w: renewal of v%d refused: %w", ErrTaskLost, t.Version, err))
			return
		case err == nil:
			log.Error("renewal returned no task", "changed", len(resp.Changed))
			timer.Reset(w.o.renewEvery)
		case !time.Now().Before(leaseEnd):
			cancel(fmt.Errorf("%w: lease of v%d ran out before it could be renewed: %w", ErrTaskLost, t.Version, err))
			return
		default:
			// Not refused, so the lease may still hold: try again soon.
			log.Warn("lease renewal failed", "version", t.Version, "err", err)
			timer.Reset(min(w.o.renewEvery, time.Second))
		}
	}
}

// commit applies res to t in one transaction that, with next, also claims
// (returning what it claimed).
func (w *Worker) commit(ctx context.Context, t *Task, res Result, next *taskstorepb.ModifyClaim) ([]*Task, error) {
	req := &taskstorepb.ModifyRequest{Claimant: w.o.claimant, Inserts: res.Inserts,
		Deletes: res.Deletes, Depends: res.Depends, Claim: next}
	if res.MoveTo == "" {
		req.Deletes = append(slices.Clone(res.Deletes), Ref(t))
	} else {
		ch := &taskstorepb.TaskChange{Id: t.Id, Version: t.Version, Queue: t.Queue,
			Value: res.Value, Delay: durationpb.New(max(res.Delay, 0))}
		if res.MoveTo != t.Queue {
			ch.NewQueue = res.MoveTo
			ch.Attempt, ch.Err = proto.Uint32(0), proto.String("")
		}
		req.Changes = []*taskstorepb.TaskChange{ch}
	}
	resp, err := w.c.Modify(ctx, req)
	return resp.GetClaimed(), err
}

// fail records a failed attempt of t: a retry after a backoff, the
// dead-letter queue after the last attempt, or, on shutdown, a release.
func (w *Worker) fail(ctx context.Context, shutdown bool, t *Task, cause error, log *slog.Logger) {
	ch := &taskstorepb.TaskChange{Id: t.Id, Version: t.Version, Queue: t.Queue}
	var perm *permanentError
	attempt := t.Attempt + 1
	text := errText(cause)
	kind := ""
	switch {
	case shutdown && !errors.As(cause, &perm):
		ch.Delay = durationpb.New(0)
		kind = "released"
	case errors.As(cause, &perm) || int(attempt) >= w.o.maxAttempts:
		ch.NewQueue = w.deadLetter(t.Queue)
		ch.Delay = durationpb.New(0)
		ch.Attempt, ch.Err = &attempt, &text
		kind = "dead-lettered"
	default:
		ch.Delay = durationpb.New(w.backoff(attempt))
		ch.Attempt, ch.Err = &attempt, &text
		kind = "retry"
	}
	_, err := w.c.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: w.o.claimant, Changes: []*taskstorepb.TaskChange{ch}})
	if err != nil {
		if !w.lostBy(err, t, log) {
			w.stats.errors.Add(1)
			log.Error("recording a failure failed", "version", t.Version, "outcome", kind, "cause", cause, "err", err)
		}
		return
	}
	switch kind {
	case "released":
		w.stats.released.Add(1)
		log.Info("task released on shutdown", "version", t.Version, "cause", cause)
	case "dead-lettered":
		w.stats.deadLettered.Add(1)
		log.Warn("task dead-lettered", "to", ch.NewQueue, "attempt", attempt, "err", cause)
	default:
		w.stats.retried.Add(1)
		log.Info("task failed; will retry", "attempt", attempt, "delay", ch.Delay.AsDuration(), "err", cause)
	}
}

// lostBy reports whether err is the cluster refusing t's own version (the
// task was taken by another worker, changed or deleted), counting and
// logging the loss.
func (w *Worker) lostBy(err error, t *Task, log *slog.Logger) bool {
	var dep *DependencyError
	if !errors.As(err, &dep) {
		return false
	}
	for _, r := range dep.Errors {
		if r.Id != t.Id {
			continue
		}
		switch r.Category {
		case taskstorepb.RefError_CHANGE_MISSING, taskstorepb.RefError_CHANGE_STALE,
			taskstorepb.RefError_DELETE_MISSING, taskstorepb.RefError_DELETE_STALE, taskstorepb.RefError_CLAIMED:
			w.stats.lost.Add(1)
			log.Warn("commit refused: the task version is gone", "version", t.Version, "err", err)
			return true
		}
	}
	return false
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// deadLetter is the dead-letter queue for a task of queue.
func (w *Worker) deadLetter(queue string) string {
	if w.o.deadLetter != "" {
		return w.o.deadLetter
	}
	return taskstorepb.GroupOf(queue) + "/dead"
}

// backoff is the delay before retry number attempt (1 for the first).
func (w *Worker) backoff(attempt uint32) time.Duration {
	d := w.o.backoffBase
	for i := uint32(1); i < attempt && d < w.o.backoffMax; i++ {
		d *= 2
	}
	d = min(d, w.o.backoffMax)
	return d + rand.N(d/4+1)
}

// maxErrBytes is the cluster's default limit on err.
const maxErrBytes = 4096

// errText is err's text cut to the cluster's limit.
func errText(err error) string {
	s := err.Error()
	if len(s) > maxErrBytes {
		s = strings.ToValidUTF8(s[:maxErrBytes-3], "") + "..."
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "?")
	}
	return s
}
