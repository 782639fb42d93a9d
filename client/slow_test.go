package client_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// slowAdmin answers Status after a delay, like a node under load whose
// Status waits on its peers.
type slowAdmin struct {
	taskstorepb.UnimplementedAdminServer
	delay time.Duration
}

func (s slowAdmin) Status(ctx context.Context, _ *taskstorepb.StatusRequest) (*taskstorepb.StatusResponse, error) {
	select {
	case <-time.After(s.delay):
		return &taskstorepb.StatusResponse{Node: "slow"}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func serveSlow(t *testing.T, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	taskstorepb.RegisterAdminServer(srv, slowAdmin{delay: delay})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// TestSlowStatusGetsTheWholeTimeout: a node that answers Status in a little
// over half of the caller's timeout is answered. Each attempt used to get
// half of what the deadline left, so `taskctl shard list --timeout 3s`
// against a node taking 1.6 s failed every time while the node was fine.
func TestSlowStatusGetsTheWholeTimeout(t *testing.T) {
	addr := serveSlow(t, 1600*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status(ctx, nil)
	if err != nil {
		t.Fatalf("status from a node answering in 1.6 s, with 3 s: %v", err)
	}
	if st.Node != "slow" {
		t.Fatalf("answer from %q", st.Node)
	}
}

// TestTimeoutSaysWhatWasSlow: a call that runs out of time says, per
// attempt, whether the node was reached and did not answer, or was not
// reached; ConnectedButSlow tells the two apart for taskctl's hint.
func TestTimeoutSaysWhatWasSlow(t *testing.T) {
	addr := serveSlow(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Status(ctx, nil)
	if err == nil {
		t.Fatal("status of a node that never answers succeeded")
	}
	if !strings.Contains(err.Error(), addr+" connected, no answer in ") || !client.ConnectedButSlow(err) {
		t.Fatalf("error does not say the node was reached and slow (slow=%v): %v", client.ConnectedButSlow(err), err)
	}
	if !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("not ErrUnavailable: %v", err)
	}

	// A port nobody listens on: not reached, so not "slow".
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	c2, err := client.Dial(ctx2, gone)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_, err = c2.Status(ctx2, nil)
	if err == nil || client.ConnectedButSlow(err) {
		t.Fatalf("status of a closed port: %v (slow=%v)", err, client.ConnectedButSlow(err))
	}
	if !strings.Contains(err.Error(), "attempt(s)") {
		t.Fatalf("error does not list the attempts: %v", err)
	}
}
