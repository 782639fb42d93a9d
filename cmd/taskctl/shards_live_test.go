package main

import (
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/testing/harness"
)

// On a real cluster: shard add returns once the new shard has a leader, so
// a shard list right after it, at any node, shows the shard running; shard
// remove says what it waits for after the moves, and a removed shard's
// replicas do not wait out the grace of a replica moved away (10 election
// timeouts, 10 s here).
func TestShardAddAndRemoveShowTheirResult(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2})
	c.WaitReady()
	all := strings.Join(c.Endpoints(), ",")
	r := runOffline(t, "--endpoints", all, "--timeout", "60s", "shard", "add")
	if r.code != 0 || !strings.Contains(r.stdout, "shard 2 added") {
		t.Fatalf("shard add: %+v", r)
	}
	for _, ep := range c.Endpoints() {
		r := runOffline(t, "--endpoints", ep, "--timeout", "30s", "shard", "list")
		row := ""
		for _, line := range strings.Split(r.stdout, "\n") {
			if strings.HasPrefix(line, "2 ") {
				row = line
			}
		}
		if r.code != 0 || row == "" || strings.Contains(row, "NO-LEADER") {
			t.Fatalf("shard list at %s right after shard add: shard 2's row %q in\n%+v", ep, row, r)
		}
	}
	start := time.Now()
	r = runOffline(t, "--endpoints", all, "--timeout", "60s", "shard", "remove", "2")
	took := time.Since(start)
	if r.code != 0 || !strings.Contains(r.stdout, "waiting for it to leave the cluster map") || !strings.Contains(r.stdout, "shard 2 removed") {
		t.Fatalf("shard remove: %+v", r)
	}
	if took > 8*time.Second {
		t.Errorf("shard remove of a shard serving no slot took %v, want well within the 10 s grace", took.Round(time.Millisecond))
	}
}
