package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestBackupThroughProxy: taskctl backup create given only a taskproxy's
// address (as --endpoints, and with --proxy) writes a complete backup:
// the proxy relays each shard's copy from its leader and the map from the
// meta leader. verify reads every task back from the file.
func TestBackupThroughProxy(t *testing.T) {
	bin := harness.Binaries(t)
	taskctl := filepath.Join(bin, "taskctl")
	pc := harness.StartProcesses(t, 3, "--shards", "2", "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
	px := pc.StartProxy("proxy")
	deadline := time.Now().Add(60 * time.Second)
	for !px.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("the proxy did not become ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := pc.Dial(ctx)
	const tasks = 300
	for i := range tasks / 10 {
		req := &taskstorepb.ModifyRequest{}
		for j := range 10 {
			req.Inserts = append(req.Inserts, &taskstorepb.TaskInsert{Queue: fmt.Sprintf("g%d/q%d", i%7, j%3), Value: []byte("v")})
		}
		if _, err := cl.Modify(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"--endpoints", px.Addr},
		{"--endpoints", px.Addr, "--proxy"},
	} {
		file := filepath.Join(t.TempDir(), "proxy.tsb")
		cmd := append(append([]string{}, args...), "backup", "create", file)
		out, err := exec.CommandContext(ctx, taskctl, cmd...).CombinedOutput()
		if err != nil {
			t.Fatalf("taskctl %v: %v\n%s", cmd, err, out)
		}
		out, err = exec.CommandContext(ctx, taskctl, "backup", "verify", "-o", "json", file).CombinedOutput()
		if err != nil {
			t.Fatalf("verify the backup made through the proxy (%v): %v\n%s", args, err, out)
		}
		var m struct {
			Shards []struct {
				Tasks uint64 `json:"tasks"`
			} `json:"shards"`
		}
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("verify -o json: %v\n%s", err, out)
		}
		var total uint64
		for _, s := range m.Shards {
			total += s.Tasks
		}
		if len(m.Shards) != 2 || total != tasks {
			t.Errorf("%v: the backup holds %d shards and %d tasks, want 2 and %d\n%s", args, len(m.Shards), total, tasks, out)
		}
	}
}
