package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
	"github.com/e1158ecb/taskstore/testing/workload"
)

// TestMeasureElectionsUnderLoad counts leader changes of a 3-node, 8-shard
// cluster of real processes at the default Raft timeouts under a heavy
// workload and no faults: every change is a spurious election. Since raft's
// heartbeat fast path is declined (cluster/heartbeat.go), a follower's
// heartbeat waits behind its disk writes; this is where that would show.
// It measures, it does not judge. TASKSTORE_BIN picks the binaries, so the
// same test compares two builds:
//
//	TASKSTORE_MEASURE=1 TASKSTORE_BIN=$PWD/bin go test -run MeasureElections -v ./testing/e2e/
//
// TASKSTORE_MEASURE_FOR sets the loaded interval (default 90s).
func TestMeasureElectionsUnderLoad(t *testing.T) {
	if os.Getenv("TASKSTORE_MEASURE") == "" {
		t.Skip("set TASKSTORE_MEASURE=1 to measure")
	}
	d := 90 * time.Second
	if v := os.Getenv("TASKSTORE_MEASURE_FOR"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	pc := harness.StartProcesses(t, 3, "--shards", "8")
	pc.WaitReady(90 * time.Second)
	admin := pc.Dial(context.Background())
	tr := harness.NewStatusTracker(admin)
	// Let bootstrap's elections and leadership balancing settle first.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		tr.Poll()
		time.Sleep(200 * time.Millisecond)
	}
	tr.Reset()
	h := workload.NewHistory()
	cfg := workload.Defaults.Scaled(4)
	cfg.Prefix = "elect"
	wl, err := workload.Start(cfg, h, func(ctx context.Context) (*client.Client, error) {
		return client.Dial(ctx, pc.Endpoints())
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for time.Since(start) < d {
		tr.Poll()
		time.Sleep(100 * time.Millisecond)
	}
	wl.Stop()
	elapsed := time.Since(start)
	ops := len(h.Ops())
	t.Logf("MEASURE elections bin=%s shards=8 loaded=%v ops=%d ops/s=%.0f leader-changes=%d per-minute=%.2f",
		strings.TrimSuffix(os.Getenv("TASKSTORE_BIN"), "/"), elapsed.Round(time.Second), ops, float64(ops)/elapsed.Seconds(), tr.Changes(), float64(tr.Changes())/elapsed.Minutes())
}
