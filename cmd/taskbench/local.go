package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/e1158ecb/taskstore/internal/freeport"
)

// localCluster is N taskstored processes (and optionally one taskproxy) on
// loopback, with their data in a temporary directory removed on stop.
type localCluster struct {
	dir     string
	procs   []*exec.Cmd
	names   []string // of procs: n1, n2, ..., proxy
	nodes   []string // gRPC addresses
	proxy   string   // gRPC address of the proxy, when started
	httpAll []string // every node's HTTP address
	// profiled names every process (n1.., proxy) with its HTTP address.
	profiled []profileTarget
	// gomaxprocs is the GOMAXPROCS every process was started with.
	gomaxprocs string
}

// localGOMAXPROCS shares the machine's cores among the processes of a local
// cluster: each Go runtime otherwise assumes it owns every core, and on two
// cores three nodes and a proxy with two Ps each spin their idle Ps against
// each other (about 30% more claim+delete throughput with one P each,
// docs/performance.md). A GOMAXPROCS in the environment wins.
func localGOMAXPROCS(procs, cpus int, getenv func(string) string) string {
	if v := getenv("GOMAXPROCS"); v != "" {
		return v
	}
	return strconv.Itoa(max(1, cpus/procs))
}

// findBinary looks for name next to the running executable, then in
// $TASKSTORE_BIN, then on PATH.
func findBinary(name string, getenv func(string) string) (string, error) {
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(exe))
	}
	if d := getenv("TASKSTORE_BIN"); d != "" {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found next to taskbench, in $TASKSTORE_BIN or on PATH (run `make build`)", name)
}

// startLocal starts n nodes (and a proxy when withProxy) and waits until
// every one answers /readyz.
func startLocal(ctx context.Context, n, shards int, withProxy bool, getenv func(string) string) (*localCluster, error) {
	storeBin, err := findBinary("taskstored", getenv)
	if err != nil {
		return nil, err
	}
	proxyBin := ""
	if withProxy {
		if proxyBin, err = findBinary("taskproxy", getenv); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "taskbench-")
	if err != nil {
		return nil, err
	}
	lc := &localCluster{dir: dir}
	nprocs := n
	if withProxy {
		nprocs++
	}
	// GOMAXPROCS(0): the cores this process may use (a container's CPU
	// limit included), unless GOMAXPROCS is set, which localGOMAXPROCS
	// then passes on.
	lc.gomaxprocs = localGOMAXPROCS(nprocs, runtime.GOMAXPROCS(0), getenv)
	// Picked below the ephemeral range, so that no connection of a node
	// already running takes the port of one still to start.
	addrs, err := freeport.Addrs(3*n + 2)
	if err != nil {
		lc.stop()
		return nil, err
	}
	var initial []string
	for i := range n {
		lc.nodes = append(lc.nodes, addrs[3*i])
		initial = append(initial, fmt.Sprintf("n%d=%s", i+1, addrs[3*i]))
	}
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		args := []string{"--id", id, "--data-dir", filepath.Join(dir, id),
			"--listen", addrs[3*i], "--gossip", addrs[3*i+1], "--http", addrs[3*i+2],
			"--initial-cluster", strings.Join(initial, ","), "--log-level", "warn", "--pprof"}
		if shards > 0 {
			args = append(args, "--shards", strconv.Itoa(shards))
		}
		if err := lc.spawn(storeBin, id, args); err != nil {
			lc.stop()
			return nil, err
		}
		lc.httpAll = append(lc.httpAll, addrs[3*i+2])
		lc.profiled = append(lc.profiled, profileTarget{id, addrs[3*i+2]})
	}
	if err := lc.waitReady(ctx, lc.httpAll); err != nil {
		lc.stop()
		return nil, err
	}
	if withProxy {
		lc.proxy = addrs[3*n]
		args := []string{"--listen", lc.proxy, "--cluster", strings.Join(lc.nodes, ","),
			"--http", addrs[3*n+1], "--log-level", "warn", "--pprof"}
		if err := lc.spawn(proxyBin, "proxy", args); err != nil {
			lc.stop()
			return nil, err
		}
		if err := lc.waitReady(ctx, []string{addrs[3*n+1]}); err != nil {
			lc.stop()
			return nil, err
		}
		lc.profiled = append(lc.profiled, profileTarget{"proxy", addrs[3*n+1]})
	}
	return lc, nil
}

func (lc *localCluster) spawn(bin, name string, args []string) error {
	logf, err := os.Create(filepath.Join(lc.dir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "GOMAXPROCS="+lc.gomaxprocs)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	logf.Close() // the child holds its own descriptor
	lc.procs = append(lc.procs, cmd)
	lc.names = append(lc.names, name)
	return nil
}

// waitReady polls /readyz of every address, up to a minute.
func (lc *localCluster) waitReady(ctx context.Context, httpAddrs []string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, a := range httpAddrs {
		for {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a+"/readyz", nil)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("local cluster: %s not ready: %w (logs in %s)", a, errors.Join(ctx.Err(), err), lc.dir)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// stop sends SIGTERM to every process (proxy first), waits up to 20 s for
// them, kills what is left, and removes the data.
func (lc *localCluster) stop() {
	for i := len(lc.procs) - 1; i >= 0; i-- {
		lc.procs[i].Process.Signal(syscall.SIGTERM)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, p := range lc.procs {
		done := make(chan struct{})
		go func() { p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Until(deadline)):
			p.Process.Kill()
			<-done
		}
	}
	os.RemoveAll(lc.dir)
}

// proxyHTTP is the HTTP address of the local proxy, or "".
func (lc *localCluster) proxyHTTP() string {
	if lc == nil {
		return ""
	}
	for _, p := range lc.profiled {
		if p.name == "proxy" {
			return p.http
		}
	}
	return ""
}
