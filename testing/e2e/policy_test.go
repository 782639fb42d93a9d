package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
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

// poisonWorkerEnv makes the test binary a worker process (TestMain): it
// claims tasks of the queue it names one at a time, deletes each (its
// commit), dies at once (exit code poisonExit) on a task whose value is
// "poison", and exits 0 after an idle spell with nothing to claim.
const (
	poisonWorkerEnv = "TASKSTORE_E2E_POISON_WORKER" // endpoints,queue,claimant
	poisonExit      = 3
	poisonLease     = time.Second
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(poisonWorkerEnv); spec != "" {
		os.Exit(poisonWorker(spec))
	}
	os.Exit(m.Run())
}

func poisonWorker(spec string) int {
	parts := strings.SplitN(spec, ",", 3)
	endpoints, queue, claimant := strings.ReplaceAll(parts[0], ";", ","), parts[1], parts[2]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := client.Dial(ctx, endpoints)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		return 1
	}
	defer cl.Close()
	idleSince := time.Now()
	for time.Since(idleSince) < 3*poisonLease {
		resp, err := cl.Claim(ctx, &taskstorepb.ClaimRequest{Claimant: claimant, Queues: []string{queue},
			Lease: durationpb.New(poisonLease), Wait: durationpb.New(poisonLease / 2), Limit: 1})
		if err != nil {
			fmt.Fprintln(os.Stderr, "claim:", err)
			return 1
		}
		for _, tk := range resp.Tasks {
			if string(tk.Value) == "poison" {
				os.Exit(poisonExit) // a crash: no commit, the lease runs out
			}
			if _, err := cl.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: claimant,
				Deletes: []*taskstorepb.TaskRef{{Id: tk.Id, Version: tk.Version, Queue: tk.Queue}}}); err != nil {
				fmt.Fprintln(os.Stderr, "commit:", err)
				return 1
			}
			idleSince = time.Now()
		}
	}
	return 0
}

// TestPoisonTaskDeadLetter: real processes. A queue with the policy
// --max-claims 3 --dead-letter takes 20 tasks, one of which crashes every
// worker that claims it (a worker process that exits at once). Worker
// processes run one after another until one finds nothing more to do:
// exactly 3 crash (one per lease of the poison task), then the poison task
// is in the dead-letter queue with its last claimant, the source queue and
// claim count in its headers, and every other task is done; taskctl queue
// move sends it back, with 3 more claims to go. A policy set over HTTP
// through the proxy reads back through the Go client.
func TestPoisonTaskDeadLetter(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := harness.Binaries(t)
	pc := harness.StartProcesses(t, 3, "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl := pc.Dial(ctx)
	const queue, dead = "pz/work", "pz/dead"

	// The cluster raises the state format after its start: until then a
	// policy is refused as too new.
	policy := &taskstorepb.QueuePolicy{MaxClaims: 3, DeadLetter: dead}
	for {
		_, err := cl.SetQueuePolicy(ctx, queue, policy)
		if err == nil {
			break
		}
		if ctx.Err() != nil || !strings.Contains(err.Error(), "format") {
			t.Fatalf("set policy: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := cl.SetQueuePolicy(ctx, queue, &taskstorepb.QueuePolicy{MaxClaims: 3, DeadLetter: "other/dead"}); err == nil ||
		!strings.Contains(err.Error(), "group") {
		t.Fatalf("a dead-letter queue of another group: %v, want a refusal naming the group", err)
	}
	if p, err := cl.QueuePolicy(ctx, queue); err != nil || p.GetMaxClaims() != 3 || p.GetDeadLetter() != dead {
		t.Fatalf("policy read back: %v (%v)", p, err)
	}
	// Over HTTP (the proxy's gateway): a retention policy on another
	// queue, read back through the Go client.
	px := pc.StartProxy("proxy")
	for !px.Ready() {
		if ctx.Err() != nil {
			t.Fatal("the proxy did not get ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
	res, err := http.Post(px.HTTPURL()+"/v1/policy", "application/json", strings.NewReader(`{"queue":"pz/done","policy":{"retain":"3600s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/policy: %s %s", res.Status, body)
	}
	if p, err := cl.QueuePolicy(ctx, "pz/done"); err != nil || p.GetRetain().AsDuration() != time.Hour {
		t.Fatalf("the policy set over HTTP reads back as %v (%v)", p, err)
	}

	for i := range 20 {
		value := fmt.Sprintf("task %d", i)
		if i == 7 {
			value = "poison"
		}
		if _, err := cl.Insert(ctx, queue, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}

	crashes := 0
	for run := 1; ; run++ {
		if run > 8 {
			t.Fatalf("%d worker runs and the queue is not done (%d crashes)", run-1, crashes)
		}
		cmd := exec.CommandContext(ctx, self, "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s,w%d", poisonWorkerEnv, strings.ReplaceAll(pc.Endpoints(), ",", ";"), queue, run))
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &exit) && exit.ExitCode() == poisonExit:
			crashes++
			continue
		default:
			t.Fatalf("worker run %d: %v\n%s", run, err, out)
		}
		break
	}
	if crashes != 3 {
		t.Fatalf("%d workers crashed on the poison task, want 3 (max-claims 3)", crashes)
	}
	left, err := cl.Tasks(ctx, &taskstorepb.TasksRequest{Queue: queue})
	if err != nil || len(left.Tasks) != 0 {
		t.Fatalf("%s still holds %v (%v); want every other task done", queue, left.GetTasks(), err)
	}
	dl, err := cl.Tasks(ctx, &taskstorepb.TasksRequest{Queue: dead})
	if err != nil || len(dl.Tasks) != 1 {
		t.Fatalf("%s holds %v (%v), want the poison task", dead, dl.GetTasks(), err)
	}
	d := dl.Tasks[0]
	if string(d.Value) != "poison" || d.Claimant != "w3" || d.Headers["dead-letter-from"] != queue ||
		d.Headers["dead-letter-claims"] != "3" || !strings.Contains(d.Err, "claimed 3 times") {
		t.Fatalf("dead-lettered task %v", d)
	}

	// queue move sends it back; it has its 3 claims again.
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "taskctl"), "--endpoints", pc.Endpoints(), "queue", "move", dead, queue).CombinedOutput()
	if err != nil {
		t.Fatalf("taskctl queue move: %v\n%s", err, out)
	}
	back, err := cl.Tasks(ctx, &taskstorepb.TasksRequest{Queue: queue})
	if err != nil || len(back.Tasks) != 1 || string(back.Tasks[0].Value) != "poison" || back.Tasks[0].Claims != 0 {
		t.Fatalf("after queue move: %v (%v)", back.GetTasks(), err)
	}
	out, err = exec.CommandContext(ctx, filepath.Join(bin, "taskctl"), "--endpoints", pc.Endpoints(), "queue", "policy", queue).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "claimed 3 times") || !strings.Contains(string(out), dead) {
		t.Fatalf("taskctl queue policy: %v\n%s", err, out)
	}
}
