package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestLargeAnswers: answers over gRPC's default 4 MiB
// receive size must reach the caller, directly, through the proxy over gRPC
// and over HTTP/JSON. Five inserts of 1 MiB in one request, a claim of five
// such tasks, and a commit that claims five more each answer about 5 MiB;
// before the fix each was committed and reported as ResourceExhausted.
func TestLargeAnswers(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	checkLargeAnswers(t, strings.Join(c.Endpoints(), ","), p.Addr(), p.HTTPAddr())
}

// TestLargeAnswersProcesses is TestLargeAnswers against real taskstored
// and taskproxy processes.
func TestLargeAnswersProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	pc := harness.StartProcesses(t, 3, "--shards", "4", "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
	p := pc.StartProxy("p1")
	for deadline := time.Now().Add(30 * time.Second); !p.Ready(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("proxy not ready")
		}
	}
	checkLargeAnswers(t, pc.Endpoints(), p.Addr, p.HTTP)
}

func checkLargeAnswers(t *testing.T, nodes, proxyAddr, proxyHTTP string) {
	value := bytes.Repeat([]byte{'v'}, 1<<20) // fsm.DefaultLimits.MaxValueBytes
	inserts := func(queue, prefix string) *taskstorepb.ModifyRequest {
		req := &taskstorepb.ModifyRequest{}
		for i := range 5 {
			req.Inserts = append(req.Inserts, &taskstorepb.TaskInsert{Queue: queue, Id: fmt.Sprintf("%s-%d", prefix, i), Value: value})
		}
		return req
	}
	check := func(what string, tasks []*taskstorepb.Task) {
		t.Helper()
		if len(tasks) != 5 {
			t.Fatalf("%s: %d tasks, want 5", what, len(tasks))
		}
		for _, tk := range tasks {
			if !bytes.Equal(tk.Value, value) {
				t.Fatalf("%s: task %s has a value of %d bytes", what, tk.Id, len(tk.Value))
			}
		}
	}

	for _, path := range []struct {
		name string
		cl   *client.Client
	}{
		{"direct", dial(t, nodes, client.WithClaimant("w"))},
		{"proxy", dial(t, proxyAddr, client.WithProxyOnly(), client.WithClaimant("w"))},
	} {
		t.Run(path.name, func(t *testing.T) {
			// The test is about sizes, not speed: each step moves ~5 MiB
			// through the log of three replicas, and under -race on a loaded
			// 2-core machine the direct path once used up 60 s.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			queue := "big" + path.name + "/q"
			res, err := path.cl.Modify(ctx, inserts(queue, path.name+"-a"))
			if err != nil {
				t.Fatalf("insert of 5 x 1 MiB: %v", err)
			}
			check("insert", res.Inserted)
			claim, err := path.cl.Claim(ctx, &taskstorepb.ClaimRequest{Queues: []string{queue}, Limit: 5, Lease: durationpb.New(time.Minute)})
			if err != nil {
				t.Fatalf("claim of 5 x 1 MiB: %v", err)
			}
			check("claim", claim.Tasks)
			// Commit the five (delete) and claim five more in one request.
			if _, err := path.cl.Modify(ctx, inserts(queue, path.name+"-b")); err != nil {
				t.Fatal(err)
			}
			commit := &taskstorepb.ModifyRequest{Claim: &taskstorepb.ModifyClaim{Queues: []string{queue}, Limit: 5, Lease: durationpb.New(time.Minute)}}
			for _, tk := range claim.Tasks {
				commit.Deletes = append(commit.Deletes, &taskstorepb.TaskRef{Id: tk.Id, Version: tk.Version, Queue: queue})
			}
			next, err := path.cl.Modify(ctx, commit)
			if err != nil {
				t.Fatalf("commit that claims 5 x 1 MiB: %v", err)
			}
			check("commit+claim", next.Claimed)
		})
	}

	t.Run("http", func(t *testing.T) {
		base := "http://" + proxyHTTP
		do := func(path string, body []byte) []byte {
			t.Helper()
			res, err := http.Post(base+path, "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, err := io.ReadAll(res.Body)
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != http.StatusOK {
				t.Fatalf("POST %s: HTTP %d: %.500s", path, res.StatusCode, b)
			}
			return b
		}
		queue := "bighttp/q"
		body, err := protojson.Marshal(inserts(queue, "http-a"))
		if err != nil {
			t.Fatal(err)
		}
		var mres taskstorepb.ModifyResponse
		if err := protojson.Unmarshal(do("/v1/modify", body), &mres); err != nil {
			t.Fatal(err)
		}
		check("insert", mres.Inserted)
		body, _ = protojson.Marshal(&taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{queue}, Limit: 5, Lease: durationpb.New(time.Minute)})
		var cres taskstorepb.ClaimResponse
		if err := protojson.Unmarshal(do("/v1/claim", body), &cres); err != nil {
			t.Fatal(err)
		}
		check("claim", cres.Tasks)
	})
}
