package main

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"
)

// A node process that exits cleanly (a removed node exits 0) is not
// started again: the supervisor returns at once instead of restarting it
// into the same removal every devRestartAfter.
func TestDevDoesNotRestartACleanExit(t *testing.T) {
	n := &devNode{id: "n9", exe: "/bin/true", pidFile: filepath.Join(t.TempDir(), "n9.pid"), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := n.start(); err != nil {
		t.Skip("no /bin/true:", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		n.supervise(ctx)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(devRestartAfter / 2):
		t.Fatal("the supervisor is still waiting to restart a node that exited cleanly")
	}
}
