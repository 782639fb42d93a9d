package e2e

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/checker"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestKillNineMidAppendOfManyShards kills taskstored processes with -9
// while writers keep appends of every shard in flight, so that each kill
// lands in the middle of the node log's group commits (many shards' entries
// in one write), and once kills every node at once. Every acknowledged
// insert must be there afterwards, exactly once, and the replicas' logs must
// agree entry by entry (a torn tail replayed, or a cut that lost an
// acknowledged entry, would show in one or the other).
func TestKillNineMidAppendOfManyShards(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	pc := harness.StartProcesses(t, 3, "--shards", "8", "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl := pc.Dial(ctx)

	const groups, writers = 32, 16 // 32 consistency groups cover the 8 shards
	queue := func(g int) string { return fmt.Sprintf("nl%02d/q", g) }
	var (
		mu      sync.Mutex
		acked   = map[string]bool{}
		unknown atomic.Int64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("w%02d-%06d", w, i)
				cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
				_, err := cl.Insert(cctx, queue((w+i*writers)%groups), []byte(id), client.WithID(id))
				ccancel()
				if err != nil {
					unknown.Add(1)
					continue
				}
				mu.Lock()
				acked[id] = true
				mu.Unlock()
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	for round := 0; round < 4; round++ {
		time.Sleep(2500 * time.Millisecond)
		victim := pc.Nodes[round%len(pc.Nodes)]
		t.Logf("round %d: kill -9 %s (%d inserts acknowledged so far)", round, victim.ID, count())
		victim.Kill()
		time.Sleep(1500 * time.Millisecond)
		if err := victim.Start(); err != nil {
			t.Fatal(err)
		}
		pc.WaitReady(60 * time.Second)
	}
	time.Sleep(2 * time.Second)
	t.Logf("kill -9 every node at once (%d inserts acknowledged so far)", count())
	for _, p := range pc.Nodes {
		p.Kill()
	}
	time.Sleep(500 * time.Millisecond)
	for _, p := range pc.Nodes {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
	}
	pc.WaitReady(90 * time.Second)
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()

	seen := map[string]int{}
	for g := 0; g < groups; g++ {
		for _, task := range listAll(t, ctx, cl, queue(g)) {
			seen[task.Id]++
		}
	}
	mu.Lock()
	var missing, doubled []string
	for id := range acked {
		if seen[id] == 0 {
			missing = append(missing, id)
		}
	}
	for id, n := range seen {
		if n > 1 {
			doubled = append(doubled, id)
		}
	}
	n := len(acked)
	mu.Unlock()
	sort.Strings(missing)
	if len(missing) > 0 || len(doubled) > 0 {
		t.Fatalf("lost %d acknowledged inserts %v; %d present twice %v", len(missing), first(missing), len(doubled), first(doubled))
	}
	if n < 500 {
		t.Fatalf("only %d inserts acknowledged: too few to mean anything", n)
	}
	logs, err := pc.ShardLogs()
	if err != nil {
		t.Fatal(err)
	}
	vs, compared := checker.LogAgreement(logs)
	for _, v := range vs {
		t.Errorf("replica logs: %s", v.Detail)
	}
	if compared < n/3 {
		t.Errorf("compared %d log entries for %d acknowledged inserts: the logs were not read", compared, n)
	}
	t.Logf("%d inserts acknowledged (%d not), all present exactly once; %d log entries agree across replicas of %d shards", n, unknown.Load(), compared, len(logs)/3)
}

func first(s []string) []string { return s[:min(len(s), 10)] }
