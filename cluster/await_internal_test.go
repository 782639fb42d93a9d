package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// stuckFuture is a raft future that never answers, as one may not after
// its group shut down (hashicorp/raft#498).
type stuckFuture struct{ never chan struct{} }

func (f stuckFuture) Error() error { <-f.never; return nil }

type answered struct{ err error }

func (f answered) Error() error { return f.err }

var (
	_ raft.Future = stuckFuture{}
	_ raft.Future = answered{}
)

// TestAwaitFutureHasAWayOut: a future that never answers does not hold its
// waiter once stop is closed or ctx ends; an answer is passed on.
func TestAwaitFutureHasAWayOut(t *testing.T) {
	stuck := stuckFuture{never: make(chan struct{})}
	defer close(stuck.never)
	stop := make(chan struct{})
	close(stop)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err, stopped := awaitFuture(context.Background(), stop, stuck); err != nil || !errors.Is(stopped, ErrShutdown) {
			t.Errorf("stopped: %v %v, want ErrShutdown", err, stopped)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err, stopped := awaitFuture(ctx, nil, stuck); err != nil || !errors.Is(stopped, context.DeadlineExceeded) {
			t.Errorf("ctx ended: %v %v, want DeadlineExceeded", err, stopped)
		}
		if err := waitFuture(ctx, stuck); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("waitFuture: %v", err)
		}
		boom := errors.New("boom")
		if err, stopped := awaitFuture(context.Background(), nil, answered{boom}); err != boom || stopped != nil {
			t.Errorf("answer: %v %v", err, stopped)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("awaitFuture waited on a future that never answers")
	}
}
