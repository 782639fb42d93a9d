package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/checker"
	"github.com/e1158ecb/taskstore/testing/harness"
	"github.com/e1158ecb/taskstore/testing/workload"
)

// TestBackupRestore takes an online backup of a 5-node cluster in the
// middle of the chaos checkers' workload (inserts, claims, commits,
// transactions, zombies, impatient clients), destroys every node and data
// directory, restores the file into a new 3-node cluster and judges the
// restored state with the checkers (testing/checker) against the history
// as the backup saw it (workload.History.Cut): an op answered before the
// backup began must be in it, an op begun after it ended must not, and an
// op in flight at any point of the backup is "maybe". So: no task
// acknowledged before the backup began is lost, nothing after the backup
// is there, every task's versions are linearizable, and every restored
// version that an answer showed has that answer's claimant and lease.
// Queue settings, keys and schedules come along; the cluster id is new and
// the restored cluster takes writes. A copy of the file with one flipped
// byte is refused by verify and by restore, which leaves the directory
// empty.
//
// It runs with -short too (make test; about 12 s): a backup is what an
// operator falls back on when everything else is lost.
func TestBackupRestore(t *testing.T) {
	bin := harness.Binaries(t)
	taskctl := filepath.Join(bin, "taskctl")
	pc := harness.StartProcesses(t, 5, "--shards", "4", "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl := pc.Dial(ctx)
	oldStatus, err := cl.Status(ctx, &taskstorepb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}

	// Settings the restore must carry: a pause, a limit, a schedule, a
	// key in its dedup window.
	if _, err := cl.PauseQueue(ctx, "bk9/paused"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SetQueueLimit(ctx, "bk8/limited", 7); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cl.PutSchedule(ctx, &taskstorepb.Schedule{Name: "hourly", Queue: "bk7/cron", Cron: "0 * * * *"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Insert(ctx, "bk6/keyed", []byte("k"), client.WithID("keyed-1"), client.WithKey("the-key"), client.WithDedupWindow(time.Hour)); err != nil {
		t.Fatal(err)
	}

	h := workload.NewHistory()
	cfg := workload.Defaults
	cfg.Prefix = "wl"
	endpoints := pc.Endpoints()
	wl, err := workload.Start(cfg, h, func(ctx context.Context) (*client.Client, error) {
		return client.Dial(ctx, endpoints, client.WithAttemptTimeout(5*time.Second))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer wl.Stop()
	time.Sleep(3 * time.Second)

	file := filepath.Join(t.TempDir(), "cluster.tsb")
	backupBegan := time.Now()
	out, err := exec.CommandContext(ctx, taskctl, "--endpoints", pc.Endpoints(), "backup", "create", file).CombinedOutput()
	backupEnded := time.Now()
	if err != nil {
		t.Fatalf("backup create: %v\n%s", err, out)
	}
	t.Logf("backup create (%v): %s", backupEnded.Sub(backupBegan).Round(time.Millisecond), out)
	time.Sleep(time.Second) // writes after the backup, which must not come back
	wl.Stop()

	out, err = exec.Command(taskctl, "backup", "verify", file).CombinedOutput()
	if err != nil {
		t.Fatalf("backup verify: %v\n%s", err, out)
	}
	t.Logf("backup verify:\n%s", out)
	if _, err := os.Stat(file + ".partial"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the partial file is still there: %v", err)
	}

	// Every node and data directory of the old cluster goes.
	for _, p := range pc.Nodes {
		p.Kill()
		p.WaitExit(10 * time.Second)
		if err := os.RemoveAll(p.DataDir()); err != nil {
			t.Fatal(err)
		}
	}

	// One flipped byte: verify and restore refuse it, naming a part, and
	// restore leaves the directory empty.
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(data)
	bad[len(bad)*2/3] ^= 0x10
	badFile := filepath.Join(t.TempDir(), "bad.tsb")
	if err := os.WriteFile(badFile, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(taskctl, "backup", "verify", badFile).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "damaged or truncated") {
		t.Fatalf("verify of a damaged file: %v\n%s", err, out)
	}
	t.Logf("verify of a damaged file: %s", out)

	// The new cluster: three nodes, restored from the file.
	rc := harness.NewProcesses(t, 3, func(id string) []string {
		if id == "n3" {
			return []string{"--state", "memory", "--raft-timeout-scale", "2"}
		}
		return []string{"--raft-timeout-scale", "2"}
	})
	restore := func(p *harness.Process, from string) ([]byte, error) {
		return exec.Command(filepath.Join(bin, "taskstored"), "restore", "--from", from, "--id", p.ID,
			"--data-dir", p.DataDir(), "--initial-cluster", rc.InitialCluster).CombinedOutput()
	}
	out, err = restore(rc.Nodes[0], badFile)
	if err == nil || !strings.Contains(string(out), "damaged or truncated") {
		t.Fatalf("restore of a damaged file: %v\n%s", err, out)
	}
	if entries, _ := os.ReadDir(rc.Nodes[0].DataDir()); len(entries) > 0 {
		t.Fatalf("a refused restore left %d entries in the data directory", len(entries))
	}
	var clusterID string
	for _, p := range rc.Nodes {
		start := time.Now()
		out, err := restore(p, file)
		if err != nil {
			t.Fatalf("restore %s: %v\n%s", p.ID, err, out)
		}
		t.Logf("restore %s (%v): %s", p.ID, time.Since(start).Round(time.Millisecond), out)
		var newID, oldID string
		if _, err := fmt.Sscanf(string(out[bytes.Index(out, []byte("new cluster ")):]), "new cluster %s from a backup of cluster %s", &newID, &oldID); err != nil || newID == oldID {
			t.Fatalf("restore %s: new cluster %q, old %q (%v)", p.ID, newID, oldID, err)
		}
		if clusterID == "" {
			clusterID = newID
		} else if newID != clusterID {
			t.Fatalf("restore %s: cluster %s, another node's restore made %s", p.ID, newID, clusterID)
		}
	}
	out, err = restore(rc.Nodes[0], file)
	if err == nil || !strings.Contains(string(out), "not empty") {
		t.Fatalf("restore into a non-empty directory: %v\n%s", err, out)
	}
	rc.StartAll()
	rc.WaitReady(60 * time.Second)
	nc := rc.Dial(ctx)
	st, err := nc.Status(ctx, &taskstorepb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Shards) != len(oldStatus.Shards) {
		t.Fatalf("restored %d shards, backed up %d", len(st.Shards), len(oldStatus.Shards))
	}

	final, err := workload.ReadFinal(ctx, nc, cfg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	cut := h.Cut(backupBegan, backupEnded)
	checker.Judge(t, "backup-restore", checker.Input{History: cut, Final: final,
		Floor: checker.Floor{checker.FloorOps: 100, checker.FloorClaimed: 10, checker.FloorCommits: 10}}, 0, began)
	// The model checks versions; the claimant and lease of a version are
	// those of the answer that returned it (any answer, during the backup
	// too: a version is made once).
	made := map[workload.Ref]workload.TaskVersion{}
	for _, op := range h.Ops() {
		if op.Outcome == workload.OK {
			for _, tv := range op.Tasks {
				made[workload.Ref{ID: tv.ID, Version: tv.Version}] = tv
			}
		}
	}
	shown := 0
	for _, got := range final.Tasks {
		tv, ok := made[workload.Ref{ID: got.ID, Version: got.Version}]
		if !ok {
			continue // made by an op whose answer was lost
		}
		shown++
		if got.Claimant != tv.Claimant || !got.At.Equal(tv.At) {
			t.Errorf("task %s version %d: restored claimant %q lease/at %v; the answer that made it said %q, %v",
				got.ID, got.Version, got.Claimant, got.At, tv.Claimant, tv.At)
		}
	}
	before := 0
	for _, op := range cut.Ops() {
		if op.Outcome == workload.OK && op.End.Before(backupBegan) {
			before++
		}
	}
	t.Logf("%d ops answered before the backup began, %d in flight during it or refused before; %d tasks restored, %d of their versions checked against the answer that made them",
		before, len(cut.Ops())-before, len(final.Tasks), shown)
	if before == 0 || shown == 0 {
		t.Fatal("the workload did nothing before the backup")
	}

	// Settings, keys and schedules came along.
	if _, err := nc.Insert(ctx, "bk6/keyed", []byte("k2"), client.WithKey("the-key"), client.WithDedupWindow(time.Hour)); err == nil {
		t.Error("a key inserted before the backup was accepted again in the restored cluster")
	}
	qs, err := nc.Queues(ctx, &taskstorepb.QueuesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var paused, limited bool
	for _, q := range qs.Queues {
		if q.Name == "bk9/paused" && q.Paused {
			paused = true
		}
		if q.Name == "bk8/limited" && q.MaxClaimed == 7 {
			limited = true
		}
	}
	if !paused || !limited {
		t.Errorf("restored queues: paused %v, limited %v: %v", paused, limited, qs.Queues)
	}
	scheds, err := nc.Schedules(ctx, &taskstorepb.SchedulesRequest{Prefix: "bk7/"})
	if err != nil || len(scheds.Schedules) != 1 {
		t.Errorf("restored schedules: %v %v", scheds, err)
	}
	// And it takes writes and claims.
	if _, err := nc.Insert(ctx, "bk5/after", []byte("after"), client.WithID("after-restore")); err != nil {
		t.Fatalf("insert into the restored cluster: %v", err)
	}
}
