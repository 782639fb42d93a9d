package e2e

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestBackupOfIdleShardAfterElection: a shard that took no write since its
// leader changed is backed up. The new leader's first entry of its term
// (and a configuration entry) is committed but never reaches the state
// machine, whose applied index therefore stays below the leader's commit
// index until the next command: a fence at the commit index made every
// replica refuse the copy as behind, and backup create failed on a quiet
// cluster right after a leadership hand-off.
func TestBackupOfIdleShardAfterElection(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2})
	c.WaitReady()
	c.WaitFormat()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := client.Dial(ctx, strings.Join(c.Endpoints(), ","))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const shard = 2
	from := c.Leader(shard)
	to := (from + 1) % len(c.Nodes)
	if err := c.TransferLeader(shard, to); err != nil {
		t.Fatal(err)
	}
	for c.Leader(shard) != to {
		if ctx.Err() != nil {
			t.Fatalf("shard %d: leadership did not move to %s", shard, c.Nodes[to].ID)
		}
		time.Sleep(10 * time.Millisecond)
	}
	info, err := cl.Backup(ctx, shard, io.Discard)
	if err != nil {
		t.Fatalf("backup of idle shard %d after its leader changed: %v", shard, err)
	}
	t.Logf("shard %d backed up at index %d", shard, info.GetIndex())
}
