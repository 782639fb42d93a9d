package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

var (
	retainTasks    = flag.Int("retain.tasks", 1_000_000, "BenchmarkRetention: tasks loaded into the queue that then expires")
	retainState    = flag.String("retain.state", "", "BenchmarkRetention: the nodes' --state (empty: the default)")
	retainSettle   = flag.Duration("retain.settle", 10*time.Second, "BenchmarkRetention: how long claims run after the load before they are measured")
	retainBefore   = flag.Duration("retain.before", 20*time.Second, "BenchmarkRetention: how long claims are measured before the expiry")
	retainClaimers = flag.Int("retain.claimers", 4, "BenchmarkRetention: clients claiming and committing on the other queue")
)

// BenchmarkRetention is the retention target: -retain.tasks tasks of 64
// bytes, loaded into one queue in transactions of 1000, all expire at once
// (a retain policy set after the load); the benchmark reports how long the
// queue takes to be empty and the p99 of claim+commit (a claim of one task,
// then a commit that deletes it and inserts its replacement, so the queue
// never runs dry) by -retain.claimers clients on another queue of the same
// shard, in the -retain.before before the policy is set (after
// -retain.settle, in which the replicas digest the load) and while the
// expiry runs. Three real taskstored processes.
func BenchmarkRetention(b *testing.B) {
	args := []string{"--raft-timeout-scale", "2"}
	if *retainState != "" {
		args = append(args, "--state", *retainState)
	}
	pc := harness.StartProcesses(b, 3, args...)
	pc.WaitReady(60 * time.Second)
	ctx := context.Background()
	cl := pc.Dial(ctx)

	// The expiring queue and another queue of its shard.
	rt, err := cl.Routing(ctx)
	if err != nil {
		b.Fatal(err)
	}
	slots := len(rt.Slots)
	const big = "rtbig/q"
	shard := rt.Slots[taskstorepb.SlotOf(taskstorepb.GroupOf(big), slots)]
	other := ""
	for i := 0; other == ""; i++ {
		g := fmt.Sprintf("rtother%d", i)
		if rt.Slots[taskstorepb.SlotOf(g, slots)] == shard {
			other = g + "/q"
		}
	}

	// The cluster raises its state format after its start: until then a
	// retention policy is refused. An hour's retain keeps every task
	// through the load.
	for {
		_, err := cl.SetQueuePolicy(ctx, big, &taskstorepb.QueuePolicy{Retain: durationpb.New(time.Hour)})
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "format") {
			b.Fatalf("set policy: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	value := make([]byte, 64)
	const batch = 1000
	load := func(queue string, n int) {
		var wg sync.WaitGroup
		work := make(chan int)
		for range 4 {
			wg.Go(func() {
				for c := range work {
					req := &taskstorepb.ModifyRequest{}
					for range c {
						req.Inserts = append(req.Inserts, &taskstorepb.TaskInsert{Queue: queue, Value: value})
					}
					if _, err := cl.Modify(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		for n > 0 {
			c := min(n, batch)
			work <- c
			n -= c
		}
		close(work)
		wg.Wait()
	}
	loadStart := time.Now()
	load(big, *retainTasks)
	b.Logf("loaded %d tasks into %s (shard %d) in %v", *retainTasks, big, shard, time.Since(loadStart).Round(time.Millisecond))
	load(other, 1000)

	type sample struct {
		at  time.Time
		lat time.Duration
	}
	var (
		mu      sync.Mutex
		samples []sample
		errs    int
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for w := range *retainClaimers {
		wg.Go(func() {
			claimant := fmt.Sprintf("rt-claimer-%d", w)
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				resp, err := cl.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: claimant, Queues: []string{other},
					Lease: durationpb.New(30 * time.Second), Limit: 1})
				if err == nil && len(resp.Tasks) == 1 {
					tk := resp.Tasks[0]
					_, err = cl.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: claimant,
						Deletes: []*taskstorepb.TaskRef{{Id: tk.Id, Version: tk.Version, Queue: tk.Queue}},
						Inserts: []*taskstorepb.TaskInsert{{Queue: other, Value: value}}})
				}
				mu.Lock()
				if err == nil {
					samples = append(samples, sample{start, time.Since(start)})
				} else {
					errs++
				}
				mu.Unlock()
			}
		})
	}
	time.Sleep(*retainSettle + *retainBefore)

	left := func() uint64 {
		qs, err := cl.Queues(ctx, &taskstorepb.QueuesRequest{Prefix: big})
		if err != nil {
			b.Fatal(err)
		}
		for _, q := range qs.Queues {
			if q.Name == big {
				return q.Available + q.Claimed + q.Delayed
			}
		}
		return 0
	}
	b.ResetTimer()
	began := time.Now()
	if _, err := cl.SetQueuePolicy(ctx, big, &taskstorepb.QueuePolicy{Retain: durationpb.New(time.Second)}); err != nil {
		b.Fatal(err)
	}
	var n uint64
	for n = left(); n > 0; n = left() {
		if time.Since(began) > 10*time.Minute {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	ended := time.Now()
	b.StopTimer()
	close(stop)
	wg.Wait()
	if n > 0 {
		b.Fatalf("%d tasks still in %s %v after the retain was set", n, big, ended.Sub(began).Round(time.Second))
	}

	p99 := func(from, to time.Time) (time.Duration, int) {
		var lats []time.Duration
		for _, s := range samples {
			if !s.at.Before(from) && s.at.Before(to) {
				lats = append(lats, s.lat)
			}
		}
		if len(lats) == 0 {
			return 0, 0
		}
		slices.Sort(lats)
		return lats[len(lats)*99/100], len(lats)
	}
	before, nb := p99(began.Add(-*retainBefore), began)
	during, nd := p99(began, ended)
	loadavg, _ := os.ReadFile("/proc/loadavg")
	b.ReportMetric(ended.Sub(began).Seconds(), "s-to-empty")
	b.ReportMetric(float64(before.Microseconds())/1000, "p99-before-ms")
	b.ReportMetric(float64(during.Microseconds())/1000, "p99-during-ms")
	if before > 0 {
		b.ReportMetric(float64(during)/float64(before), "p99-ratio")
	}
	b.Logf("%d tasks expired in %v; claim+commit p99 on %s %v before (%d in %v), %v during (%d); %d errors; loadavg %s",
		*retainTasks, ended.Sub(began).Round(time.Millisecond), other, before, nb, *retainBefore, during, nd, errs, strings.TrimSpace(string(loadavg)))
}
