package rpc

import (
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// Queue introspection, as TaskMaster offers it: enqueue, claim and commit
// rates per queue and the average time from claim to commit. Kept in memory
// on the node that served the requests (the shard leader): it is
// observability, not replicated state, and starts afresh on a leader change.
const (
	rateBucket  = 10 * time.Second
	rateBuckets = 6 // a one-minute window
	// maxTrackedQueues and maxTrackedClaims bound the tracker's memory.
	maxTrackedQueues = 10000
	maxTrackedClaims = 100000
)

type queueCounts struct {
	enqueued, claimed, committed int64
	commitLatency                time.Duration // summed over committed tasks with a known claim time
	latencyCount                 int64
}

type queueWindow struct {
	start   time.Time // start of buckets[0]
	buckets [rateBuckets]queueCounts
}

// rotate moves the window so that now falls in its last bucket.
func (w *queueWindow) rotate(now time.Time) *queueCounts {
	if w.start.IsZero() {
		w.start = now.Truncate(rateBucket).Add(-(rateBuckets - 1) * rateBucket)
	}
	for now.Sub(w.start) >= rateBuckets*rateBucket {
		copy(w.buckets[:], w.buckets[1:])
		w.buckets[rateBuckets-1] = queueCounts{}
		w.start = w.start.Add(rateBucket)
	}
	return &w.buckets[rateBuckets-1]
}

type claimKey struct {
	id      string
	version uint64
}

type claimInfo struct {
	queue string
	at    time.Time
}

// introspection is safe for concurrent use.
type introspection struct {
	now    func() time.Time
	mu     sync.Mutex // guards queues and claims
	queues map[string]*queueWindow
	// claims remembers when each held version was claimed, to time the
	// commit; a renewal carries the claim time to the new version.
	claims map[claimKey]claimInfo
}

func newIntrospection(now func() time.Time) *introspection {
	return &introspection{now: now, queues: map[string]*queueWindow{}, claims: map[claimKey]claimInfo{}}
}

func (in *introspection) bucketLocked(queue string) *queueCounts {
	w := in.queues[queue]
	if w == nil {
		if len(in.queues) >= maxTrackedQueues {
			return nil
		}
		w = &queueWindow{}
		in.queues[queue] = w
	}
	return w.rotate(in.now())
}

// enqueuedLocked counts n tasks entering queue.
func (in *introspection) enqueuedLocked(queue string, n int) {
	if b := in.bucketLocked(queue); b != nil {
		b.enqueued += int64(n)
	}
}

// claimed counts claims and remembers when each claimed version was taken.
func (in *introspection) claimed(tasks []*taskstorepb.Task) {
	in.mu.Lock()
	defer in.mu.Unlock()
	now := in.now()
	for _, t := range tasks {
		if b := in.bucketLocked(t.Queue); b != nil {
			b.claimed++
		}
		if len(in.claims) < maxTrackedClaims {
			in.claims[claimKey{t.Id, t.Version}] = claimInfo{queue: t.Queue, at: now}
		}
	}
}

// renewedLocked moves a claim's start to the version a renewal produced.
func (in *introspection) renewedLocked(id string, from, to uint64) {
	if c, ok := in.claims[claimKey{id, from}]; ok {
		delete(in.claims, claimKey{id, from})
		in.claims[claimKey{id, to}] = c
	}
}

// committedLocked records a delete, or a change that ended a claim, of
// (id, version) in queue (empty: the queue recorded at claim time).
func (in *introspection) committedLocked(queue, id string, version uint64) {
	c, known := in.claims[claimKey{id, version}]
	delete(in.claims, claimKey{id, version})
	if queue == "" {
		queue = c.queue
	}
	if queue == "" {
		return
	}
	b := in.bucketLocked(queue)
	if b == nil {
		return
	}
	b.committed++
	if known {
		b.commitLatency += in.now().Sub(c.at)
		b.latencyCount++
	}
}

// fill sets a queue's rate fields from the window.
func (in *introspection) fill(qs *taskstorepb.QueueStats) {
	in.mu.Lock()
	defer in.mu.Unlock()
	w := in.queues[qs.Name]
	if w == nil {
		return
	}
	w.rotate(in.now())
	var sum queueCounts
	for _, b := range w.buckets {
		sum.enqueued += b.enqueued
		sum.claimed += b.claimed
		sum.committed += b.committed
		sum.commitLatency += b.commitLatency
		sum.latencyCount += b.latencyCount
	}
	window := rateBuckets * rateBucket
	secs := window.Seconds()
	qs.EnqueueRate = float64(sum.enqueued) / secs
	qs.ClaimRate = float64(sum.claimed) / secs
	qs.CommitRate = float64(sum.committed) / secs
	qs.RateWindow = durationpb.New(window)
	if sum.latencyCount > 0 {
		qs.AvgClaimToCommit = durationpb.New(sum.commitLatency / time.Duration(sum.latencyCount))
	}
}

// modified feeds a committed transaction to the rates, under one lock.
func (in *introspection) modified(req *taskstorepb.ModifyRequest, res *fsmpb.ModifyResult) {
	coalesced := map[uint32]bool{}
	for _, i := range res.GetCoalesced() {
		coalesced[i] = true
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	for i, ins := range req.Inserts {
		if !coalesced[uint32(i)] {
			in.enqueuedLocked(ins.Queue, 1)
		}
	}
	for i, c := range req.Changes {
		switch {
		case c.KeepClaim && i < len(res.GetChanged()):
			in.renewedLocked(c.Id, c.Version, res.GetChanged()[i].Version)
		case !c.KeepClaim:
			in.committedLocked(c.Queue, c.Id, c.Version)
			if c.NewQueue != "" && c.NewQueue != c.Queue {
				in.enqueuedLocked(c.NewQueue, 1)
			}
		}
	}
	for _, d := range req.Deletes {
		in.committedLocked(d.Queue, d.Id, d.Version)
	}
}
