package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

var (
	backupTasks = flag.Int("backup.tasks", 1_000_000, "BenchmarkBackupRestore: tasks loaded before the backup")
	backupState = flag.String("backup.state", "disk", "BenchmarkBackupRestore: the nodes' --state")
	backupRate  = flag.String("backup.rate", "0", "BenchmarkBackupRestore: backup create's --rate (MB/s; 0: no limit)")
	backupKeep  = flag.String("backup.keep", "", "BenchmarkBackupRestore: also copy the backup file here")
	backupFrom  = flag.String("backup.from", "", "BenchmarkRestoreReady: the backup file to restore")
	backupDir   = flag.String("backup.dir", "", "BenchmarkBackupRestore: the directory backup create writes its file into (e.g. a tmpfs, to tell the file's writes from the copy's CPU); default: the benchmark's own temporary directory, on the nodes' disk")
	backupQuiet = flag.Duration("backup.settle", 3*time.Minute, "BenchmarkBackupRestore: wait at most this long after the load for the nodes to go idle (their engines' compactions done) before the writers start; 0: do not wait")
)

// BenchmarkBackupRestore loads -backup.tasks tasks of 64 bytes into a
// 3-node cluster of real processes, then measures: backup create's rate
// (MB/s of file per second), restore's rate (one node's taskstored
// restore), how long the restored cluster takes to be ready, and the p99
// of single inserts by 4 writers in the 5 s before the backup and while it
// runs.
func BenchmarkBackupRestore(b *testing.B) {
	bin := harness.Binaries(b)
	pc := harness.StartProcesses(b, 3, "--shards", "3", "--raft-timeout-scale", "2", "--state", *backupState)
	pc.WaitReady(60 * time.Second)
	ctx := context.Background()
	cl := pc.Dial(ctx)
	value := make([]byte, 64)
	// Load in transactions of 1000 tasks, spread over 30 groups.
	const batch = 1000
	loadStart := time.Now()
	var lwg sync.WaitGroup
	work := make(chan int)
	for w := 0; w < 4; w++ {
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			for n := range work {
				req := &taskstorepb.ModifyRequest{}
				for i := 0; i < batch; i++ {
					req.Inserts = append(req.Inserts, &taskstorepb.TaskInsert{Queue: fmt.Sprintf("load%d/q", n%30), Value: value})
				}
				if _, err := cl.Modify(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	for n := 0; n < *backupTasks/batch; n++ {
		work <- n
	}
	close(work)
	lwg.Wait()
	b.Logf("loaded %d tasks in %v", *backupTasks, time.Since(loadStart).Round(time.Millisecond))
	if *backupQuiet > 0 {
		// The load leaves each engine compacting for a while; writers'
		// p99 measured then (before, or during the backup) would be the
		// compactions', not the backup's.
		took, idle := settle(pc, *backupQuiet)
		b.Logf("nodes idle after %v (%v): the engines' compactions after the load", took.Round(time.Second), idle)
	}

	type sample struct {
		at  time.Time
		lat time.Duration
	}
	var (
		mu      sync.Mutex
		samples []sample
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				_, err := cl.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: fmt.Sprintf("write%d/q", i%8), Value: value}}})
				if err == nil {
					mu.Lock()
					samples = append(samples, sample{start, time.Since(start)})
					mu.Unlock()
				}
			}
		}()
	}
	nodesCPU := func() time.Duration {
		var total time.Duration
		for _, p := range pc.Nodes {
			total += processCPU(p.Pid())
		}
		return total
	}
	cpuBefore, quietFrom := nodesCPU(), time.Now()
	time.Sleep(5 * time.Second)
	dir := *backupDir
	if dir == "" {
		dir = b.TempDir()
	}
	file := filepath.Join(dir, "bench.tsb")
	defer os.Remove(file)
	b.ResetTimer()
	began := time.Now()
	cpuBegan := nodesCPU()
	cmd := exec.Command(filepath.Join(bin, "taskctl"), "--endpoints", pc.Endpoints(), "backup", "create", "--rate", *backupRate, file)
	out, err := cmd.CombinedOutput()
	ended := time.Now()
	cpuEnded := nodesCPU()
	close(stop)
	wg.Wait()
	b.StopTimer()
	if err != nil {
		b.Fatalf("backup create: %v\n%s", err, out)
	}
	b.Logf("%s", out)
	if *backupKeep != "" {
		if out, err := exec.Command("cp", file, *backupKeep).CombinedOutput(); err != nil {
			b.Fatalf("keep the backup: %v\n%s", err, out)
		}
	}
	fi, err := os.Stat(file)
	if err != nil {
		b.Fatal(err)
	}
	mb := float64(fi.Size()) / 1e6
	p99 := func(from, to time.Time) (time.Duration, int) {
		var lats []time.Duration
		for _, s := range samples {
			if !s.at.Before(from) && s.at.Before(to) {
				lats = append(lats, s.lat)
			}
		}
		if len(lats) == 0 {
			return 0, 0
		}
		slices.Sort(lats)
		return lats[len(lats)*99/100], len(lats)
	}
	before, nb := p99(began.Add(-5*time.Second), began)
	during, nd := p99(began, ended)
	b.ReportMetric(mb/ended.Sub(began).Seconds(), "backup-MB/s")
	// The nodes' CPU for the backup: theirs while it ran less what the
	// writers alone cost them at the rate of the 5 s before.
	writersOnly := time.Duration(float64(cpuBegan-cpuBefore) * ended.Sub(began).Seconds() / began.Sub(quietFrom).Seconds())
	nodesMs := float64((cpuEnded - cpuBegan - writersOnly).Microseconds()) / 1000 / mb
	taskctlMs := float64((cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Microseconds()) / 1000 / mb
	b.ReportMetric(nodesMs, "nodes-cpu-ms/MB")
	b.ReportMetric(taskctlMs, "taskctl-cpu-ms/MB")
	b.Logf("CPU per MB of file: the nodes %.1f ms (beyond the writers' %v during it), taskctl %.1f ms", nodesMs, writersOnly.Round(time.Millisecond), taskctlMs)
	b.ReportMetric(float64(before.Microseconds())/1000, "p99-before-ms")
	b.ReportMetric(float64(during.Microseconds())/1000, "p99-during-ms")
	b.Logf("file %.1f MB; backup %v (%.1f MB/s); writers' p99 %v before (%d inserts in 5 s), %v during (%d inserts)",
		mb, ended.Sub(began).Round(time.Millisecond), mb/ended.Sub(began).Seconds(), before, nb, during, nd)

	// Which node streamed each shard's copy and how long its view held
	// the shard's writers (the node logs say).
	for _, p := range pc.Nodes {
		data, _ := os.ReadFile(p.Log)
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "backup: copying a shard") || strings.Contains(line, "backup: the copy is redirected") {
				b.Logf("%s: %s", p.ID, line)
			}
		}
	}
	for _, p := range pc.Nodes {
		p.Kill()
	}
	rc := harness.NewProcesses(b, 3, func(string) []string { return []string{"--raft-timeout-scale", "2", "--state", *backupState} })
	var restoreTook time.Duration
	for i, p := range rc.Nodes {
		start := time.Now()
		out, err := exec.Command(filepath.Join(bin, "taskstored"), "restore", "--from", file, "--id", p.ID,
			"--data-dir", p.DataDir(), "--initial-cluster", rc.InitialCluster).CombinedOutput()
		if err != nil {
			b.Fatalf("restore %s: %v\n%s", p.ID, err, out)
		}
		if i == 0 {
			restoreTook = time.Since(start)
		}
	}
	start := time.Now()
	rc.StartAll()
	rc.WaitReady(5 * time.Minute)
	ready := time.Since(start)
	nc := rc.Dial(ctx)
	var total uint64
	qs, err := nc.Queues(ctx, &taskstorepb.QueuesRequest{})
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range qs.Queues {
		total += q.Available + q.Claimed + q.Delayed
	}
	b.ReportMetric(mb/restoreTook.Seconds(), "restore-MB/s")
	b.Logf("restore of one node %v (%.1f MB/s); restored cluster ready in %v; %d tasks in it", restoreTook.Round(time.Millisecond),
		mb/restoreTook.Seconds(), ready.Round(time.Millisecond), total)
}

// BenchmarkRestoreReady restores -backup.from (a file BenchmarkBackupRestore
// kept with -backup.keep) into a new 3-node cluster of the binaries in
// TASKSTORE_BIN and reports how long the cluster takes to be ready after
// its nodes start (every shard with a leader, answering): what a restored
// node's load of its shards costs, without loading a cluster first.
func BenchmarkRestoreReady(b *testing.B) {
	if *backupFrom == "" {
		b.Skip("needs -backup.from")
	}
	bin := harness.Binaries(b)
	rc := harness.NewProcesses(b, 3, func(string) []string { return []string{"--raft-timeout-scale", "2", "--state", *backupState} })
	for _, p := range rc.Nodes {
		out, err := exec.Command(filepath.Join(bin, "taskstored"), "restore", "--from", *backupFrom, "--id", p.ID,
			"--data-dir", p.DataDir(), "--initial-cluster", rc.InitialCluster).CombinedOutput()
		if err != nil {
			b.Fatalf("restore %s: %v\n%s", p.ID, err, out)
		}
	}
	b.ResetTimer()
	start := time.Now()
	rc.StartAll()
	rc.WaitReady(10 * time.Minute)
	ready := time.Since(start)
	b.StopTimer()
	b.ReportMetric(ready.Seconds(), "ready-s")
	b.Logf("restored cluster ready in %v", ready.Round(time.Millisecond))
}

// settle waits, up to limit, until the nodes of pc use less than a tenth
// of a core together over two seconds (their engines' compactions after a
// load done), and returns how long it waited and whether they went idle.
func settle(pc *harness.ProcessCluster, limit time.Duration) (time.Duration, bool) {
	start := time.Now()
	cpu := func() time.Duration {
		var total time.Duration
		for _, p := range pc.Nodes {
			total += processCPU(p.Pid())
		}
		return total
	}
	const window = 2 * time.Second
	last := cpu()
	for time.Since(start) < limit {
		time.Sleep(window)
		now := cpu()
		used := now - last
		last = now
		if used < window/10 {
			return time.Since(start), true
		}
	}
	return time.Since(start), false
}

// processCPU is the user and system CPU time process pid has used (0 if
// it cannot be read).
func processCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis: utime and
	// stime are the 12th and 13th, in clock ticks (100 a second).
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
