package harness

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/checker"
)

// Binaries returns the directory holding taskstored (and the other
// commands): $TASKSTORE_BIN when set (make test builds there), else a fresh
// build into a temporary directory, shared by the test binary's tests.
func Binaries(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv("TASKSTORE_BIN"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "taskstored")); err == nil {
			return dir
		}
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "taskstore-bin-")
		if err != nil {
			buildErr = err
			return
		}
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/...")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		builtDir = dir
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtDir
}

var (
	buildOnce sync.Once
	builtDir  string
	buildErr  error
)

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found")
		}
		dir = parent
	}
}

// Process is a taskstored child process.
type Process struct {
	ID   string
	Addr string
	HTTP string
	Args []string
	Log  string

	bin string
	mu  sync.Mutex // guards cmd and exited
	cmd *exec.Cmd
	// exited is closed when the last started process has exited, with
	// exitCode its status.
	exited   chan struct{}
	exitCode int
}

// ProcessCluster is a cluster of real taskstored processes on loopback.
type ProcessCluster struct {
	t     testing.TB
	Nodes []*Process
	// InitialCluster is the nodes' --initial-cluster.
	InitialCluster string
}

// StartProcesses starts n taskstored processes forming one cluster. extra
// flags are passed to every node.
func StartProcesses(t testing.TB, n int, extra ...string) *ProcessCluster {
	t.Helper()
	return StartProcessesEach(t, n, func(string) []string { return extra })
}

// StartProcessesEach is StartProcesses with each node's extra flags given
// by its id (n1, n2, ...): Security.NodeFlags for a secured cluster.
func StartProcessesEach(t testing.TB, n int, extra func(id string) []string) *ProcessCluster {
	t.Helper()
	pc := NewProcesses(t, n, extra)
	pc.StartAll()
	return pc
}

// NewProcesses is StartProcessesEach without starting the processes: their
// data directories can be prepared first (taskstored restore with
// InitialCluster), then StartAll starts them.
func NewProcesses(t testing.TB, n int, extra func(id string) []string) *ProcessCluster {
	t.Helper()
	bin := filepath.Join(Binaries(t), "taskstored")
	base := t.TempDir()
	pc := &ProcessCluster{t: t}
	var initial []string
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("n%d", i+1)
		p := &Process{ID: id, Addr: freeAddr(t), HTTP: freeAddr(t), bin: bin, Log: filepath.Join(base, id+".log")}
		pc.Nodes = append(pc.Nodes, p)
		initial = append(initial, id+"="+p.Addr)
	}
	pc.InitialCluster = strings.Join(initial, ",")
	for _, p := range pc.Nodes {
		p.Args = append([]string{"--id", p.ID, "--data-dir", filepath.Join(base, p.ID), "--listen", p.Addr,
			"--gossip", freeAddr(t), "--http", p.HTTP, "--initial-cluster", pc.InitialCluster}, extra(p.ID)...)
	}
	t.Cleanup(func() {
		for _, p := range pc.Nodes {
			p.Kill()
		}
		if t.Failed() {
			for _, p := range pc.Nodes {
				if data, err := os.ReadFile(p.Log); err == nil {
					lines := strings.Split(string(data), "\n")
					t.Logf("--- last log lines of %s:\n%s", p.ID, strings.Join(lines[max(0, len(lines)-40):], "\n"))
				}
			}
		}
	})
	return pc
}

// StartAll starts every process of the cluster.
func (pc *ProcessCluster) StartAll() {
	pc.t.Helper()
	for _, p := range pc.Nodes {
		if err := p.Start(); err != nil {
			pc.t.Fatal(err)
		}
	}
}

// Endpoints is the comma-separated gRPC addresses.
func (pc *ProcessCluster) Endpoints() string {
	var out []string
	for _, p := range pc.Nodes {
		out = append(out, p.Addr)
	}
	return strings.Join(out, ",")
}

// Node returns the process with the given id.
func (pc *ProcessCluster) Node(id string) *Process {
	for _, p := range pc.Nodes {
		if p.ID == id {
			return p
		}
	}
	return nil
}

// WaitReady waits until every running node answers /readyz.
func (pc *ProcessCluster) WaitReady(timeout time.Duration) {
	pc.t.Helper()
	deadline := time.Now().Add(timeout)
	for _, p := range pc.Nodes {
		if !p.Running() {
			continue
		}
		for {
			if p.Ready() {
				break
			}
			if time.Now().After(deadline) {
				pc.t.Fatalf("%s not ready after %v", p.ID, timeout)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// Start launches the process (again, with the same data directory).
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.ID, err)
	}
	p.cmd = cmd
	exited := make(chan struct{})
	p.exited = exited
	go func() {
		cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.exitCode = cmd.ProcessState.ExitCode()
		p.mu.Unlock()
		close(exited)
	}()
	return nil
}

// WaitExit waits up to timeout for the process to exit on its own and
// returns its exit code; ok is false if it is still running.
func (p *Process) WaitExit(timeout time.Duration) (code int, ok bool) {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited == nil {
		return 0, false
	}
	select {
	case <-exited:
		p.mu.Lock()
		defer p.mu.Unlock()
		p.cmd = nil
		return p.exitCode, true
	case <-time.After(timeout):
		return 0, false
	}
}

// Kill sends SIGKILL and waits for the process to go.
func (p *Process) Kill() { p.signal(syscall.SIGKILL) }

// Stop sends SIGTERM (graceful stop) and waits.
func (p *Process) Stop() { p.signal(syscall.SIGTERM) }

func (p *Process) signal(sig syscall.Signal) {
	p.mu.Lock()
	cmd := p.cmd
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	cmd.Process.Signal(sig)
	for i := 0; i < 300; i++ {
		if cmd.Process.Signal(syscall.Signal(0)) != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Kill()
}

// Running reports whether the process was started and not stopped.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// Pid is the running process's id (0 when stopped).
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// HTTPURL is the base URL of the process's --http port: https when it was
// started with --tls-cert (a node or proxy serves HTTPS then).
func (p *Process) HTTPURL() string {
	if slices.Contains(p.Args, "--tls-cert") {
		return "https://" + p.HTTP
	}
	return "http://" + p.HTTP
}

// insecureProbe reaches /readyz of a node serving HTTPS without checking its
// certificate: readiness only, nothing secret.
var insecureProbe = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

// Ready reports whether /readyz answers 200.
func (p *Process) Ready() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.HTTPURL()+"/readyz", nil)
	resp, err := insecureProbe.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// StartJoining starts another taskstored process that gossips in through
// the first node and waits for `taskctl node add`.
func (pc *ProcessCluster) StartJoining(id string, extra ...string) *Process {
	pc.t.Helper()
	first := pc.Nodes[0]
	joinGossip := ""
	for i, a := range first.Args {
		if a == "--gossip" && i+1 < len(first.Args) {
			joinGossip = first.Args[i+1]
		}
	}
	base := filepath.Dir(first.Log)
	p := &Process{ID: id, Addr: freeAddr(pc.t), HTTP: freeAddr(pc.t), bin: first.bin, Log: filepath.Join(base, id+".log")}
	p.Args = append([]string{"--id", id, "--data-dir", filepath.Join(base, id), "--listen", p.Addr,
		"--gossip", freeAddr(pc.t), "--http", p.HTTP, "--join", joinGossip}, extra...)
	if err := p.Start(); err != nil {
		pc.t.Fatal(err)
	}
	pc.Nodes = append(pc.Nodes, p)
	return p
}

// Dial returns a Go client of the cluster (every node as an endpoint),
// closed when the test ends.
func (pc *ProcessCluster) Dial(ctx context.Context) *client.Client {
	pc.t.Helper()
	cl, err := client.Dial(ctx, pc.Endpoints())
	if err != nil {
		pc.t.Fatal(err)
	}
	pc.t.Cleanup(func() { cl.Close() })
	return cl
}

// StartProxy starts a taskproxy process in front of the cluster, stopped
// when the test ends. It is a Process: Kill, Stop, Start, Pause and Ready
// work on it.
func (pc *ProcessCluster) StartProxy(id string, extra ...string) *Process {
	pc.t.Helper()
	base := filepath.Dir(pc.Nodes[0].Log)
	bin := filepath.Join(filepath.Dir(pc.Nodes[0].bin), "taskproxy")
	p := &Process{ID: id, Addr: freeAddr(pc.t), HTTP: freeAddr(pc.t), bin: bin, Log: filepath.Join(base, id+".log")}
	p.Args = append([]string{"--listen", p.Addr, "--http", p.HTTP, "--cluster", pc.Endpoints()}, extra...)
	if err := p.Start(); err != nil {
		pc.t.Fatal(err)
	}
	pc.t.Cleanup(p.Kill)
	return p
}

// DataDir is the node's --data-dir ("" when it has none).
func (p *Process) DataDir() string {
	for i, a := range p.Args {
		if a == "--data-dir" && i+1 < len(p.Args) {
			return p.Args[i+1]
		}
	}
	return ""
}

// ShardLogs stops every node gracefully and reads each one's Raft log of
// every shard it holds from its files (bolt locks them while a node runs),
// for checker.LogAgreement. Nodes stay stopped.
func (pc *ProcessCluster) ShardLogs() ([]checker.ReplicaLog, error) {
	for _, p := range pc.Nodes {
		p.Stop()
	}
	var out []checker.ReplicaLog
	for _, p := range pc.Nodes {
		logs, err := checker.ReadDataDir(p.ID, p.DataDir())
		if err != nil {
			return nil, err
		}
		out = append(out, logs...)
	}
	return out, nil
}

// StatusTracker counts the leader changes a client sees through
// Admin.Status polls (a process cluster's nodes are out of reach of
// LeaderTracker). A poll that fails counts nothing; a frozen or killed node
// can make a change be missed.
type StatusTracker struct {
	admin   *client.Client
	leaders map[uint32]string
	changes int
}

// NewStatusTracker polls through admin.
func NewStatusTracker(admin *client.Client) *StatusTracker {
	return &StatusTracker{admin: admin, leaders: map[uint32]string{}}
}

// Poll asks for the cluster's status once and counts shards whose leader
// changed since the last poll.
func (st *StatusTracker) Poll() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := st.admin.Status(ctx, &taskstorepb.StatusRequest{})
	if err != nil {
		return
	}
	for _, s := range resp.Shards {
		if s.Leader == "" {
			continue
		}
		if prev, ok := st.leaders[s.Id]; ok && prev != s.Leader {
			st.changes++
		}
		st.leaders[s.Id] = s.Leader
	}
}

// Leader is the last leader seen for shard ("" for none yet).
func (st *StatusTracker) Leader(shard uint32) string { return st.leaders[shard] }

// Changes is how many leader changes the polls saw.
func (st *StatusTracker) Changes() int { return st.changes }

// Reset forgets the changes counted so far.
func (st *StatusTracker) Reset() { st.changes = 0 }
