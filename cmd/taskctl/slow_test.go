package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

type stuckAdmin struct {
	taskstorepb.UnimplementedAdminServer
}

func (stuckAdmin) Status(ctx context.Context, _ *taskstorepb.StatusRequest) (*taskstorepb.StatusResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestTimeoutOfAReachedNodeSaysSlow: when the node was reached and did not
// answer, taskctl says so and suggests a longer timeout, instead of
// blaming --endpoints ("the timeout message should say
// what was slow").
func TestTimeoutOfAReachedNodeSaysSlow(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	taskstorepb.RegisterAdminServer(srv, stuckAdmin{})
	go srv.Serve(ln)
	defer srv.Stop()
	start := time.Now()
	r := runOffline(t, "--endpoints", ln.Addr().String(), "--timeout", "1s", "status")
	if r.code == 0 {
		t.Fatalf("status of a node that never answers succeeded: %+v", r)
	}
	for _, want := range []string{"connected, no answer in", "reached but did not answer in time", "raise --timeout"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "check --endpoints") {
		t.Errorf("stderr blames the endpoints:\n%s", r.stderr)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v with --timeout 1s", took)
	}
}
