package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/cmd/internal/buildinfo"
	"github.com/e1158ecb/taskstore/cmd/internal/gcpercent"
	"github.com/e1158ecb/taskstore/cmd/internal/logging"
	"github.com/e1158ecb/taskstore/proxy"
)

// devRestartAfter is how long the dev cluster waits before it restarts a
// node process that died: long enough to watch the cluster without it.
const devRestartAfter = 10 * time.Second

func devCmd() *cobra.Command {
	var dataDir, logLevel, state, memoryLimit string
	var pprof bool
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a local 3-node cluster and a proxy (what `make run` runs)",
		Long: `dev starts three nodes on loopback, each a taskstored process of its own,
with their data under --data-dir (default ./data/dev), so that a restart
keeps the tasks:

  n1: gRPC 127.0.0.1:7101  gossip 127.0.0.1:7201  http 127.0.0.1:7301
  n2: gRPC 127.0.0.1:7102  gossip 127.0.0.1:7202  http 127.0.0.1:7302
  n3: gRPC 127.0.0.1:7103  gossip 127.0.0.1:7203  http 127.0.0.1:7303

and one proxy (taskproxy) in front of them, in this process:

  proxy: gRPC 127.0.0.1:7000  http 127.0.0.1:7300 (JSON API, docs/http.md)

Each node's process id is in --data-dir/ID.pid: kill one (kill -9 works)
to watch its shards fail over; dev starts it again after 10 seconds, and it
catches up (a node that exits cleanly is not started again; one removed
from the cluster leaves REMOVED in its data directory, which dev then deletes). Ctrl-C stops the whole cluster. Remove the data directory to
start afresh.`,
		Example: `  taskstored dev
  taskctl --endpoints 127.0.0.1:7101 status
  kill -9 $(cat data/dev/n1.pid)     # fail over; n1 is back after 10 s
  curl -s 127.0.0.1:7300/v1/queues`,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := logging.New(os.Stderr, logLevel, "text")
			if err != nil {
				return err
			}
			gcpercent.Set() // for the proxy this process runs; each node sets its own
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("dev: find this program to start the nodes: %w", err)
			}
			// The three processes share this machine or container: each
			// gets a third of the limit.
			limit, _, err := resolveMemoryLimit(memoryLimit)
			if err != nil {
				return err
			}
			peers := []cluster.Peer{{ID: "n1", Address: "127.0.0.1:7101"}, {ID: "n2", Address: "127.0.0.1:7102"}, {ID: "n3", Address: "127.0.0.1:7103"}}
			var initial []string
			for _, p := range peers {
				initial = append(initial, p.ID+"="+p.Address)
			}
			ports := []port{{addr: "127.0.0.1:7000", what: "proxy gRPC"}, {addr: "127.0.0.1:7300", what: "proxy HTTP"}}
			var nodes []*devNode
			for i, p := range peers {
				gossip, http := fmt.Sprintf("127.0.0.1:%d", 7201+i), fmt.Sprintf("127.0.0.1:%d", 7301+i)
				ports = append(ports, port{addr: p.Address, what: p.ID + " gRPC and Raft"},
					port{addr: gossip, what: p.ID + " gossip", udp: true}, port{addr: http, what: p.ID + " HTTP"})
				nodes = append(nodes, &devNode{id: p.ID, exe: exe, pidFile: filepath.Join(dataDir, p.ID+".pid"), dataDir: filepath.Join(dataDir, p.ID), log: log, args: []string{
					"--id", p.ID, "--data-dir", filepath.Join(dataDir, p.ID), "--listen", p.Address, "--gossip", gossip, "--http", http,
					"--initial-cluster", strings.Join(initial, ","), "--replicas", "3",
					// The default Raft timeouts, as a real cluster's: three
					// nodes on one machine take them without spurious
					// elections (the end-to-end tests run so), and a
					// killed node's shards fail over in about 2 s rather
					// than twice that.
					"--log-level", logLevel, "--state", state,
					"--memory-limit", strconv.FormatInt(limit/int64(len(peers)), 10),
				}})
				if pprof {
					nodes[i].args = append(nodes[i].args, "--pprof")
				}
			}
			if err := checkPorts(ports); err != nil {
				return err
			}
			if err := os.MkdirAll(dataDir, 0o755); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			for _, n := range nodes {
				if err := n.start(); err != nil {
					stopNodes(nodes, time.Second)
					return err
				}
			}
			var wg sync.WaitGroup
			for _, n := range nodes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n.supervise(ctx)
				}()
			}
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			p, err := proxy.Start(pctx, proxy.Config{Version: buildinfo.Version, Cluster: "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103",
				ListenAddr: "127.0.0.1:7000", HTTPAddr: "127.0.0.1:7300", Logger: log}) // the proxy adds component=proxy
			cancel()
			if err != nil {
				stop()
				stopNodes(nodes, defaultShutdown)
				wg.Wait()
				return err
			}
			// The banner's commands work once the cluster has a map.
			for deadline := time.Now().Add(time.Minute); p.Ready() != nil && time.Now().Before(deadline) && ctx.Err() == nil; {
				time.Sleep(100 * time.Millisecond)
			}
			fmt.Fprintf(os.Stderr, devBanner, dataDir, dataDir)
			<-ctx.Done()
			log.Info("signal received, stopping the dev cluster")
			sctx, cancel := context.WithTimeout(context.Background(), defaultShutdown)
			defer cancel()
			if err := p.Shutdown(sctx); err != nil {
				log.Warn("proxy shutdown", "err", err)
			}
			stopNodes(nodes, defaultShutdown)
			wg.Wait()
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "data/dev", "where the three nodes keep their data")
	cmd.Flags().BoolVar(&pprof, "pprof", false, "serve /debug/pprof on each node's http address (go tool pprof http://127.0.0.1:7301/debug/pprof/profile)")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().StringVar(&memoryLimit, "memory-limit", "", "memory the three nodes may use together, each a third (0: no limit); default: this container's or cgroup's limit, else half the machine's memory (see taskstored --help)")
	cmd.Flags().StringVar(&state, "state", cluster.DefaultStateStore, "where the nodes keep their tasks: memory, or disk (for queues larger than memory; see taskstored --help)")
	return cmd
}

const devBanner = `Taskstore dev cluster: 3 nodes, 3 shards, 3 replicas; data in %s

  export TASKSTORE_ENDPOINTS=127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
  taskctl status
  taskctl task insert demo/work --value hello
  taskctl task claim demo/work --lease 30s

Proxy: gRPC 127.0.0.1:7000 (taskctl --proxy --endpoints 127.0.0.1:7000 ...)
       HTTP/JSON http://127.0.0.1:7300 (docs/http.md):
  curl -s -XPOST 127.0.0.1:7300/v1/modify -d '{"inserts":[{"queue":"demo/work","value":"aGVsbG8="}]}'
  curl -s -XPOST 127.0.0.1:7300/v1/claim -d '{"queues":["demo/work"],"claimant":"me","lease":"30s"}'

Status page: http://127.0.0.1:7301/ (any node: 7301, 7302, 7303)
Metrics: http://127.0.0.1:7301/metrics (nodes), http://127.0.0.1:7300/metrics (proxy)
Fail over: kill -9 $(cat %s/n1.pid)   (the node is started again after 10 s)
Ctrl-C to stop.

`

// stopNodes stops the nodes at once (each gets timeout to exit cleanly)
// and returns when all have.
func stopNodes(nodes []*devNode, timeout time.Duration) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.stop(timeout)
		}()
	}
	wg.Wait()
}

// devNode is one node process of the dev cluster.
// removedMarker is the file a node writes into its data directory when it
// stopped because it was removed from the cluster: nothing in the
// directory is needed any more.
const removedMarker = "REMOVED"

type devNode struct {
	id, exe, pidFile string
	dataDir          string // the node's --data-dir
	args             []string
	log              *slog.Logger

	mu       sync.Mutex // guards cmd, exited and stopping
	cmd      *exec.Cmd
	exited   chan struct{}
	stopping bool
}

// start runs the node's process in a process group of its own, so that a
// Ctrl-C reaches only dev, which stops the nodes together.
func (n *devNode) start() error {
	cmd := exec.Command(n.exe, n.args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	// Pdeathsig: a dev killed with -9 takes its nodes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dev: start %s: %w", n.id, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	n.mu.Lock()
	n.cmd, n.exited = cmd, exited
	n.mu.Unlock()
	return os.WriteFile(n.pidFile, []byte(fmt.Sprintf("%d\n", cmd.Process.Pid)), 0o644)
}

// supervise starts the node again, devRestartAfter after its process died,
// until ctx ends.
func (n *devNode) supervise(ctx context.Context) {
	for {
		n.mu.Lock()
		cmd, exited := n.cmd, n.exited
		n.mu.Unlock()
		select {
		case <-exited:
		case <-ctx.Done():
			return
		}
		n.mu.Lock()
		stopping := n.stopping
		n.mu.Unlock()
		if stopping {
			return
		}
		if cmd.ProcessState.Success() {
			// A clean exit: the node stopped on purpose (it was removed
			// from the cluster, or was told to stop); starting it again
			// would only repeat that.
			if _, err := os.Stat(filepath.Join(n.dataDir, removedMarker)); n.dataDir != "" && err == nil {
				// Removed from the cluster: its data serves nothing.
				if err := os.RemoveAll(n.dataDir); err != nil {
					n.log.Warn("delete a removed node's data directory", "node", n.id, "dir", n.dataDir, "err", err)
				} else {
					n.log.Info("a node removed from the cluster stopped; deleted its data directory", "node", n.id, "dir", n.dataDir)
				}
				return
			}
			n.log.Info("a node process exited cleanly; not starting it again", "node", n.id)
			return
		}
		n.log.Warn("a node process exited; starting it again soon", "node", n.id, "exit", cmd.ProcessState.String(), "in", devRestartAfter)
		select {
		case <-time.After(devRestartAfter):
		case <-ctx.Done():
			return
		}
		if err := n.start(); err != nil {
			n.log.Error("could not start the node again", "node", n.id, "err", err)
			return
		}
		n.log.Info("node process started again", "node", n.id, "pid", n.cmd.Process.Pid)
	}
}

// stop asks the node to stop as part of the whole cluster (SIGUSR1: no
// hand-offs to peers that stop too) and waits, killing it after timeout.
func (n *devNode) stop(timeout time.Duration) {
	n.mu.Lock()
	n.stopping = true
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGUSR1)
	select {
	case <-exited:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-exited
	}
	os.Remove(n.pidFile)
}
