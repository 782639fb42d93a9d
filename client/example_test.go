package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// The examples below need a running cluster, so they have no "Output:"
// lines: go test compiles them but does not run them. The patterns they
// show are run against an in-process cluster by worker_patterns_test.go,
// with the same functions.

// ExampleWorker is the smallest useful worker: it sends each task's value as
// an email and deletes the task. A failed send is retried with exponential
// backoff; after five attempts the task waits in "mail/dead" with its last
// error.
func ExampleWorker() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := client.Dial(ctx, "127.0.0.1:7101,127.0.0.1:7102")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	w, err := client.NewWorker(c, []string{"mail/outbox"},
		func(ctx context.Context, t *client.Task) (client.Result, error) {
			if err := sendMail(ctx, t.Value); err != nil {
				return client.Result{}, err // retried later
			}
			return client.Result{}, nil // done: delete the task
		},
		client.WithConcurrency(8), client.WithLease(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	// Run returns when ctx ends (SIGTERM), after the handlers have returned
	// and their tasks were committed or released.
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

func sendMail(ctx context.Context, msg []byte) error { return nil }

// Example_pipeline is a two-stage pipeline in the "crawl" group: fetchers
// take URLs from crawl/fetch and move each task, with the page as its new
// value, to crawl/parse; parsers count the words and record them in
// crawl/result. Each move is one atomic commit, so a page is never lost
// between the stages nor parsed twice.
func Example_pipeline() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := client.Dial(ctx, "127.0.0.1:7101")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The key is the URL: unique in the queue, and it moves with the task.
	for _, url := range []string{"https://example.com/", "https://example.org/"} {
		if _, err := c.Insert(ctx, "crawl/fetch", nil, client.WithKey(url), client.IfAbsent()); err != nil {
			log.Fatal(err)
		}
	}
	workers, err := newPipeline(c, httpGet)
	if err != nil {
		log.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			if err := w.Run(ctx); err != nil {
				log.Print(err)
			}
		})
	}
	wg.Wait()
}

func httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, client.Permanent(err) // a bad URL stays bad: dead-letter it now
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 512<<10))
}

// newPipeline returns the two stages' workers. fetch gets a page.
func newPipeline(c *client.Client, fetch func(ctx context.Context, url string) ([]byte, error)) ([]*client.Worker, error) {
	fetcher, err := client.NewWorker(c, []string{"crawl/fetch"},
		func(ctx context.Context, t *client.Task) (client.Result, error) {
			page, err := fetch(ctx, t.Key)
			if err != nil {
				return client.Result{}, err
			}
			// Next stage: same task, new queue and value, attempts reset.
			return client.Result{MoveTo: "crawl/parse", Value: page}, nil
		},
		client.WithConcurrency(4))
	if err != nil {
		return nil, err
	}
	parser, err := client.NewWorker(c, []string{"crawl/parse"},
		func(ctx context.Context, t *client.Task) (client.Result, error) {
			n := len(strings.Fields(string(t.Value)))
			// Delete the parse task and record the result, atomically.
			return client.Result{Inserts: []*client.TaskInsert{
				client.NewInsert("crawl/result", []byte(fmt.Sprint(n)), client.WithKey(t.Key)),
			}}, nil
		})
	if err != nil {
		return nil, err
	}
	return []*client.Worker{fetcher, parser}, nil
}

// Example_mapReduce counts words over many documents with a fan-out and a
// barrier, all in the "wc" group:
//
//   - a job in wc/job is split into one map task per document plus a barrier
//     task in wc/reduce that names the map tasks, in one commit that also
//     deletes the job: all of them exist, or none;
//   - each map task counts its document and moves to wc/mapped with the
//     counts as its value;
//   - the barrier waits (Later) until every child is in wc/mapped, then
//     moves to wc/out with the sum, its commit depending on the exact
//     versions of the children it read: if any changed meanwhile, the commit
//     is refused and the barrier runs again.
func Example_mapReduce() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := client.Dial(ctx, "127.0.0.1:7101")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	job, _ := json.Marshal(wcJob{Docs: []string{"to be or not to be", "that is the question"}})
	if _, err := c.Insert(ctx, "wc/job", job, client.WithID("job-1")); err != nil {
		log.Fatal(err)
	}
	w, err := newWordCount(c, 200*time.Millisecond)
	if err != nil {
		log.Fatal(err)
	}
	go w.Run(ctx)

	// The total appears in wc/out under the barrier's id.
	for {
		t, err := c.Get(ctx, "job-1-reduce")
		if err == nil && t.Queue == "wc/out" {
			fmt.Println(string(t.Value))
			return
		}
		if err != nil && !errors.Is(err, client.ErrNotFound) {
			log.Fatal(err)
		}
		time.Sleep(time.Second)
	}
}

type wcJob struct{ Docs []string }

type wcBarrier struct{ Children []string }

// newWordCount returns one worker for the three stages of the word count; a
// barrier that is not ready looks again after poll.
func newWordCount(c *client.Client, poll time.Duration) (*client.Worker, error) {
	return client.NewWorker(c, []string{"wc/job", "wc/map", "wc/reduce"},
		byQueue(wordCountHandlers(c, poll)), client.WithConcurrency(4))
}

// wordCountHandlers are the word count's handlers by queue.
func wordCountHandlers(c *client.Client, poll time.Duration) map[string]client.Handler {
	split := func(ctx context.Context, t *client.Task) (client.Result, error) {
		var job wcJob
		if err := json.Unmarshal(t.Value, &job); err != nil {
			return client.Result{}, client.Permanent(err)
		}
		var res client.Result
		var b wcBarrier
		for i, doc := range job.Docs {
			id := fmt.Sprintf("%s-map%d", t.Id, i) // ids from the job's: a retry cannot fan out twice
			res.Inserts = append(res.Inserts, client.NewInsert("wc/map", []byte(doc), client.WithID(id)))
			b.Children = append(b.Children, id)
		}
		bv, _ := json.Marshal(b)
		res.Inserts = append(res.Inserts, client.NewInsert("wc/reduce", bv, client.WithID(t.Id+"-reduce")))
		return res, nil // deletes the job with the inserts
	}
	mapDoc := func(ctx context.Context, t *client.Task) (client.Result, error) {
		counts := map[string]int{}
		for _, w := range strings.Fields(string(t.Value)) {
			counts[w]++
		}
		v, _ := json.Marshal(counts)
		return client.Result{MoveTo: "wc/mapped", Value: v}, nil
	}
	reduce := func(ctx context.Context, t *client.Task) (client.Result, error) {
		var b wcBarrier
		if err := json.Unmarshal(t.Value, &b); err != nil {
			return client.Result{}, client.Permanent(err)
		}
		resp, err := c.Tasks(ctx, &taskstorepb.TasksRequest{Queue: "wc/mapped", Ids: b.Children})
		if err != nil {
			return client.Result{}, err
		}
		if len(resp.Tasks) < len(b.Children) {
			return client.Later(t, poll), nil // not every child is done
		}
		total := map[string]int{}
		var res client.Result
		for _, child := range resp.Tasks {
			var counts map[string]int
			if err := json.Unmarshal(child.Value, &counts); err != nil {
				return client.Result{}, client.Permanent(err)
			}
			for w, n := range counts {
				total[w] += n
			}
			res.Depends = append(res.Depends, client.Ref(child))
		}
		res.MoveTo = "wc/out"
		res.Value, _ = json.Marshal(total)
		return res, nil
	}
	return map[string]client.Handler{"wc/job": split, "wc/map": mapDoc, "wc/reduce": reduce}
}

// byQueue sends each task to the handler of its queue.
func byQueue(handlers map[string]client.Handler) client.Handler {
	return func(ctx context.Context, t *client.Task) (client.Result, error) {
		h, ok := handlers[t.Queue]
		if !ok {
			return client.Result{}, client.Permanent(fmt.Errorf("no handler for queue %q", t.Queue))
		}
		return h(ctx, t)
	}
}
