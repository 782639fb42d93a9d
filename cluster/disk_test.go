package cluster_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// A node whose data disk fills hands away every shard it leads and takes no
// leadership until space is freed, writes go on through the others, and
// status says which node it is (a follower's full disk
// took its shards down once leadership was handed to it on gossip health
// alone).
func TestNodeWithAFullDiskShedsLeadership(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 3, Scale: raceScale, Tune: func(tu *cluster.Tuning) {
		tu.DiskCheckEvery = 100 * time.Millisecond
	}})
	c.WaitReady()
	shards := c.Shards()
	full := 0
	// It leads every shard when its disk fills.
	for _, s := range shards {
		if c.Leader(s) == full {
			continue
		}
		if err := c.TransferLeader(s, full); err != nil {
			t.Fatalf("transfer shard %d to %s: %v", s, c.Nodes[full].ID, err)
		}
	}
	c.FillDisk(full, 10<<20)
	node := c.Nodes[full].Server().Node
	leads := func() []uint32 {
		var out []uint32
		for _, s := range shards {
			if c.Leader(s) == full {
				out = append(out, s)
			}
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	for !node.DiskLow() || len(leads()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s's disk is full (low %v) and it still leads shards %v", c.Nodes[full].ID, node.DiskLow(), leads())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Writes go on, and for several balancing rounds (every 2 s) nobody
	// hands it a leadership, however preferred it is, nor may it take one.
	for i := 0; i < 30; i++ {
		for _, s := range shards {
			q := queueOn(t, c, s)
			insert(t, c, q, fmt.Sprintf("t%d", i), "x")
			if i%10 == 0 {
				// An operator's transfer to it is refused, saying why.
				l := c.Leader(s)
				if l < 0 {
					continue
				}
				_, err := taskstorepb.NewAdminClient(c.Conn(l)).TransferLeader(ctxT(t, 10*time.Second),
					&taskstorepb.TransferLeaderRequest{Shard: s, To: c.Nodes[full].ID})
				if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "disk") {
					t.Fatalf("transfer of shard %d to %s, whose disk is full: %v, want FailedPrecondition naming the disk", s, c.Nodes[full].ID, err)
				}
			}
		}
		if l := leads(); len(l) > 0 {
			t.Fatalf("%s, with a full disk, leads shards %v", c.Nodes[full].ID, l)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Another node's status names it.
	other := (full + 1) % 3
	st, err := taskstorepb.NewAdminClient(c.Conn(other)).Status(ctxT(t, 10*time.Second), &taskstorepb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if want := n.Id == c.Nodes[full].ID; n.DiskLow != want {
			t.Fatalf("status shows %s with disk_low %v (free %d)", n.Id, n.DiskLow, n.DiskFreeBytes)
		}
		if n.Id == c.Nodes[full].ID && n.DiskFreeBytes != 10<<20 {
			t.Fatalf("status shows %s with %d bytes free, want %d", n.Id, n.DiskFreeBytes, 10<<20)
		}
	}
	// Space freed: it leads its preferred shards again.
	c.FillDisk(full, 0)
	deadline = time.Now().Add(60 * time.Second)
	for len(leads()) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s has space again and leads nothing after a minute", c.Nodes[full].ID)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// queueOn returns a queue whose group lands on shard.
func queueOn(t *testing.T, c *harness.Cluster, shard uint32) string {
	t.Helper()
	for i := 0; i < 10000; i++ {
		q := fmt.Sprintf("disk%d/q", i)
		if c.ShardOf(q) == shard {
			return q
		}
	}
	t.Fatalf("no queue lands on shard %d", shard)
	return ""
}
