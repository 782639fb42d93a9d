package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
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

// A node that stopped because it was removed (it leaves REMOVED in its data
// directory) has its data directory deleted by dev; a node that exited
// cleanly for another reason keeps it.
func TestDevDeletesARemovedNodesData(t *testing.T) {
	for _, removed := range []bool{true, false} {
		dir := filepath.Join(t.TempDir(), "n9")
		if err := os.MkdirAll(filepath.Join(dir, "shards"), 0o755); err != nil {
			t.Fatal(err)
		}
		script := "true"
		if removed {
			script = "touch " + filepath.Join(dir, removedMarker)
		}
		n := &devNode{id: "n9", exe: "/bin/sh", args: []string{"-c", script}, dataDir: dir,
			pidFile: filepath.Join(t.TempDir(), "n9.pid"), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		if err := n.start(); err != nil {
			t.Skip("no /bin/sh:", err)
		}
		n.supervise(context.Background())
		_, err := os.Stat(dir)
		if gone := errors.Is(err, os.ErrNotExist); gone != removed {
			t.Errorf("removed %v: data directory gone %v (%v)", removed, gone, err)
		}
	}
}
