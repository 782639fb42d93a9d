package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// lockedBuffer collects a process's output while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestDevClusterFailsOverAndStopsCleanly walks the README's failover step
// on `taskstored dev` (what `make run` runs), as written: kill -9 the node
// process named in data/dev/n1.pid; writes go on; dev starts the node again
// and every acknowledged write is there; Ctrl-C then stops the whole cluster
// with exit 0 and no WARN or ERROR line (the dev
// cluster was one process, so no node could be killed, and Ctrl-C printed a
// screen of warnings).
func TestDevClusterFailsOverAndStopsCleanly(t *testing.T) {
	if testing.Short() {
		t.Skip("a long scenario (tens of seconds): skipped with -short; make test-full runs it")
	}
	bin := harness.Binaries(t)
	dir := t.TempDir()
	var out lockedBuffer
	dev := exec.Command(filepath.Join(bin, "taskstored"), "dev", "--data-dir", dir)
	dev.Stdout, dev.Stderr = &out, &out
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- dev.Wait() }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			dev.Process.Signal(syscall.SIGINT)
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				dev.Process.Kill()
			}
		}
		if t.Failed() {
			t.Logf("dev output:\n%s", out.String())
		}
	})
	// The dev cluster's ports are fixed: make sure the nodes that answer
	// there are this test's (their pid files in dir), not another dev
	// cluster's that held the ports first and made this one give up.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "n3.pid")); err == nil {
			break
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("taskstored dev exited before starting its nodes (%v): is another dev cluster running?", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("taskstored dev started no node within a minute")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := client.Dial(ctx, "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103", client.WithAttemptTimeout(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var acked []string
	insert := func(what string) {
		t.Helper()
		ictx, icancel := context.WithTimeout(ctx, 30*time.Second)
		defer icancel()
		task, err := cl.Insert(ictx, "demo/failover", []byte(what))
		if err != nil {
			t.Fatalf("insert %s: %v", what, err)
		}
		acked = append(acked, task.Id)
	}
	insert("before")

	pidOf := func(id string) int {
		b, err := os.ReadFile(filepath.Join(dir, id+".pid"))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	old := pidOf("n1")
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		insert(fmt.Sprintf("during-%d", i))
	}
	// dev starts n1 again after 10 s; it rejoins and catches up.
	deadline := time.Now().Add(90 * time.Second)
	for {
		if pid := pidOf("n1"); pid != old {
			st, err := cl.Status(ctx, &taskstorepb.StatusRequest{})
			if err == nil {
				healthy := 0
				for _, s := range st.Shards {
					if h, p := taskstorepb.HealthyReplicas(s); h == p {
						healthy++
					}
				}
				if healthy == len(st.Shards) && len(st.Shards) == 3 {
					break
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("n1 was not started again and caught up")
		}
		time.Sleep(500 * time.Millisecond)
	}
	insert("after")
	for _, id := range acked {
		if _, err := cl.Get(ctx, id); err != nil {
			t.Fatalf("acknowledged task %s: %v", id, err)
		}
	}

	stopAt := len(out.String())
	if err := dev.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("dev exited with %v after Ctrl-C", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("dev did not stop within 60 s of Ctrl-C")
	}
	stopped := 0
	for _, l := range strings.Split(out.String()[stopAt:], "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			t.Errorf("stopping logged: %s", l)
		}
		if strings.Contains(l, `msg="node stopped"`) {
			stopped++
		}
	}
	if stopped != 3 {
		t.Errorf("%d nodes said they stopped, want 3", stopped)
	}
}
