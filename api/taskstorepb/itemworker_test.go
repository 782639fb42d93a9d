package taskstorepb

import (
	"testing"
	"time"
)

// TestRunItemNeverQueues: an item starts while another still runs (a
// worker busy with one is never waited for).
func TestRunItemNeverQueues(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	runItem(func() { <-release })
	done := make(chan struct{})
	runItem(func() { close(done) })
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("an item waited behind a running one")
	}
}

// TestRunItemReusesWorkers: items that come one after another run on the
// worker the one before left waiting, not on a new goroutine each.
func TestRunItemReusesWorkers(t *testing.T) {
	before := workersStarted.Load()
	for range 100 {
		done := make(chan struct{})
		runItem(func() { close(done) })
		<-done
		time.Sleep(time.Millisecond) // the worker gets back to waiting
	}
	if started := workersStarted.Load() - before; started > 50 {
		t.Errorf("100 items one after another started %d workers, want most of them reused", started)
	}
}
