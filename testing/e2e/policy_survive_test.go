package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// Queues of one consistency group (one slot) for TestPoliciesSurvive: a
// delivery limit with its dead-letter queue, and a retention.
const (
	survGroup  = "polsurv"
	survWork   = survGroup + "/work"
	survDead   = survGroup + "/dead"
	survOld    = survGroup + "/old"
	survClaims = 2
	survRetain = 2 * time.Second
	survLease  = 400 * time.Millisecond
)

// TestPoliciesSurvive: queue policies survive a backup and its restore into
// a new cluster, a move of their slot to a shard added afterwards, and a
// restart of every node, on each state store. Real taskstored processes. At
// each stage the policies read back and are enforced: a task claimed
// survClaims times without a commit is dead-lettered by the next claim (on
// the shard that serves the slot then), and a task of the retained queue
// is deleted within seconds of its retain.
func TestPoliciesSurvive(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, store := range []string{"memory", "disk"} {
		t.Run(store, func(t *testing.T) { policiesSurvive(t, store) })
	}
}

func policiesSurvive(t *testing.T, store string) {
	bin := harness.Binaries(t)
	args := []string{"--shards", "2", "--raft-timeout-scale", "2", "--state", store}
	pc := harness.StartProcesses(t, 3, args...)
	pc.WaitReady(60 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl := pc.Dial(ctx)

	// The cluster raises the state format after its start: until then a
	// policy is refused as too new.
	for {
		_, err := cl.SetQueuePolicy(ctx, survOld, &taskstorepb.QueuePolicy{Retain: durationpb.New(survRetain)})
		if err == nil {
			break
		}
		if ctx.Err() != nil || !strings.Contains(err.Error(), "format") {
			t.Fatalf("set policy: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := cl.SetQueuePolicy(ctx, survWork, &taskstorepb.QueuePolicy{MaxClaims: survClaims, DeadLetter: survDead}); err != nil {
		t.Fatal(err)
	}
	checkPolicies(t, ctx, cl, "before")

	// (a) A backup, restored into a new cluster.
	file := filepath.Join(t.TempDir(), "policies.tsb")
	if out, err := exec.CommandContext(ctx, filepath.Join(bin, "taskctl"), "--endpoints", pc.Endpoints(), "backup", "create", file).CombinedOutput(); err != nil {
		t.Fatalf("backup create: %v\n%s", err, out)
	}
	for _, p := range pc.Nodes {
		p.Kill()
		p.WaitExit(10 * time.Second)
	}
	rc := harness.NewProcesses(t, 3, func(string) []string { return args[2:] })
	for _, p := range rc.Nodes {
		out, err := exec.CommandContext(ctx, filepath.Join(bin, "taskstored"), "restore", "--from", file, "--id", p.ID,
			"--data-dir", p.DataDir(), "--initial-cluster", rc.InitialCluster).CombinedOutput()
		if err != nil {
			t.Fatalf("restore %s: %v\n%s", p.ID, err, out)
		}
	}
	rc.StartAll()
	rc.WaitReady(60 * time.Second)
	nc := rc.Dial(ctx)
	checkPolicies(t, ctx, nc, "restored")

	// (b) A shard added and the policies' slot moved to it.
	rt, err := nc.Routing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slot := uint32(taskstorepb.SlotOf(survGroup, len(rt.Slots)))
	added, err := nc.AddShards(ctx, 1)
	if err != nil || len(added) != 1 {
		t.Fatalf("add a shard: %v %v", added, err)
	}
	to := added[0].Id
	var moves []*taskstorepb.SlotMove
	for {
		moves, err = nc.MoveSlots(ctx, []uint32{slot}, to)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("move slot %d to shard %d: %v", slot, to, err)
		}
		time.Sleep(300 * time.Millisecond) // the new shard elects its leader
	}
	if err := nc.WaitMoves(ctx, moves, nil); err != nil {
		t.Fatal(err)
	}
	if rt, err = nc.Routing(ctx); err != nil || rt.Slots[slot] != to {
		t.Fatalf("slot %d after its move: on shard %d, want %d (%v)", slot, rt.GetSlots()[slot], to, err)
	}
	checkPolicies(t, ctx, nc, "moved")

	// And a restart of every node.
	for _, p := range rc.Nodes {
		p.Stop()
	}
	for _, p := range rc.Nodes {
		if _, ok := p.WaitExit(30 * time.Second); !ok {
			p.Kill()
			p.WaitExit(10 * time.Second)
		}
	}
	rc.StartAll()
	rc.WaitReady(60 * time.Second)
	// Ready means caught up with the meta group since the start: the
	// routing table names the added shard (docs/operations.md).
	checkPolicies(t, ctx, rc.Dial(ctx), "restarted")
}

// checkPolicies reads both policies back and checks that they are
// enforced; stage names the tasks it inserts.
func checkPolicies(t *testing.T, ctx context.Context, cl *client.Client, stage string) {
	t.Helper()
	p, err := cl.QueuePolicy(ctx, survWork)
	if err != nil || p.GetMaxClaims() != survClaims || p.GetDeadLetter() != survDead {
		t.Fatalf("%s: policy of %s reads %v (%v)", stage, survWork, p, err)
	}
	p, err = cl.QueuePolicy(ctx, survOld)
	if err != nil || p.GetRetain().AsDuration() != survRetain {
		t.Fatalf("%s: policy of %s reads %v (%v)", stage, survOld, p, err)
	}

	// The delivery limit: survClaims leases run out, the next claim
	// dead-letters the task.
	id := "poison-" + stage
	if _, err := cl.Insert(ctx, survWork, []byte(id), client.WithID(id)); err != nil {
		t.Fatalf("%s: %v", stage, err)
	}
	claim := func() []*taskstorepb.Task {
		resp, err := cl.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "w-" + stage, Queues: []string{survWork},
			Lease: durationpb.New(survLease), Limit: 1})
		if err != nil {
			t.Fatalf("%s: claim: %v", stage, err)
		}
		return resp.Tasks
	}
	for i := range survClaims {
		if got := claim(); len(got) != 1 || got[0].Id != id {
			t.Fatalf("%s: claim %d got %v, want %s", stage, i+1, got, id)
		}
		time.Sleep(survLease + 300*time.Millisecond) // the lease runs out
	}
	if got := claim(); len(got) != 0 {
		t.Fatalf("%s: claim %d got %v, want nothing (%s dead-lettered)", stage, survClaims+1, got, id)
	}
	dl, err := cl.Tasks(ctx, &taskstorepb.TasksRequest{Queue: survDead})
	if err != nil {
		t.Fatalf("%s: %v", stage, err)
	}
	found := false
	for _, tk := range dl.Tasks {
		if tk.Id == id {
			found = true
			if tk.Headers["dead-letter-from"] != survWork || tk.Headers["dead-letter-claims"] != fmt.Sprint(survClaims) {
				t.Errorf("%s: dead-lettered task %v", stage, tk)
			}
		}
	}
	if !found {
		t.Fatalf("%s: %s not in %s (it holds %v)", stage, id, survDead, dl.Tasks)
	}

	// The retention: a task inserted now is gone within seconds of its
	// retain.
	old := "old-" + stage
	if _, err := cl.Insert(ctx, survOld, []byte(old), client.WithID(old)); err != nil {
		t.Fatalf("%s: %v", stage, err)
	}
	inserted := time.Now()
	for {
		left, err := cl.Tasks(ctx, &taskstorepb.TasksRequest{Queue: survOld})
		if err == nil && len(left.Tasks) == 0 {
			break
		}
		if time.Since(inserted) > survRetain+30*time.Second {
			t.Fatalf("%s: %s still holds %v %v after its insert (retain %v; %v)", stage, survOld, left.GetTasks(), time.Since(inserted).Round(time.Second), survRetain, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("%s: both policies read back and enforced", stage)
}
