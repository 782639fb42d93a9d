package containers_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// memoryCap is each node container's hard memory limit (docker --memory,
// without swap): what 2 of 3 nodes with the state in memory and no budget
// were OOM-killed at after about 425,000 batched 64-byte inserts.
const memoryCap = "320m"

// TestContainersMemoryBudget: three nodes with the default flags, but for
// --state, each in a container capped at 320 MiB, take batched inserts of
// 64-byte tasks far past what memory holds. No node may be OOM-killed or
// restarted, no acknowledged insert may be lost, a claim must answer at
// the end, and in memory the producers must be refused with
// ResourceExhausted (the shard's budget is full), not time out.
//
// With the state in memory the producers run until the budget refuses
// them and 15 s more (at most memoryInsertFor); on disk, where nothing is
// refused, for diskInsertFor. TASKSTORE_MEMORY_STORES picks the stores
// (default "memory,disk").
func TestContainersMemoryBudget(t *testing.T) {
	gate(t)
	stores := strings.Split(cmpOr(os.Getenv("TASKSTORE_MEMORY_STORES"), "memory,disk"), ",")
	for _, store := range stores {
		t.Run(store, func(t *testing.T) { memoryBudget(t, store) })
	}
}

const (
	// memoryInsertFor bounds the inserts in memory: the budget (160 MiB
	// of tasks per node) fills in about 100 s on 2 busy cores.
	memoryInsertFor = 240 * time.Second
	// diskInsertFor: on disk the inserts run this long, several times
	// what would fill the containers' memory were the tasks in it.
	diskInsertFor = 90 * time.Second
)

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func memoryBudget(t *testing.T, store string) {
	c := startCluster(t, 3, 3, 3, func(nd *container) ([]string, []string) {
		// No swap (--memory-swap equal to --memory): past the cap the
		// kernel kills. A restart policy makes a crash visible as a
		// restart.
		return []string{"--memory", memoryCap, "--memory-swap", memoryCap, "--restart", "on-failure"},
			[]string{"--state", store}
	})
	c.WaitReady(3 * time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cl, err := client.Dial(ctx, c.ProxyAddr(), client.WithProxyOnly(), client.WithAttemptTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	// A queue on every shard, two producers each, 500 tasks a request.
	shards := c.Shards()
	queues := map[uint32]string{}
	for i := 0; len(queues) < len(shards) && i < 10000; i++ {
		q := fmt.Sprintf("mem%d/q", i)
		if sh, err := shardOf(ctx, cl, q); err == nil {
			if _, ok := queues[sh]; !ok {
				queues[sh] = q
			}
		}
	}
	if len(queues) < len(shards) {
		t.Fatalf("no queue found on every shard: %v", queues)
	}
	const batch = 500
	value := []byte(strings.Repeat("m", 64))
	var acked, exhausted, failed atomic.Int64
	var firstExhausted, firstFail atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, q := range queues {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ins := make([]*taskstorepb.TaskInsert, batch)
				for i := range ins {
					ins[i] = &taskstorepb.TaskInsert{Queue: q, Value: value}
				}
				for {
					select {
					case <-stop:
						return
					default:
					}
					ictx, icancel := context.WithTimeout(ctx, 30*time.Second)
					_, err := cl.Modify(ictx, &taskstorepb.ModifyRequest{Inserts: ins})
					icancel()
					switch {
					case err == nil:
						acked.Add(batch)
					case errors.Is(err, client.ErrFull):
						// ResourceExhausted, naming the budget.
						exhausted.Add(1)
						firstExhausted.CompareAndSwap(nil, err.Error())
						select { // back off, as a producer should
						case <-stop:
						case <-time.After(time.Second):
						}
					default:
						failed.Add(1)
						firstFail.CompareAndSwap(nil, fmt.Sprintf("%s: %v", q, err))
					}
				}
			}()
		}
	}
	start := time.Now()
	limit := diskInsertFor
	if store == "memory" {
		limit = memoryInsertFor
	}
	var refusedAt time.Duration
	for time.Since(start) < limit {
		time.Sleep(time.Second)
		if store == "memory" && exhausted.Load() > 0 {
			if refusedAt == 0 {
				refusedAt = time.Since(start)
				t.Logf("first refusal after %v and %d acknowledged tasks: %v", refusedAt.Round(time.Second), acked.Load(), firstExhausted.Load())
			}
			if time.Since(start) > refusedAt+15*time.Second {
				break
			}
		}
		checkNoRestarts(t, c)
	}
	insertFor := time.Since(start)
	close(stop)
	wg.Wait()
	checkNoRestarts(t, c)
	if n := failed.Load(); n > 0 {
		t.Errorf("%d inserts failed other than by a full budget (first: %v)", n, firstFail.Load())
	}
	if store == "memory" && exhausted.Load() == 0 {
		t.Fatalf("in %v, %d acknowledged tasks and no refusal: the budget never filled", insertFor.Round(time.Second), acked.Load())
	}
	if store != "memory" && exhausted.Load() > 0 {
		t.Errorf("on disk, %d inserts refused: %v", exhausted.Load(), firstExhausted.Load())
	}

	// Every acknowledged task is there (a refused request applied
	// nothing, and a timed-out one would have counted as failed).
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
		t.Errorf("%d tasks stored, %d inserts acknowledged", total, acked.Load())
	}
	// Claims answer at the budget, and a commit frees room: an insert
	// goes through again.
	var claimed int
	for _, q := range queues {
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := cl.Claim(cctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{q}, Limit: 100})
		ccancel()
		if err != nil || len(res.Tasks) == 0 {
			t.Fatalf("claim from %s at the end: %v, %v", q, res, err)
		}
		claimed += len(res.Tasks)
		var refs []*taskstorepb.TaskRef
		for _, tk := range res.Tasks {
			refs = append(refs, &taskstorepb.TaskRef{Id: tk.Id, Version: tk.Version})
		}
		if _, err := cl.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: "w", Deletes: refs, Inserts: []*taskstorepb.TaskInsert{{Queue: q, Value: value}}}); err != nil {
			t.Errorf("commit 100 and insert 1 in %s at the budget: %v", q, err)
		}
	}
	st, _ := c.Status()
	fill := ""
	for _, s := range st.GetShards() {
		for _, r := range s.ReplicaStatus {
			if r.Node == s.Leader && r.MemoryBudget > 0 {
				fill += fmt.Sprintf(" shard%d=%d%%", s.Id, r.MemoryUsed*100/r.MemoryBudget)
			}
		}
	}
	t.Logf("SUMMARY memory-budget store=%s cap=%s inserted-for=%v acked=%d refused-requests=%d failed=%d stored=%d claimed=%d first-refusal=%v fill:%s rss:%s oom=0 restarts=0",
		store, memoryCap, insertFor.Round(time.Second), acked.Load(), exhausted.Load(), failed.Load(), total, claimed, refusedAt.Round(time.Second), fill, memoryUse(c))
}

// checkNoRestarts fails the test when a node container was OOM-killed or
// restarted.
func checkNoRestarts(t *testing.T, c *dockerCluster) {
	t.Helper()
	for _, nd := range c.Nodes {
		out, err := docker("inspect", "--format", "{{.State.OOMKilled}} {{.RestartCount}} {{.State.Running}}", nd.Name)
		if err != nil {
			t.Fatalf("inspect %s: %v", nd.ID, err)
		}
		f := strings.Fields(out)
		if len(f) != 3 || f[0] != "false" || f[1] != "0" || f[2] != "true" {
			t.Fatalf("%s: OOMKilled, RestartCount, Running = %q (memory: %s)", nd.ID, out, memoryUse(c))
		}
	}
}

// memoryUse is each node container's memory use as docker stats reports it.
func memoryUse(c *dockerCluster) string {
	var names []string
	for _, nd := range c.Nodes {
		names = append(names, nd.Name)
	}
	out, err := docker(append([]string{"stats", "--no-stream", "--format", "{{.Name}}={{.MemUsage}}"}, names...)...)
	if err != nil {
		return err.Error()
	}
	return strings.Join(strings.Fields(strings.ReplaceAll(out, " / ", "/")), " ")
}
