package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// listAll pages through a queue with the direct client.
func listAll(t *testing.T, cl *client.Client, queue string) []*taskstorepb.Task {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []*taskstorepb.Task
	token := ""
	for {
		resp, err := cl.Tasks(ctx, &taskstorepb.TasksRequest{Queue: queue, Limit: 1000, PageToken: token, OmitValues: false})
		if err != nil {
			t.Fatalf("list %s: %v", queue, err)
		}
		out = append(out, resp.Tasks...)
		if token = resp.NextPageToken; token == "" {
			return out
		}
	}
}

// TestLeaderKilledWhileInsertingThroughProxy kills the leader of a shard
// while writers insert through a proxy, half with client-chosen ids and half
// with only a unique value (so that only the request id, passed through the
// proxy, protects them from a second copy). Afterwards every acknowledged
// insert is present exactly once and nothing was inserted twice.
func TestLeaderKilledWhileInsertingThroughProxy(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	pc := dial(t, p.Addr(), client.WithProxyOnly())
	const queue = "kill/in"
	shard := c.ShardOf(queue)
	leader := c.Leader(shard)
	if leader < 0 {
		t.Fatal("no leader")
	}

	var (
		mu       sync.Mutex
		acked    = map[string]bool{} // values
		attempts = map[string]bool{}
		errs     []error
		inserted atomic.Int64
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				val := fmt.Sprintf("w%d-%05d", w, i)
				var opts []client.InsertOption
				if w%2 == 0 {
					opts = append(opts, client.WithID("id-"+val))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
				_, err := pc.Insert(ctx, queue, []byte(val), opts...)
				cancel()
				mu.Lock()
				attempts[val] = true
				if err == nil {
					acked[val] = true
					inserted.Add(1)
				} else {
					errs = append(errs, fmt.Errorf("insert %s: %w", val, err))
				}
				mu.Unlock()
			}
		})
	}
	waitFor := func(n int64) {
		deadline := time.Now().Add(60 * time.Second)
		for inserted.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("only %d inserts acknowledged, want %d", inserted.Load(), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor(100)
	t.Logf("killing %s, leader of shard %d", c.Nodes[leader].ID, shard)
	c.Kill(leader)
	before := inserted.Load()
	waitFor(before + 200) // the writers got going again under a new leader
	close(stop)
	wg.Wait()
	for _, err := range errs {
		t.Errorf("through the proxy, a caller saw: %v", err)
	}

	direct := dial(t, strings.Join(c.Endpoints(), ","))
	seen := map[string]int{}
	for _, tk := range listAll(t, direct, queue) {
		v := string(tk.Value)
		seen[v]++
		if !attempts[v] {
			t.Errorf("task %s has value %q that no writer sent", tk.Id, v)
		}
		if strings.HasPrefix(v, "w0") || strings.HasPrefix(v, "w2") {
			if tk.Id != "id-"+v {
				t.Errorf("task %s has value %q, want id %q", tk.Id, v, "id-"+v)
			}
		}
	}
	for v, n := range seen {
		if n != 1 {
			t.Errorf("value %s inserted %d times", v, n)
		}
	}
	for v := range acked {
		if seen[v] != 1 {
			t.Errorf("acknowledged insert %s present %d times", v, seen[v])
		}
	}
	t.Logf("%d inserts acknowledged (%d before the kill), %d tasks present", len(acked), before, len(seen))
}

// TestProxyKilledMidLoad stops one of two proxies abruptly while callers
// insert, claim and delete through them: a client given both proxies and a
// client given only the surviving one see no error, and nothing is applied
// twice.
func TestProxyKilledMidLoad(t *testing.T) {
	c := startCluster(t)
	pa, pb := startProxy(t, c), startProxy(t, c)
	both := dial(t, pa.Addr()+","+pb.Addr(), client.WithProxyOnly())
	onlyB := dial(t, pb.Addr(), client.WithProxyOnly())
	// A gRPC health check sees the proxy serving.
	hc := healthpb.NewHealthClient(grpcConn(t, pa.Addr()))
	if r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v", r, err)
	}

	var (
		mu      sync.Mutex
		errs    []error
		values  = map[string]bool{}
		ops     atomic.Int64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		clients = []*client.Client{both, onlyB}
	)
	for w := range 6 {
		cl := clients[w%2]
		queue := fmt.Sprintf("pk%d/q", w)
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
				val := fmt.Sprintf("w%d-%d", w, i)
				err := func() error {
					if _, err := cl.Insert(ctx, queue, []byte(val)); err != nil {
						return fmt.Errorf("insert: %w", err)
					}
					mu.Lock()
					values[val] = true
					mu.Unlock()
					if i%2 == 1 {
						return nil // leave every other task in the queue
					}
					resp, err := cl.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{queue}})
					if err != nil {
						return fmt.Errorf("claim: %w", err)
					}
					if len(resp.Tasks) != 1 {
						return fmt.Errorf("claim returned %d tasks", len(resp.Tasks))
					}
					tk := resp.Tasks[0]
					return cl.Delete(ctx, tk.Id, tk.Version, client.InQueue(queue), client.AsClaimant("w"))
				}()
				cancel()
				ops.Add(1)
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("worker %d (%s): %w", w, cl.Addresses(), err))
					mu.Unlock()
				}
			}
		})
	}
	wait := func(n int64) {
		deadline := time.Now().Add(60 * time.Second)
		for ops.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("only %d operations, want %d", ops.Load(), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	wait(60)
	pa.Close()
	killedAt := ops.Load()
	wait(killedAt + 120)
	close(stop)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	// Every value inserted once; the tasks left are the odd ones of each
	// worker plus none of the claimed-and-deleted ones.
	direct := dial(t, strings.Join(c.Endpoints(), ","))
	for w := range 6 {
		queue := fmt.Sprintf("pk%d/q", w)
		seen := map[string]int{}
		for _, tk := range listAll(t, direct, queue) {
			seen[string(tk.Value)]++
		}
		for v, n := range seen {
			if n != 1 || !values[v] {
				t.Errorf("%s: value %s present %d times (acknowledged: %v)", queue, v, n, values[v])
			}
		}
	}
	var herr error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, herr = hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); herr != nil {
			break
		}
	}
	if herr == nil {
		t.Error("the stopped proxy still answers health checks")
	}
	t.Logf("%d operations, %d after the kill", ops.Load(), ops.Load()-killedAt)
}
