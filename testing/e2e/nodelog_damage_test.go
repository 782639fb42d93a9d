package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestDamagedReplicaFilesProcesses with real processes:
// one replica's files damaged on a stopped node: a byte flipped in one of
// its entries in the node's shared Raft log (3a; before, the whole node
// refused to start), its raft.db cut short (3b; before, bbolt panicked the
// node) or emptied (3c: the term and vote lost). The node starts and runs
// its other replica; the damaged one does not serve or vote and shows
// DAMAGED in status; `taskctl shard rebuild` brings it back with every task
// (3d), and a restart does not find the damage again.
func TestDamagedReplicaFilesProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	raftDB := func(dir string, shard uint32) string {
		return filepath.Join(dir, "shards", fmt.Sprint(shard), "raft.db")
	}
	for _, tc := range []struct {
		name   string
		damage func(dir string, shard uint32) (string, error)
		want   string
	}{
		{"an entry in the node log flipped", func(dir string, shard uint32) (string, error) {
			return harness.FlipNodeLogEntry(dir, shard)
		}, "fails its checksum"},
		{"raft.db cut short", func(dir string, shard uint32) (string, error) {
			return "raft.db cut to 6000 bytes", os.Truncate(raftDB(dir, shard), 6000)
		}, "raft.db"},
		// Half its size: bbolt read past the end of its mapping and the
		// node died of SIGBUS.
		{"raft.db cut to half", func(dir string, shard uint32) (string, error) {
			info, err := os.Stat(raftDB(dir, shard))
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("raft.db cut from %d to %d bytes", info.Size(), info.Size()/2), os.Truncate(raftDB(dir, shard), info.Size()/2)
		}, "is cut short"},
		// With its vote record (a copy of the term and vote beside it) the
		// replica restores them; without, it cannot prove them.
		{"raft.db emptied and its vote record gone", func(dir string, shard uint32) (string, error) {
			if err := os.Remove(filepath.Join(filepath.Dir(raftDB(dir, shard)), "vote")); err != nil {
				return "", err
			}
			return "raft.db emptied, vote record removed", os.Truncate(raftDB(dir, shard), 0)
		}, "no term or vote recorded"},
	} {
		t.Run(tc.name, func(t *testing.T) { damagedReplicaProcesses(t, tc.damage, tc.want) })
	}
}

func damagedReplicaProcesses(t *testing.T, damage func(dir string, shard uint32) (string, error), want string) {
	pc := harness.StartProcesses(t, 3, "--shards", "2", "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cl := pc.Dial(ctx)

	rt, err := cl.Routing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	shardOf := func(q string) uint32 {
		return rt.Slots[taskstorepb.SlotOf(taskstorepb.GroupOf(q), len(rt.Slots))]
	}
	qa, qb := "dmg-a/q", "dmg-b/q"
	for i := 0; shardOf(qb) == shardOf(qa); i++ {
		qb = fmt.Sprintf("dmg-b%d/q", i)
	}
	sa, sb := shardOf(qa), shardOf(qb)
	insert := func(q string, n int, prefix string) {
		t.Helper()
		for i := range n {
			if _, err := cl.Insert(ctx, q, []byte("x"), client.WithID(fmt.Sprintf("%s-%d", prefix, i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	insert(qa, 10, "a")
	insert(qb, 10, "b")

	bad := pc.Nodes[2]
	bad.Stop()
	what, err := damage(bad.DataDir(), sa)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("damaged: %s", what)
	if err := bad.Start(); err != nil {
		t.Fatal(err)
	}
	pc.WaitReady(60 * time.Second)

	local := func() *taskstorepb.StatusResponse {
		t.Helper()
		cc := dialNode(t, bad.Addr)
		st, err := taskstorepb.NewAdminClient(cc).Status(ctx, &taskstorepb.StatusRequest{LocalOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	replica := func(st *taskstorepb.StatusResponse, shard uint32) *taskstorepb.ReplicaStatus {
		for _, s := range st.Shards {
			if s.Id != shard {
				continue
			}
			for _, r := range s.ReplicaStatus {
				if r.Node == bad.ID {
					return r
				}
			}
		}
		return nil
	}
	if r := replica(local(), sa); r == nil || !strings.Contains(r.GetDivergence().GetDamaged(), want) {
		t.Fatalf("%s's replica of shard %d after the flip: %v, want it damaged", bad.ID, sa, r)
	}
	// The other replica on the node runs and catches up; the shard itself
	// keeps working on the other two.
	insert(qa, 5, "a2")
	insert(qb, 5, "b2")
	waitStale := func(shard uint32, q string, want int) {
		t.Helper()
		cc := dialNode(t, bad.Addr)
		deadline := time.Now().Add(60 * time.Second)
		for {
			res, err := taskstorepb.NewTaskStoreClient(cc).Tasks(ctx, &taskstorepb.TasksRequest{Shard: shard, Queue: q, Stale: true, Limit: 1000})
			if err == nil && len(res.Tasks) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's replica of shard %d: %d tasks of %s (%v), want %d", bad.ID, shard, len(res.GetTasks()), q, err, want)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitStale(sb, qb, 15)

	taskctl := filepath.Join(harness.Binaries(t), "taskctl")
	var out []byte
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Second) {
		out, err = exec.CommandContext(ctx, taskctl, "--endpoints", pc.Endpoints(), "shard", "rebuild", fmt.Sprint(sa), "--node", bad.ID).CombinedOutput()
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("taskctl shard rebuild: %v\n%s", err, out)
	}
	waitStale(sa, qa, 15)
	if r := replica(local(), sa); r.GetDivergence() != nil {
		t.Fatalf("rebuilt replica still shows %v", r.GetDivergence())
	}

	bad.Stop()
	if err := bad.Start(); err != nil {
		t.Fatal(err)
	}
	pc.WaitReady(60 * time.Second)
	if r := replica(local(), sa); r == nil || r.GetDivergence() != nil {
		t.Fatalf("after a restart, %s's replica of shard %d: %v", bad.ID, sa, r)
	}
	waitStale(sa, qa, 15)
}

// dialNode is a plain gRPC connection to one node, closed when the test
// ends: reads of that node's own replicas (stale), its local status.
func dialNode(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}
