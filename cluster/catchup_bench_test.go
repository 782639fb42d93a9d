package cluster_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/testing/harness"
)

var catchUpTasks = flag.Int("catchup.tasks", 500_000, "tasks in the shard BenchmarkCatchUpBySnapshot's replica catches up with")

// BenchmarkCatchUpBySnapshot measures what the capacity target asks of a snapshot
// install: a replica that missed a shard's whole life (cut off from the
// start, the leader's log compacted past it) catches up by snapshot while
// writers keep inserting, and the writers must not stall beyond a second.
// It reports the catch-up time and the writers' latencies during it and
// in the seconds before it (the state on disk; -catchup.tasks sets the
// size; run with -benchtime 1x):
//
//	go test -run '^$' -bench CatchUpBySnapshot -benchtime 1x -catchup.tasks=2000000 ./cluster/
func BenchmarkCatchUpBySnapshot(b *testing.B) {
	for range b.N {
		catchUpBySnapshot(b, *catchUpTasks)
	}
}

func catchUpBySnapshot(b *testing.B, tasks int) {
	c := harness.Start(b, 3, harness.Options{Shards: 1, Scale: raceScale, LogLevel: slog.LevelError, Tune: func(t *cluster.Tuning) {
		// A short log, so the cut-off replica cannot catch up from it.
		t.TrailingLogs = 64
		t.SnapshotThreshold = 256
	}})
	defer c.Close()
	c.WaitReady()
	const queue = "catchup/q"
	shard := c.ShardOf(queue)
	lag := (c.Leader(shard) + 1) % 3
	c.Network().Partition([]string{c.Nodes[lag].ID}, c.NodeIDs())

	ctx := context.Background()
	value := make([]byte, 64)
	g, gctx := errgroup.WithContext(ctx)
	batches := make(chan int)
	g.Go(func() error {
		defer close(batches)
		for left := tasks; left > 0; left -= 500 {
			select {
			case batches <- min(left, 500):
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for w := 0; w < 4; w++ {
		g.Go(func() error {
			for n := range batches {
				ins := make([]*taskstorepb.TaskInsert, n)
				for i := range ins {
					ins[i] = &taskstorepb.TaskInsert{Queue: fmt.Sprintf("%s%d", queue, i%100), Value: value}
				}
				if _, err := c.TaskStore(queue).Modify(gctx, &taskstorepb.ModifyRequest{Inserts: ins}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatalf("load: %v", err)
	}
	leader := c.Leader(shard)
	if err := c.Snapshot(shard, leader); err != nil {
		b.Fatalf("snapshot: %v", err)
	}

	// Writers: one task per request, as workers insert.
	var (
		mu    sync.Mutex
		lats  []writeLat
		wstop = make(chan struct{})
		wg    sync.WaitGroup
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-wstop:
					return
				default:
				}
				t0 := time.Now()
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := c.TaskStore(queue).Modify(cctx, &taskstorepb.ModifyRequest{
					Inserts: []*taskstorepb.TaskInsert{{Queue: queue + "w", Value: value}}})
				cancel()
				if err != nil {
					b.Errorf("write during catch-up: %v", err)
					return
				}
				mu.Lock()
				lats = append(lats, writeLat{t0, time.Since(t0)})
				mu.Unlock()
			}
		}()
	}
	time.Sleep(3 * time.Second)
	target := c.RaftStat(leader, shard, "last_log_index")
	healed := time.Now()
	c.Network().Heal()
	for c.RaftStat(lag, shard, "applied_index") < target {
		if time.Since(healed) > 10*time.Minute {
			b.Fatalf("replica %s did not catch up in 10 minutes", c.Nodes[lag].ID)
		}
		time.Sleep(10 * time.Millisecond)
	}
	caughtUp := time.Now()
	time.Sleep(time.Second)
	close(wstop)
	wg.Wait()
	if c.RaftStat(lag, shard, "last_snapshot_index") == 0 {
		b.Fatalf("replica %s caught up without a snapshot", c.Nodes[lag].ID)
	}
	if got := c.Nodes[lag].Server().Node.Shard(shard).Machine().TaskCount(); got < tasks {
		b.Fatalf("replica %s holds %d tasks after catching up, want at least %d", c.Nodes[lag].ID, got, tasks)
	}

	var before, during []time.Duration
	for _, l := range lats {
		switch {
		case l.start.Before(healed):
			before = append(before, l.took)
		case l.start.Before(caughtUp):
			during = append(during, l.took)
		}
	}
	b.ReportMetric(caughtUp.Sub(healed).Seconds(), "catchup-s")
	b.ReportMetric(ms(quantile(before, 0.99)), "before-p99-ms")
	b.ReportMetric(ms(quantile(before, 1)), "before-max-ms")
	b.ReportMetric(ms(quantile(during, 0.99)), "during-p99-ms")
	b.ReportMetric(ms(quantile(during, 1)), "during-max-ms")
	b.ReportMetric(float64(len(during))/caughtUp.Sub(healed).Seconds(), "during-writes/s")
}

type writeLat struct {
	start time.Time
	took  time.Duration
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	slices.Sort(d)
	return d[min(len(d)-1, int(q*float64(len(d))))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
