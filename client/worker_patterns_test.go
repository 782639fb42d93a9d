package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// TestWorkerPatterns runs the patterns of example_test.go, with the same
// code, against an in-process cluster and checks what they produce.
func TestWorkerPatterns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	addrs := startCluster(t)
	t.Run("Pipeline", func(t *testing.T) {
		t.Parallel()
		testPipeline(t, addrs)
	})
	t.Run("MapReduce", func(t *testing.T) {
		t.Parallel()
		testMapReduce(t, addrs)
	})
}

// listQueue returns every task of queue (up to 1000).
func listQueue(t *testing.T, c *client.Client, queue string) []*client.Task {
	t.Helper()
	resp, err := c.Tasks(ctxFor(t, 20*time.Second), &taskstorepb.TasksRequest{Queue: queue, Limit: 1000})
	if err != nil {
		t.Fatalf("list %s: %v", queue, err)
	}
	return resp.Tasks
}

func testPipeline(t *testing.T, addrs string) {
	c := mustDial(t, addrs)
	pages := map[string]string{}
	for i := range 12 {
		pages[fmt.Sprintf("https://site/%02d", i)] = strings.Repeat("word ", i+1)
	}
	var mu sync.Mutex
	fetched := map[string]int{}
	fetch := func(ctx context.Context, url string) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		fetched[url]++
		return []byte(pages[url]), nil
	}
	ctx := ctxFor(t, 30*time.Second)
	for url := range pages {
		if _, err := c.Insert(ctx, "crawl/fetch", nil, client.WithKey(url), client.IfAbsent()); err != nil {
			t.Fatal(err)
		}
	}
	workers, err := newPipeline(c, fetch)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		runWorker(t, w)
	}
	fetcher, parser := workers[0], workers[1]
	waitFor(t, 30*time.Second, "every page parsed", func() bool { return parser.Stats().Committed == uint64(len(pages)) })

	results := listQueue(t, c, "crawl/result")
	got := map[string]string{}
	for _, r := range results {
		got[r.Key] = string(r.Value)
	}
	if len(results) != len(pages) {
		t.Errorf("%d results, want %d", len(results), len(pages))
	}
	for url, page := range pages {
		if want := fmt.Sprint(len(strings.Fields(page))); got[url] != want {
			t.Errorf("result for %s = %q, want %q", url, got[url], want)
		}
		if fetched[url] != 1 {
			t.Errorf("%s fetched %d times, want 1", url, fetched[url])
		}
	}
	for _, q := range []string{"crawl/fetch", "crawl/parse", "crawl/dead"} {
		if left := listQueue(t, c, q); len(left) != 0 {
			t.Errorf("%s still holds %d tasks", q, len(left))
		}
	}
	n := uint64(len(pages))
	checkStats(t, fetcher, client.WorkerStats{Claimed: n, Committed: n})
	checkStats(t, parser, client.WorkerStats{Claimed: n, Committed: n})
}

func testMapReduce(t *testing.T, addrs string) {
	c := mustDial(t, addrs)
	docs := []string{"a b c", "a a", "b c d e", "e", "a e e"}
	want := map[string]int{"a": 4, "b": 2, "c": 2, "d": 1, "e": 4}
	job, err := json.Marshal(wcJob{Docs: docs})
	if err != nil {
		t.Fatal(err)
	}
	mustInsert(t, c, "wc/job", "job-1", string(job))

	// The word count's own handlers, with the last map task held back so
	// that the barrier must wait for it.
	hs := wordCountHandlers(c, 100*time.Millisecond)
	release := make(chan struct{})
	var held atomic.Bool
	var barrierRuns atomic.Int32
	mapDoc, reduce := hs["wc/map"], hs["wc/reduce"]
	hs["wc/map"] = func(ctx context.Context, t *client.Task) (client.Result, error) {
		if t.Id == "job-1-map4" {
			held.Store(true)
			<-release
		}
		return mapDoc(ctx, t)
	}
	hs["wc/reduce"] = func(ctx context.Context, t *client.Task) (client.Result, error) {
		barrierRuns.Add(1)
		return reduce(ctx, t)
	}
	gated, err := client.NewWorker(c, []string{"wc/job", "wc/map", "wc/reduce"}, byQueue(hs), client.WithConcurrency(4))
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, gated)
	waitFor(t, 20*time.Second, "the last map task to start", held.Load)
	waitFor(t, 20*time.Second, "the barrier to wait twice", func() bool { return barrierRuns.Load() >= 2 })
	if out := listQueue(t, c, "wc/out"); len(out) != 0 {
		t.Fatalf("wc/out holds %d tasks before every child is done", len(out))
	}
	close(release)
	waitFor(t, 20*time.Second, "the total", func() bool { return len(listQueue(t, c, "wc/out")) == 1 })

	out := mustGet(t, c, "job-1-reduce")
	var total map[string]int
	if err := json.Unmarshal(out.Value, &total); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(total) != fmt.Sprint(want) {
		t.Errorf("total = %v, want %v", total, want)
	}
	if out.Queue != "wc/out" || out.Attempt != 0 || out.Err != "" {
		t.Errorf("barrier ended as %v", out)
	}
	mapped := listQueue(t, c, "wc/mapped")
	if len(mapped) != len(docs) {
		t.Errorf("wc/mapped holds %d children, want %d", len(mapped), len(docs))
	}
	for _, m := range mapped {
		if m.Version != 3 { // inserted, claimed, moved: each child committed once
			t.Errorf("child %s at version %d, want 3", m.Id, m.Version)
		}
	}
	for _, q := range []string{"wc/job", "wc/map", "wc/reduce", "wc/dead"} {
		if left := listQueue(t, c, q); len(left) != 0 {
			t.Errorf("%s still holds %d tasks", q, len(left))
		}
	}
	// One split, five maps, and the barrier's runs (its Laters included):
	// each claimed once and committed once, nothing failed.
	n := 6 + uint64(barrierRuns.Load())
	waitFor(t, 10*time.Second, "the last commit to be counted", func() bool { return gated.Stats().Committed == n })
	checkStats(t, gated, client.WorkerStats{Claimed: n, Committed: n})
}
