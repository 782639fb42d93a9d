package e2e

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

var rateFor = flag.Duration("rate.for", 10*time.Second, "TestQueueRate: how long the 16 workers claim from the queue of 50/s")

// TestQueueRate: real taskstored processes. A queue with the policy rate
// 50/s (burst 5, the default) and plenty of tasks; 16 workers claim from it
// (one task, waiting up to a second) for -rate.for. Counted by the log time
// of each claim (its lease end less the lease), no second holds more than
// 55 tasks (50 tokens and a full bucket of 5) and the whole run gives 40 to
// 55 a second (a stall of the machine only leaves tokens unused). Then a queue of 1/s, burst 1:
// a claim that waits on its empty bucket is served when the token frees
// (about a second), not when its 5 s wait runs out.
func TestQueueRate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	harness.Binaries(t)
	pc := harness.StartProcesses(t, 3, "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute+2**rateFor)
	defer cancel()
	cl := pc.Dial(ctx)
	const queue, slow = "rt/work", "rt/slow"
	const rate, lease = 50, time.Hour

	// The cluster raises the state format after its start: until then a
	// rate is refused as too new.
	for {
		_, err := cl.SetQueuePolicy(ctx, queue, &taskstorepb.QueuePolicy{Rate: rate})
		if err == nil {
			break
		}
		if ctx.Err() != nil || !strings.Contains(err.Error(), "format") {
			t.Fatalf("set policy: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if p, err := cl.QueuePolicy(ctx, queue); err != nil || p.GetRate() != rate || p.GetBurst() != 5 {
		t.Fatalf("policy read back: %v (%v), want rate 50, burst 5", p, err)
	}
	if _, err := cl.SetQueuePolicy(ctx, slow, &taskstorepb.QueuePolicy{Rate: -1}); err == nil {
		t.Fatal("a negative rate was accepted")
	}
	need := int(rate*rateFor.Seconds()) + 500
	for n := 0; n < need; n += 500 {
		var ins []*taskstorepb.TaskInsert
		for range 500 {
			ins = append(ins, &taskstorepb.TaskInsert{Queue: queue, Value: []byte("x")})
		}
		if _, err := cl.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: ins}); err != nil {
			t.Fatal(err)
		}
	}

	var (
		mu      sync.Mutex
		stamps  []time.Time // log time of each claim
		wg      sync.WaitGroup
		claimed int
	)
	start := time.Now()
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < *rateFor {
				resp, err := cl.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: fmt.Sprintf("w%d", w), Queues: []string{queue},
					Lease: durationpb.New(lease), Wait: durationpb.New(time.Second), Limit: 1})
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				mu.Lock()
				for _, tk := range resp.Tasks {
					stamps = append(stamps, tk.At.AsTime().Add(-lease))
				}
				claimed += len(resp.Tasks)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	slices.SortFunc(stamps, func(a, b time.Time) int { return a.Compare(b) })
	first := stamps[0]
	span := stamps[len(stamps)-1].Sub(first)
	perSecond := map[int]int{}
	for _, s := range stamps {
		perSecond[int(s.Sub(first)/time.Second)]++
	}
	whole := int(span / time.Second) // the last, partial second is not counted
	var counts []int
	for s := range whole {
		counts = append(counts, perSecond[s])
	}
	avg := float64(len(stamps)-1) / span.Seconds()
	t.Logf("16 workers, %s: %d tasks claimed, %.2f/s over %s of log time; per whole second: %v", *rateFor, claimed, avg, span.Round(time.Millisecond), counts)
	// The rule, whatever the machine's load: no second of log time holds
	// more than a second's tokens and a full bucket. A stall (a slow
	// machine, an election) only leaves tokens unused, so the lower side
	// is checked on the whole run, with room for such a stall.
	const burst = 5
	for i, s := range stamps {
		n, _ := slices.BinarySearchFunc(stamps[i:], s.Add(time.Second), func(a, b time.Time) int { return a.Compare(b) })
		if n > rate+burst {
			t.Errorf("%d tasks claimed in the second of log time from %s, want at most %d (rate %d + burst %d)", n, s.Sub(first), rate+burst, rate, burst)
			break
		}
	}
	if avg < 0.8*rate || avg > rate+5 {
		t.Errorf("%.2f tasks a second, want 40 to 55", avg)
	}

	// A waiting claim is served when the next token frees.
	if _, err := cl.SetQueuePolicy(ctx, slow, &taskstorepb.QueuePolicy{Rate: 1, Burst: 1}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := cl.Insert(ctx, slow, []byte("s")); err != nil {
			t.Fatal(err)
		}
	}
	claimSlow := func(wait time.Duration) (int, time.Duration) {
		t0 := time.Now()
		resp, err := cl.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "s", Queues: []string{slow},
			Lease: durationpb.New(lease), Wait: durationpb.New(wait), Limit: 3})
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Tasks), time.Since(t0)
	}
	if n, _ := claimSlow(0); n != 1 {
		t.Fatalf("a claim of 3 from a full bucket of 1 took %d", n)
	}
	if n, _ := claimSlow(0); n != 0 {
		t.Fatalf("a claim from the empty bucket took %d", n)
	}
	n, took := claimSlow(5 * time.Second)
	t.Logf("a claim waiting on the empty bucket of 1/s: %d task after %s", n, took.Round(time.Millisecond))
	if n != 1 || took >= 3*time.Second {
		t.Fatalf("a claim waiting on the empty bucket: %d tasks after %s, want 1 within about a second (the next token)", n, took)
	}
}
