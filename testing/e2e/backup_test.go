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
	"sync"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// ackedVersion is one version of a task a client saw acknowledged.
type ackedVersion struct {
	version  uint64
	claimant string
	at       int64 // unix nanoseconds: the lease's end for a claim
	acked    time.Time
}

// backupModel records what the workload did: every acknowledged version
// of every task, and when each insert began.
type backupModel struct {
	mu       sync.Mutex
	versions map[string][]ackedVersion
	began    map[string]time.Time // insert of the id was first sent
	queueOf  map[string]string
	// busy is when the last operation on the task (a claim that returned
	// it, its insert) began.
	busy map[string]time.Time
	// lostClaim is, per queue, when the first claim whose answer never
	// came began: it may have claimed any task of the queue.
	lostClaim map[string]time.Time
}

// untouched reports whether nothing could have changed task id after t:
// its last operation began before t and was answered before t, and no
// claim on its queue lost its answer before t.
func (m *backupModel) untouched(id, queue string, t time.Time) bool {
	if !m.busy[id].Before(t) {
		return false
	}
	for _, v := range m.versions[id] {
		if !v.acked.Before(t) {
			return false
		}
	}
	lost, ok := m.lostClaim[queue]
	return !ok || !lost.Before(t)
}

func (m *backupModel) ack(t *taskstorepb.Task, began time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.versions[t.Id] = append(m.versions[t.Id], ackedVersion{version: t.Version, claimant: t.Claimant, at: t.At.AsTime().UnixNano(), acked: time.Now()})
	if began.After(m.busy[t.Id]) {
		m.busy[t.Id] = began
	}
}

// TestBackupRestore takes an online backup of a 5-node cluster under a
// workload of inserts and claims, destroys every node and data directory,
// restores the file into a new 3-node cluster, and checks it against what
// the clients saw acknowledged: every task acknowledged before the backup
// began is there, with the version, claimant and lease of its last
// acknowledged version before then when nothing touched it during the
// backup; no task whose insert began after the backup ended is there;
// every restored version is one a client saw or had in flight; queue
// settings, keys and schedules came along; the cluster id is new and the
// restored cluster takes writes. A copy of the file with one flipped byte
// is refused by verify and by restore, which leaves the directory empty.
func TestBackupRestore(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := harness.Binaries(t)
	taskctl := filepath.Join(bin, "taskctl")
	pc := harness.StartProcesses(t, 5, "--shards", "4", "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
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

	model := &backupModel{versions: map[string][]ackedVersion{}, began: map[string]time.Time{}, busy: map[string]time.Time{}, lostClaim: map[string]time.Time{}, queueOf: map[string]string{}}
	const groups = 6
	queue := func(g int) string { return fmt.Sprintf("bk%d/work", g) }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("w%d-%05d", w, i)
				began := time.Now()
				model.mu.Lock()
				model.began[id], model.busy[id], model.queueOf[id] = began, began, queue(i%groups)
				model.mu.Unlock()
				cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
				task, err := cl.Insert(cctx, queue(i%groups), []byte(id), client.WithID(id))
				ccancel()
				if err == nil {
					model.ack(task, began)
				}
				if i%3 == 0 {
					began := time.Now()
					cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
					res, err := cl.Claim(cctx, &taskstorepb.ClaimRequest{Claimant: fmt.Sprintf("worker%d", w), Queues: []string{queue(i % groups)}, Limit: 2})
					ccancel()
					if err == nil {
						for _, task := range res.Tasks {
							model.ack(task, began)
						}
					} else {
						model.mu.Lock()
						if _, ok := model.lostClaim[queue(i%groups)]; !ok {
							model.lostClaim[queue(i%groups)] = began
						}
						model.mu.Unlock()
					}
				}
			}
		}()
	}
	time.Sleep(2 * time.Second)

	file := filepath.Join(t.TempDir(), "cluster.tsb")
	backupBegan := time.Now()
	out, err := exec.CommandContext(ctx, taskctl, "--endpoints", pc.Endpoints(), "backup", "create", file).CombinedOutput()
	backupEnded := time.Now()
	if err != nil {
		t.Fatalf("backup create: %v\n%s", err, out)
	}
	t.Logf("backup create (%v): %s", backupEnded.Sub(backupBegan).Round(time.Millisecond), out)
	time.Sleep(time.Second) // writes after the backup, which must not come back
	close(stop)
	wg.Wait()

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

	restored := map[string]*taskstorepb.Task{}
	for g := 0; g < groups; g++ {
		for _, task := range listAll(t, ctx, nc, queue(g)) {
			restored[task.Id] = task
		}
	}
	model.mu.Lock()
	defer model.mu.Unlock()
	var before, exact int
	for id, vs := range model.versions {
		// The last version acknowledged before the backup began.
		var last *ackedVersion
		for i := range vs {
			if vs[i].acked.Before(backupBegan) && (last == nil || vs[i].version > last.version) {
				last = &vs[i]
			}
		}
		if last == nil {
			continue
		}
		before++
		got := restored[id]
		if got == nil {
			t.Errorf("task %s (version %d acknowledged before the backup began) is not in the restored cluster", id, last.version)
			continue
		}
		if got.Version < last.version {
			t.Errorf("task %s: restored version %d, version %d was acknowledged before the backup began", id, got.Version, last.version)
		}
		if model.untouched(id, model.queueOf[id], backupBegan) {
			// Nothing touched it while the backup ran: exactly as acknowledged.
			exact++
			if got.Version != last.version || got.Claimant != last.claimant || got.At.AsTime().UnixNano() != last.at {
				t.Errorf("task %s: restored version %d claimant %q at %v; acknowledged version %d claimant %q at %v",
					id, got.Version, got.Claimant, got.At.AsTime(), last.version, last.claimant, time.Unix(0, last.at))
			}
		}
	}
	for id, got := range restored {
		began, ok := model.began[id]
		if !ok {
			t.Errorf("restored task %s was never inserted", id)
			continue
		}
		if began.After(backupEnded) {
			t.Errorf("restored task %s was inserted after the backup ended", id)
		}
		known := false
		for _, v := range model.versions[id] {
			if v.version == got.Version {
				known = true
				if got.Claimant != v.claimant || got.At.AsTime().UnixNano() != v.at {
					t.Errorf("task %s version %d: restored claimant %q at %v, acknowledged %q at %v", id, got.Version, got.Claimant, got.At.AsTime(), v.claimant, time.Unix(0, v.at))
				}
			}
		}
		if !known && got.Version > 1 {
			// A claim whose answer was lost: it began before the backup ended.
			if model.busy[id].After(backupEnded) {
				t.Errorf("task %s: restored version %d, which no client saw, and nothing was in flight on it during the backup", id, got.Version)
			}
		}
	}
	t.Logf("%d tasks acknowledged before the backup began (%d untouched during it, checked exactly); %d tasks restored; %d inserts in all",
		before, exact, len(restored), len(model.began))
	if before == 0 || exact == 0 {
		t.Fatal("the workload acknowledged nothing before the backup")
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
	if _, err := nc.Insert(ctx, queue(0), []byte("after"), client.WithID("after-restore")); err != nil {
		t.Fatalf("insert into the restored cluster: %v", err)
	}
}
