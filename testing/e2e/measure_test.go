package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestMeasureFailoverAndLatency prints the numbers the node issue asks for:
// time to elect a new leader after kill -9 of a shard leader (median of 10)
// and single-client insert latency on a 3-node cluster. It measures, it does
// not judge: run it with TASKSTORE_MEASURE=1.
//
//	TASKSTORE_MEASURE=1 go test -run Measure -v ./testing/e2e/
func TestMeasureFailoverAndLatency(t *testing.T) {
	if os.Getenv("TASKSTORE_MEASURE") == "" {
		t.Skip("set TASKSTORE_MEASURE=1 to measure")
	}
	pc := harness.StartProcesses(t, 3, "--shards", "4")
	pc.WaitReady(60 * time.Second)
	ctx := context.Background()
	cl := pc.Dial(ctx)

	// Single-client insert latency.
	var lat []time.Duration
	for i := 0; i < 500; i++ {
		start := time.Now()
		if _, err := cl.Insert(ctx, "lat/q", []byte("x"), client.WithID(fmt.Sprintf("l%d", i))); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	t.Logf("single-client insert latency over %d: p50 %v p90 %v p99 %v", len(lat), lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)*99/100])

	// Failover: kill the leader of shard 1, time until another node leads it
	// and accepts a write, restart, let leadership settle back.
	var times []time.Duration
	for round := 0; round < 10; round++ {
		st, err := cl.Status(ctx, &taskstorepb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		victim := pc.Node(st.Shards[0].Leader)
		if victim == nil {
			t.Fatalf("no leader for shard 1")
		}
		killed := time.Now()
		victim.Kill()
		waitNewLeader(t, ctx, cl, st.Shards[0].Id, victim.ID)
		times = append(times, time.Since(killed))
		if err := victim.Start(); err != nil {
			t.Fatal(err)
		}
		pc.WaitReady(time.Minute)
		time.Sleep(8 * time.Second) // leadership moves back to the preferred replica
	}
	slices.Sort(times)
	t.Logf("new leader after kill -9 of the leader, %d runs: median %v, min %v, max %v", len(times), times[len(times)/2], times[0], times[len(times)-1])
}
