package containers_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// diskSize is the victim's data volume: a tmpfs that the writes below fill.
const diskSize = 384 << 20

// TestContainersFullDisk fills one node's data disk (a size-limited tmpfs)
// with the cluster's own writes while the others have room (once,
// a follower whose disk filled took its shards down cluster-wide for
// minutes, because leadership was handed to it on gossip health alone and
// the transfer stuck). The node must notice, hand away what it leads and
// take nothing, say so in status, and the cluster must take every write
// meanwhile, before and after the disk is actually full.
func TestContainersFullDisk(t *testing.T) {
	gate(t)
	const victim = "n3"
	c := startCluster(t, 3, 2, 3, func(nd *container) ([]string, []string) {
		flags := []string{"--min-free-disk", "160MiB"}
		if nd.ID != victim {
			return nil, flags
		}
		// Owned by the image's user (65532), as the image's /data is.
		return []string{"--tmpfs", fmt.Sprintf("/data:size=%d,uid=65532,gid=65532,mode=0755", diskSize)}, flags
	})
	c.WaitReady(3 * time.Minute)
	v := c.Node(victim)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cl, err := client.Dial(ctx, c.ProxyAddr(), client.WithProxyOnly(), client.WithAttemptTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	// Writers: 256 KiB tasks into a queue on every shard, never deleted, so
	// every replica's snapshots and log grow until the victim's disk is
	// full. Every insert must succeed (the client retries an unavailable
	// shard within its 30 s budget).
	shards := c.Shards()
	queues := map[uint32]string{}
	for i := 0; len(queues) < len(shards) && i < 10000; i++ {
		q := fmt.Sprintf("disk%d/q", i)
		if sh, err := shardOf(ctx, cl, q); err == nil {
			if _, ok := queues[sh]; !ok {
				queues[sh] = q
			}
		}
	}
	if len(queues) < len(shards) {
		t.Fatalf("no queue found on every shard: %v", queues)
	}
	value := []byte(strings.Repeat("d", 256<<10))
	var acked, failed atomic.Int64
	var firstFail atomic.Value
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for _, q := range queues {
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go func(q string) {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					ictx, icancel := context.WithTimeout(ctx, 30*time.Second)
					_, err := cl.Insert(ictx, q, value)
					icancel()
					if err != nil {
						failed.Add(1)
						firstFail.CompareAndSwap(nil, fmt.Sprintf("%s: %v", q, err))
						continue
					}
					acked.Add(1)
				}
			}(q)
		}
	}
	defer func() { close(stop); wg.Wait() }()

	nodeStatus := func() *taskstorepb.NodeStatus {
		st, err := c.StatusFrom(c.Node("n1"))
		if err != nil {
			return nil
		}
		for _, n := range st.Nodes {
			if n.Id == victim {
				return n
			}
		}
		return nil
	}
	leadsVictim := func() []uint32 {
		var out []uint32
		for _, s := range shards {
			if l, _ := c.Leader(s); l == v {
				out = append(out, s)
			}
		}
		return out
	}

	// 1. The victim notices its disk fill and sheds its leaderships.
	deadline := time.Now().Add(4 * time.Minute)
	for {
		ns := nodeStatus()
		if ns != nil && ns.DiskLow && len(leadsVictim()) == 0 {
			t.Logf("%s: disk low at %d bytes free after %d acknowledged 256 KiB inserts; it leads nothing", victim, ns.DiskFreeBytes, acked.Load())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never reported a low disk and shed its leaderships: %v, leads %v (acked %d, failed %d)", victim, ns, leadsVictim(), acked.Load(), failed.Load())
		}
		time.Sleep(time.Second)
	}
	// 2. Write on until its disk is full (it cannot append: it answers
	// status with next to nothing free, or not at all), then for another
	// 20 s: the victim must lead nothing and nothing may fail.
	for deadline = time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		ns := nodeStatus()
		if ns == nil || ns.DiskFreeBytes < 16<<20 {
			t.Logf("%s: disk full (%v) after %d acknowledged inserts", victim, ns, acked.Load())
			break
		}
		if time.Now().After(deadline) {
			t.Logf("%s: still %d bytes free after 3 minutes (%d acknowledged); going on", victim, ns.DiskFreeBytes, acked.Load())
			break
		}
	}
	before := acked.Load()
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		if l := leadsVictim(); len(l) > 0 {
			t.Fatalf("%s, with a full disk, leads shards %v", victim, l)
		}
	}
	close(stop)
	wg.Wait()
	stop = make(chan struct{}) // for the deferred close
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d inserts failed while one node's disk was full (first: %v)", n, firstFail.Load())
	}
	during := acked.Load() - before
	if during < 10 {
		t.Fatalf("only %d inserts succeeded in the 20 s after %s's disk filled", during, victim)
	}
	// 3. Every acknowledged task is there.
	var total uint64
	for _, q := range queues {
		qs, err := cl.ListQueues(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range qs {
			total += s.Total
		}
	}
	if total != uint64(acked.Load()) {
		t.Fatalf("%d tasks stored, %d inserts acknowledged", total, acked.Load())
	}
	t.Logf("SUMMARY full-disk: acked=%d (after the disk filled: %d in 20 s) failed=0 stored=%d victim-leads=0", acked.Load(), during, total)
}

// shardOf asks the cluster which shard owns queue's group.
func shardOf(ctx context.Context, cl *client.Client, queue string) (uint32, error) {
	rt, err := cl.Routing(ctx)
	if err != nil {
		return 0, err
	}
	slot := taskstorepb.SlotOf(taskstorepb.GroupOf(queue), len(rt.Slots))
	return rt.Slots[slot], nil
}
