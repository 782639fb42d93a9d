package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/checker"
	"github.com/e1158ecb/taskstore/testing/harness"
	"github.com/e1158ecb/taskstore/testing/workload"
)

// TestChaosProcessPause is the scenario that found replicas diverging
// (hashicorp/raft#695): real taskstored processes and a proxy,
// workers claiming and committing through the proxy and directly with
// short attempt timeouts (so outcomes go unknown), while shard leaders are
// frozen with SIGSTOP for 3-8 s at a time. A frozen leader keeps its
// sockets; when it wakes, requests that queued up reach it together with
// the new leader's heartbeats, the moment the race needs. The proxy is
// killed and restarted once. At the end the nodes are stopped and every
// replica's Raft log of every shard is compared entry by entry, besides the
// workload checkers. (Replica digests live in other processes; the
// in-process scenarios compare them.)
//
// TASKSTORE_PAUSE_RUNS=n runs it n times (each on a fresh cluster) and
// prints one PAUSE line with the tally; TASKSTORE_PAUSE_FOR is each run's
// fault phase (default 40s), TASKSTORE_PAUSE_SHARDS its shard count
// (default 2), TASKSTORE_LOAD scales the clients as in the soak.
func TestChaosProcessPause(t *testing.T) {
	gate(t)
	runs := envInt(t, "TASKSTORE_PAUSE_RUNS", 1)
	faultFor := 40 * time.Second
	if v := os.Getenv("TASKSTORE_PAUSE_FOR"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("TASKSTORE_PAUSE_FOR=%q: want a duration", v)
		}
		faultFor = d
	}
	shards := envInt(t, "TASKSTORE_PAUSE_SHARDS", 2)
	var failed, divergent, pauses, leaderChanges int
	for i := 0; i < runs; i++ {
		var st pauseStats
		ok := t.Run(fmt.Sprintf("run-%d", i), func(t *testing.T) { st = runPause(t, faultFor, shards) })
		if !ok {
			failed++
		}
		if st.divergent {
			divergent++
		}
		pauses += st.pauses
		leaderChanges += st.leaderChanges
	}
	t.Logf("PAUSE runs=%d failed=%d log-divergences=%d pauses=%d leader-changes=%d", runs, failed, divergent, pauses, leaderChanges)
}

// envInt is the whole number >= 1 in the environment variable name, def
// when it is unset.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a whole number >= 1", name, v)
	}
	return n
}

type pauseStats struct {
	divergent     bool
	pauses        int
	leaderChanges int
}

func runPause(t *testing.T, faultFor time.Duration, shards int) pauseStats {
	start := time.Now()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 22))
	t.Logf("seed %d", seed)
	pc := harness.StartProcesses(t, 3, "--shards", strconv.Itoa(shards), "--raft-timeout-scale", "2")
	pc.WaitReady(90 * time.Second)
	px := pc.StartProxy("proxy")
	for end := time.Now().Add(60 * time.Second); !px.Ready(); {
		if time.Now().After(end) {
			t.Fatal("proxy not ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
	h := workload.NewHistory()
	// Clients take turns: through the proxy; straight to the nodes with
	// each attempt bounded at 1 s, so that a frozen node's answers go
	// unknown and are retried elsewhere; straight to the nodes at the
	// client's default attempt timeout, so that requests wait in a frozen
	// leader's sockets and reach it the moment it wakes, together with the
	// new leader's heartbeats (as was claimed of the recorded divergence).
	var n atomic.Int64
	dial := func(ctx context.Context) (*client.Client, error) {
		switch n.Add(1) % 3 {
		case 0:
			return client.Dial(ctx, px.Addr, client.WithProxyOnly(), client.WithAttemptTimeout(time.Second))
		case 1:
			return client.Dial(ctx, pc.Endpoints(), client.WithAttemptTimeout(time.Second))
		default:
			return client.Dial(ctx, pc.Endpoints())
		}
	}
	admin, err := client.Dial(context.Background(), pc.Endpoints(), client.WithAttemptTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	tr := harness.NewStatusTracker(admin)
	poll := tr.Poll
	sleep := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
			poll()
			time.Sleep(100 * time.Millisecond)
		}
	}
	leaderOf := func(shard uint32) *harness.Process {
		for end := time.Now().Add(60 * time.Second); time.Now().Before(end); {
			poll()
			if p := pc.Node(tr.Leader(shard)); p != nil && p.Running() {
				return p
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("shard %d: no leader", shard)
		return nil
	}
	fault := func(format string, args ...any) {
		h.Note(checker.CountFaults, format, args...)
		t.Logf("%s fault: "+format, append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
	cfg := workload.Defaults
	cfg.Prefix = "pause"
	cfg.Workers, cfg.Impatient = 6, 2
	cfg.Groups = 2 * shards // traffic on every shard, whichever a paused node leads
	cfg = cfg.Scaled(loadScale(t))
	poll()
	wl, err := workload.Start(cfg, h, dial)
	if err != nil {
		t.Fatal(err)
	}
	sleep(2 * time.Second)
	var st pauseStats
	proxyKilled := false
	for end := time.Now().Add(faultFor); time.Now().Before(end); {
		shard := uint32(1 + rng.IntN(shards))
		p := leaderOf(shard)
		d := 3*time.Second + time.Duration(rng.Int64N(int64(5*time.Second)))
		fault("SIGSTOP %s, leader of shard %d, for %v", p.ID, shard, d.Round(time.Millisecond))
		if err := p.Pause(); err != nil {
			t.Fatal(err)
		}
		st.pauses++
		sleep(d)
		fault("SIGCONT %s", p.ID)
		if err := p.Resume(); err != nil {
			t.Fatal(err)
		}
		if !proxyKilled && time.Since(start) > faultFor/2 {
			proxyKilled = true
			fault("kill -9 the proxy and restart it")
			px.Kill()
			if err := px.Start(); err != nil {
				t.Fatal(err)
			}
		}
		sleep(time.Duration(1500+rng.IntN(1500)) * time.Millisecond)
	}
	sleep(2 * time.Second)
	wl.Stop()
	poll()
	st.leaderChanges = tr.Changes()
	h.Count(checker.CountLeaderChanges, tr.Changes())
	pc.WaitReady(60 * time.Second)
	final := readFinal(t, pc.Endpoints(), cfg.Prefix)
	noDivergedReplicas(t, pc.Endpoints())
	px.Kill()
	logs, err := pc.ShardLogs()
	if err != nil {
		t.Fatalf("read the replicas' logs: %v", err)
	}
	if vs, _ := checker.LogAgreement(logs); len(vs) > 0 {
		st.divergent = true
		// Named first: a divergence brings many other violations, and
		// Judge prints only the first 50.
		for _, v := range vs {
			t.Errorf("replica divergence: %s", v)
		}
		// Keep the evidence: each node's log files and logs.
		dir := t.ArtifactDir()
		for _, p := range pc.Nodes {
			os.CopyFS(filepath.Join(dir, p.ID), os.DirFS(p.DataDir()))
			if b, err := os.ReadFile(p.Log); err == nil {
				os.WriteFile(filepath.Join(dir, p.ID+".log"), b, 0o644)
			}
		}
		t.Logf("replicas' data dirs and logs copied to %s (kept with go test -artifacts)", dir)
	}
	// Leader changes are seen through Status polls, which a frozen node
	// can make miss one: the floor is 1.
	judge(t, h, final, nil, logs, cfg.Prefix, floor(checker.Floor{checker.CountLeaderChanges: 1, checker.CountFaults: 4}), 0, start)
	return st
}
