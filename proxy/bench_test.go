package proxy_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/proxy"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// BenchmarkProxy compares a Go client talking to shard leaders directly
// with one talking through a proxy, on a 3-node in-process cluster with 4
// shards: inserts, and claim+delete pairs, by 1 and 32 concurrent callers
// spread over 8 consistency groups. Besides ns/op it reports ops/s and the
// p50 and p99 latency of one operation (for claim+delete, the pair).
//
//	go test -run '^$' -bench . -benchtime 2000x -timeout 600s ./proxy/
//
// The proxy runs in the same process as the nodes and the callers, so it
// competes with them for the same cores: on a small machine that is most of
// its cost.
func BenchmarkProxy(b *testing.B) {
	c := harness.Start(b, 3, harness.Options{Shards: 4, Scale: 1})
	c.WaitReady()
	ctx := context.Background()
	p, err := proxy.Start(ctx, proxy.Config{Cluster: strings.Join(c.Endpoints(), ","), ListenAddr: "127.0.0.1:0", Logger: harness.Discard})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	for p.Ready() != nil {
		time.Sleep(10 * time.Millisecond)
	}
	direct, err := client.Dial(ctx, strings.Join(c.Endpoints(), ","))
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	viaProxy, err := client.Dial(ctx, p.Addr(), client.WithProxyOnly())
	if err != nil {
		b.Fatal(err)
	}
	defer viaProxy.Close()
	value := make([]byte, 100)
	run := 0
	for _, op := range []string{"insert", "claim+delete"} {
		for _, path := range []struct {
			name string
			cl   *client.Client
		}{{"direct", direct}, {"proxy", viaProxy}} {
			for _, callers := range []int{1, 32} {
				b.Run(fmt.Sprintf("%s/%s/callers=%d", op, path.name, callers), func(b *testing.B) {
					run++
					queue := func(w int) string { return fmt.Sprintf("bench%d-%d/q", run, w%8) }
					per := make([]int, callers) // operations per caller
					for i := range b.N {
						per[i%callers]++
					}
					if op == "claim+delete" {
						b.StopTimer()
						fill(b, direct, queue, per, value)
						b.StartTimer()
					}
					lat := make([][]time.Duration, callers)
					start := time.Now()
					var wg sync.WaitGroup
					for w := range callers {
						wg.Go(func() {
							lat[w] = make([]time.Duration, 0, per[w])
							for range per[w] {
								t0 := time.Now()
								if err := doOp(ctx, path.cl, op, queue(w), value); err != nil {
									b.Error(err)
									return
								}
								lat[w] = append(lat[w], time.Since(t0))
							}
						})
					}
					wg.Wait()
					elapsed := time.Since(start)
					all := slices.Concat(lat...)
					slices.Sort(all)
					if len(all) == 0 {
						return
					}
					b.ReportMetric(float64(len(all))/elapsed.Seconds(), "ops/s")
					b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
					b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
				})
			}
		}
	}
}

// fill inserts per[w] tasks into each caller's queue, in batches.
func fill(b *testing.B, cl *client.Client, queue func(int) string, per []int, value []byte) {
	ctx := context.Background()
	n := map[string]int{}
	for w, k := range per {
		n[queue(w)] += k
	}
	for q, k := range n {
		for k > 0 {
			batch := min(k, 200)
			req := &taskstorepb.ModifyRequest{}
			for range batch {
				req.Inserts = append(req.Inserts, &taskstorepb.TaskInsert{Queue: q, Value: value})
			}
			if _, err := cl.Modify(ctx, req); err != nil {
				b.Fatal(err)
			}
			k -= batch
		}
	}
}

func doOp(ctx context.Context, cl *client.Client, op, queue string, value []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if op == "insert" {
		_, err := cl.Insert(ctx, queue, value)
		return err
	}
	resp, err := cl.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "bench", Queues: []string{queue}})
	if err != nil {
		return err
	}
	if len(resp.Tasks) != 1 {
		return fmt.Errorf("claim from %s: %d tasks", queue, len(resp.Tasks))
	}
	t := resp.Tasks[0]
	return cl.Delete(ctx, t.Id, t.Version, client.InQueue(queue), client.AsClaimant("bench"))
}
