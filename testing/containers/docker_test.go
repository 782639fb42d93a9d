package containers_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/checker"
)

// Ports inside the containers (deploy/Dockerfile).
const (
	nodeGRPC  = 7101
	nodeHTTP  = 7301
	proxyGRPC = 7000
	proxyHTTP = 7300
)

// label marks every container and network the test creates, so that
// leftovers of a killed test run can be found:
//
//	docker rm -f -v $(docker ps -aq --filter label=taskstore-containers-test)
const label = "taskstore-containers-test"

// image is the image under test: $TASKSTORE_IMAGE, else taskstore:dev
// (make image).
func image() string {
	if s := os.Getenv("TASKSTORE_IMAGE"); s != "" {
		return s
	}
	return "taskstore:dev"
}

// gate skips unless TASKSTORE_DOCKER is set (make test-containers) and
// fails when it is set but docker or the image is missing.
func gate(t *testing.T) {
	t.Helper()
	if testing.Short() || os.Getenv("TASKSTORE_DOCKER") == "" {
		t.Skip("container test: set TASKSTORE_DOCKER=1 (make test-containers)")
	}
	if _, err := exec.LookPath("docker"); err != nil {
		t.Fatalf("TASKSTORE_DOCKER is set but docker is not installed: %v", err)
	}
	if out, err := docker("version", "--format", "{{.Server.Version}}"); err != nil {
		t.Fatalf("TASKSTORE_DOCKER is set but the Docker engine does not answer: %v", err)
	} else {
		t.Logf("docker engine %s, image %s", out, image())
	}
	if _, err := docker("image", "inspect", "--format", "{{.Id}}", image()); err != nil {
		t.Fatalf("image %s missing (make image): %v", image(), err)
	}
}

// docker runs the docker CLI (bounded to 90 s) and returns its trimmed
// output.
func docker(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		return s, fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, s)
	}
	return s, nil
}

// container is one node or the proxy.
type container struct {
	ID   string // n1.. or proxy: the host name on the network
	Name string // docker container name
	IP   string

	disconnected bool
	stopped      bool
	paused       bool
}

// dockerCluster is N taskstored containers and one taskproxy container on
// a private bridge network of their own. The test process only talks to
// ports published on 127.0.0.1.
type dockerCluster struct {
	t       *testing.T
	network string
	created bool // the network exists
	Nodes   []*container
	Proxy   *container
	// Admin talks to the cluster through the proxy (Status).
	Admin *client.Client
}

var seq atomic.Int32

// startCluster creates the network and starts n nodes (every shard
// replicated replicas times) and a proxy. Everything is removed when the
// test ends, whatever happens.
//
// extra, when set, adds docker run arguments and taskstored flags for a node.
func startCluster(t *testing.T, n, shards, replicas int, extra ...func(nd *container) (dockerArgs, flags []string)) *dockerCluster {
	t.Helper()
	c := &dockerCluster{t: t, network: fmt.Sprintf("tsct-%d-%d", os.Getpid(), seq.Add(1))}
	t.Cleanup(c.teardown)

	// Fixed addresses: memberlist binds and advertises an IP, and a node
	// must get the same one back after `docker start` and `network connect`
	// (its sockets stay bound to it). So the network has a subnet of its
	// own, picked among 10.215.0.0/16 until one does not overlap.
	var subnet string
	base := (os.Getpid()*7 + int(seq.Load())*31) % 240
	for i := 0; ; i++ {
		subnet = fmt.Sprintf("10.215.%d", (base+i)%240+10)
		_, err := docker("network", "create", "--driver", "bridge", "--subnet", subnet+".0/24",
			"--label", label+"="+c.network, c.network)
		if err == nil {
			c.created = true
			break
		}
		if i == 20 || !strings.Contains(strings.ToLower(err.Error()), "overlap") {
			t.Fatalf("create network: %v", err)
		}
	}
	var initial, cluster []string
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("n%d", i)
		c.Nodes = append(c.Nodes, &container{ID: id, Name: c.network + "-" + id, IP: fmt.Sprintf("%s.%d", subnet, 10+i)})
		initial = append(initial, fmt.Sprintf("%s=%s:%d", id, id, nodeGRPC))
		cluster = append(cluster, fmt.Sprintf("%s:%d", id, nodeGRPC))
	}
	c.Proxy = &container{ID: "proxy", Name: c.network + "-proxy", IP: subnet + ".21"}
	t.Logf("network %s (%s.0/24), image %s: %d nodes, %d shards, replicas %d", c.network, subnet, image(), n, shards, replicas)

	run := func(ct *container, ports []int, entrypoint string, args ...string) {
		cmd := []string{"run", "-d", "--name", ct.Name, "--hostname", ct.ID, "--label", label + "=" + c.network,
			"--network", c.network, "--ip", ct.IP, "--network-alias", ct.ID}
		for _, x := range extra {
			if ct != c.Proxy {
				d, f := x(ct)
				cmd = append(cmd, d...)
				args = append(args, f...)
			}
		}
		for _, p := range ports {
			cmd = append(cmd, "-p", fmt.Sprintf("127.0.0.1::%d", p))
		}
		if entrypoint != "" {
			cmd = append(cmd, "--entrypoint", entrypoint)
		}
		cmd = append(cmd, image())
		if _, err := docker(append(cmd, args...)...); err != nil {
			t.Fatalf("start %s: %v", ct.ID, err)
		}
	}
	for _, nd := range c.Nodes {
		// Flags as deploy/docker-compose.yml, with the Raft timeouts the
		// chaos tests use on 2 cores (--raft-timeout-scale 2).
		run(nd, []int{nodeGRPC, nodeHTTP}, "",
			"--id", nd.ID, "--data-dir", "/data",
			"--listen", fmt.Sprintf("%s:%d", nd.ID, nodeGRPC), "--gossip", nd.ID+":7201", "--http", fmt.Sprintf("%s:%d", nd.ID, nodeHTTP),
			"--initial-cluster", strings.Join(initial, ","), "--shards", fmt.Sprint(shards), "--replicas", fmt.Sprint(replicas),
			"--raft-timeout-scale", "2", "--log-level", "warn")
	}
	run(c.Proxy, []int{proxyGRPC, proxyHTTP}, "/usr/local/bin/taskproxy",
		"--listen", fmt.Sprintf("0.0.0.0:%d", proxyGRPC), "--http", fmt.Sprintf("0.0.0.0:%d", proxyHTTP),
		"--cluster", strings.Join(cluster, ","), "--log-level", "warn")

	admin, err := client.Dial(context.Background(), c.ProxyAddr(), client.WithProxyOnly(), client.WithAttemptTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c.Admin = admin
	return c
}

// teardown logs the containers' last lines when the test failed, then
// removes the containers (with their volumes) and the network.
func (c *dockerCluster) teardown() {
	if c.Admin != nil {
		c.Admin.Close()
	}
	all := append(slices.Clone(c.Nodes), c.Proxy)
	var names []string
	for _, ct := range all {
		if ct == nil {
			continue
		}
		names = append(names, ct.Name)
		if c.t.Failed() {
			out, _ := docker("logs", "--tail", "30", ct.Name)
			c.t.Logf("--- last log lines of %s (%s):\n%s", ct.ID, ct.Name, out)
		}
	}
	if len(names) > 0 {
		if out, err := docker(append([]string{"rm", "-f", "-v"}, names...)...); err != nil && !strings.Contains(out, "No such container") {
			c.t.Errorf("remove containers: %v", err)
		}
	}
	if !c.created {
		return
	}
	if _, err := docker("network", "rm", c.network); err != nil {
		c.t.Errorf("remove network: %v", err)
	}
}

// hostAddr is where the container's port p is published on 127.0.0.1. It
// changes when a container is restarted or reconnected, so it is read each
// time.
func (c *dockerCluster) hostAddr(ct *container, p int) (string, error) {
	out, err := docker("port", ct.Name, fmt.Sprintf("%d/tcp", p))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "127.0.0.1:") {
			return line, nil
		}
	}
	return "", fmt.Errorf("%s: port %d not published on 127.0.0.1: %q", ct.ID, p, out)
}

// ProxyAddr is the proxy's gRPC address on 127.0.0.1 (the proxy is never
// disconnected or restarted, so it does not change).
func (c *dockerCluster) ProxyAddr() string {
	c.t.Helper()
	a, err := c.hostAddr(c.Proxy, proxyGRPC)
	if err != nil {
		c.t.Fatal(err)
	}
	return a
}

// Node returns the node with id.
func (c *dockerCluster) Node(id string) *container {
	for _, n := range c.Nodes {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// Disconnect cuts the node off the network: `docker network disconnect`.
func (c *dockerCluster) Disconnect(nd *container) {
	c.t.Helper()
	if _, err := docker("network", "disconnect", c.network, nd.Name); err != nil {
		c.t.Fatal(err)
	}
	nd.disconnected = true
}

// Connect puts the node back, with its address and name.
func (c *dockerCluster) Connect(nd *container) {
	c.t.Helper()
	if _, err := docker("network", "connect", "--ip", nd.IP, "--alias", nd.ID, c.network, nd.Name); err != nil {
		c.t.Fatal(err)
	}
	nd.disconnected = false
}

// Kill is `docker kill` (SIGKILL); the container keeps its /data volume.
func (c *dockerCluster) Kill(nd *container) {
	c.t.Helper()
	if _, err := docker("kill", nd.Name); err != nil {
		c.t.Fatal(err)
	}
	nd.stopped = true
}

// Start is `docker start` of a killed node: the same data, address and name.
func (c *dockerCluster) Start(nd *container) {
	c.t.Helper()
	if _, err := docker("start", nd.Name); err != nil {
		c.t.Fatal(err)
	}
	nd.stopped = false
}

// Pause is `docker pause`: the cgroup freezer stops every process of the
// container, as SIGSTOP does; its sockets stay open.
func (c *dockerCluster) Pause(nd *container) {
	c.t.Helper()
	if _, err := docker("pause", nd.Name); err != nil {
		c.t.Fatal(err)
	}
	nd.paused = true
}

// Unpause is `docker unpause`.
func (c *dockerCluster) Unpause(nd *container) {
	c.t.Helper()
	if _, err := docker("unpause", nd.Name); err != nil {
		c.t.Fatal(err)
	}
	nd.paused = false
}

// ShardLogs stops every node (`docker stop`, graceful), copies each one's
// shard directories out of its container and reads every replica's Raft
// log, for checker.LogAgreement. The nodes stay stopped.
func (c *dockerCluster) ShardLogs() ([]checker.ReplicaLog, error) {
	dir := c.t.TempDir()
	var out []checker.ReplicaLog
	for _, nd := range c.Nodes {
		if _, err := docker("stop", "-t", "20", nd.Name); err != nil {
			return nil, fmt.Errorf("stop %s: %w", nd.ID, err)
		}
		nd.stopped = true
		dst := filepath.Join(dir, nd.ID)
		if _, err := docker("cp", nd.Name+":/data", dst); err != nil {
			return nil, fmt.Errorf("copy %s's data directory: %w", nd.ID, err)
		}
		logs, err := checker.ReadDataDir(nd.ID, dst)
		if err != nil {
			return nil, err
		}
		out = append(out, logs...)
	}
	return out, nil
}

// Restore reconnects, unpauses and restarts every node.
func (c *dockerCluster) Restore() {
	c.t.Helper()
	for _, nd := range c.Nodes {
		if nd.paused {
			c.Unpause(nd)
		}
		if nd.disconnected {
			c.Connect(nd)
		}
		if nd.stopped {
			c.Start(nd)
		}
	}
}

// ready reports whether ct answers /readyz on its published HTTP port.
func (c *dockerCluster) ready(ct *container, port int) error {
	addr, err := c.hostAddr(ct, port)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s /readyz: %s", ct.ID, resp.Status)
	}
	return nil
}

// WaitReady waits until every node and the proxy answer /readyz and the
// cluster's status, read through the proxy, shows every shard with a
// leader and every node alive.
func (c *dockerCluster) WaitReady(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	check := func() error {
		for _, nd := range c.Nodes {
			if err := c.ready(nd, nodeHTTP); err != nil {
				return err
			}
		}
		if err := c.ready(c.Proxy, proxyHTTP); err != nil {
			return err
		}
		st, err := c.Status()
		if err != nil {
			return err
		}
		for _, s := range st.Shards {
			if s.Leader == "" {
				return fmt.Errorf("shard %d has no leader", s.Id)
			}
		}
		for _, nd := range st.Nodes {
			if nd.Health != "alive" {
				return fmt.Errorf("node %s is %s", nd.Id, nd.Health)
			}
		}
		return nil
	}
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("cluster not ready after %v: %v", timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// Status is Admin.Status through the proxy. The bound leaves the proxy
// time to give up on a node that is cut off (half of it, see client's
// attempt timeout) and ask another.
func (c *dockerCluster) Status() (*taskstorepb.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Admin.Status(ctx, &taskstorepb.StatusRequest{})
}

// dialNode connects to nd's gRPC port as published on 127.0.0.1.
func (c *dockerCluster) dialNode(nd *container) (*grpc.ClientConn, error) {
	addr, err := c.hostAddr(nd, nodeGRPC)
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// StatusFrom is Admin.Status asked of one node on its published gRPC
// port: that node's view, merged with what the others it reaches say.
func (c *dockerCluster) StatusFrom(nd *container) (*taskstorepb.StatusResponse, error) {
	conn, err := c.dialNode(nd)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return taskstorepb.NewAdminClient(conn).Status(ctx, &taskstorepb.StatusRequest{})
}

// Shards lists the shard ids (from the proxy's status).
func (c *dockerCluster) Shards() []uint32 {
	c.t.Helper()
	st, err := c.Status()
	if err != nil {
		c.t.Fatalf("status: %v", err)
	}
	var out []uint32
	for _, s := range st.Shards {
		out = append(out, s.Id)
	}
	return out
}

// Leader waits until shard has a leader that is running and connected,
// and returns it with its term.
func (c *dockerCluster) Leader(shard uint32) (*container, uint64) {
	c.t.Helper()
	var last string
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		st, err := c.Status()
		if err != nil {
			last = err.Error()
			continue
		}
		for _, s := range st.Shards {
			if s.Id != shard {
				continue
			}
			if nd := c.Node(s.Leader); nd != nil && !nd.stopped && !nd.disconnected {
				return nd, s.Term
			}
			last = fmt.Sprintf("leader %q", s.Leader)
		}
	}
	c.t.Fatalf("shard %d: no usable leader: %s", shard, last)
	return nil, 0
}

// leaderTracker polls Admin.Status through the proxy and counts leader
// changes per shard. Status is one node's merged view, so it may lag: a
// change is counted only when a shard's leader differs from the last one
// counted and the term is higher than that leader's, so that a stale view
// never counts a change (and a change seen late is still counted once).
type leaderTracker struct {
	c    *dockerCluster
	stop chan struct{}
	done chan struct{}

	mu         sync.Mutex
	leader     map[uint32]string
	leaderTerm map[uint32]uint64
	firstTerm  map[uint32]uint64
	maxTerm    map[uint32]uint64
	changes    int
	log        []string
}

func (c *dockerCluster) TrackLeaders() *leaderTracker {
	lt := &leaderTracker{c: c, stop: make(chan struct{}), done: make(chan struct{}),
		leader: map[uint32]string{}, leaderTerm: map[uint32]uint64{}, firstTerm: map[uint32]uint64{}, maxTerm: map[uint32]uint64{}}
	go func() {
		defer close(lt.done)
		for {
			lt.poll()
			select {
			case <-lt.stop:
				return
			case <-time.After(400 * time.Millisecond):
			}
		}
	}()
	c.t.Cleanup(lt.Stop)
	return lt
}

func (lt *leaderTracker) poll() {
	st, err := lt.c.Status()
	if err != nil {
		return
	}
	lt.mu.Lock()
	defer lt.mu.Unlock()
	for _, s := range st.Shards {
		if _, ok := lt.firstTerm[s.Id]; !ok {
			lt.firstTerm[s.Id] = s.Term
		}
		lt.maxTerm[s.Id] = max(lt.maxTerm[s.Id], s.Term)
		if s.Leader == "" {
			continue
		}
		prev, ok := lt.leader[s.Id]
		switch {
		case !ok:
			lt.leader[s.Id], lt.leaderTerm[s.Id] = s.Leader, s.Term
		case s.Leader != prev && s.Term > lt.leaderTerm[s.Id]:
			lt.changes++
			lt.log = append(lt.log, fmt.Sprintf("%s shard %d: %s -> %s (term %d)", time.Now().Format("15:04:05.000"), s.Id, prev, s.Leader, s.Term))
			lt.leader[s.Id], lt.leaderTerm[s.Id] = s.Leader, s.Term
		}
	}
}

// Stop ends the polling (idempotent).
func (lt *leaderTracker) Stop() {
	select {
	case <-lt.stop:
	default:
		close(lt.stop)
	}
	<-lt.done
}

// Changes is the number of leader changes seen; Terms the number of terms
// started across shards; Log describes each change.
func (lt *leaderTracker) Changes() int {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.changes
}

func (lt *leaderTracker) Terms() int {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	n := 0
	for s, t := range lt.maxTerm {
		n += int(t - lt.firstTerm[s])
	}
	return n
}

func (lt *leaderTracker) Log() []string {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return slices.Clone(lt.log)
}

// ReplicaStates samples every voter of every shard once the cluster is
// quiet (the workload stopped): all voters at the same applied index and
// commit index, stable over two polls. Each node is read on its own
// published gRPC port: its applied index (Admin.Status, local only), its
// replica's queues and tasks (stale reads, no leader involved), and its
// applied index again, which must not have moved. The Digest of a
// checker.Replica is then a SHA-256 of that listing (every queue's name
// and count, every task version with its value), not fsm.Machine.Digest,
// which no API exposes: it covers the tasks, not the sessions or the
// shard clock.
func (c *dockerCluster) ReplicaStates(timeout time.Duration) ([]checker.Replica, error) {
	deadline := time.Now().Add(timeout)
	var last error
	var prev map[uint32]uint64
	for ; time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		applied, voters, err := c.converged()
		if err != nil {
			last, prev = err, nil
			continue
		}
		if !maps64Equal(prev, applied) {
			prev, last = applied, errors.New("applied indexes still moving")
			continue
		}
		var out []checker.Replica
		for _, nd := range c.Nodes {
			reps, err := c.sampleNode(nd, voters, applied)
			if err != nil {
				last = err
				out = nil
				break
			}
			out = append(out, reps...)
		}
		if out != nil {
			return out, nil
		}
	}
	return nil, fmt.Errorf("replicas did not converge in %v: %w", timeout, last)
}

func maps64Equal(a, b map[uint32]uint64) bool {
	if a == nil || b == nil || len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// converged returns each shard's applied index and voters when every voter
// reports the same applied and commit index.
func (c *dockerCluster) converged() (map[uint32]uint64, map[uint32][]string, error) {
	st, err := c.Status()
	if err != nil {
		return nil, nil, err
	}
	applied := map[uint32]uint64{}
	voters := map[uint32][]string{}
	for _, s := range st.Shards {
		if s.Leader == "" {
			return nil, nil, fmt.Errorf("shard %d has no leader", s.Id)
		}
		byNode := map[string]*taskstorepb.ReplicaStatus{}
		for _, r := range s.ReplicaStatus {
			byNode[r.Node] = r
		}
		first := true
		for _, id := range s.Replicas {
			r := byNode[id]
			if r == nil {
				return nil, nil, fmt.Errorf("shard %d: no status from %s", s.Id, id)
			}
			if r.Role == "nonvoter" {
				continue
			}
			if r.CommitIndex != r.AppliedIndex || !first && r.AppliedIndex != applied[s.Id] {
				return nil, nil, fmt.Errorf("shard %d: voters not at one applied index", s.Id)
			}
			applied[s.Id], first = r.AppliedIndex, false
			voters[s.Id] = append(voters[s.Id], id)
		}
	}
	return applied, voters, nil
}

// sampleNode reads nd's replicas of the shards it is a voter of.
func (c *dockerCluster) sampleNode(nd *container, voters map[uint32][]string, applied map[uint32]uint64) ([]checker.Replica, error) {
	conn, err := c.dialNode(nd)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	local := func() (map[uint32]uint64, error) {
		st, err := taskstorepb.NewAdminClient(conn).Status(ctx, &taskstorepb.StatusRequest{LocalOnly: true})
		if err != nil {
			return nil, fmt.Errorf("%s: local status: %w", nd.ID, err)
		}
		out := map[uint32]uint64{}
		for _, s := range st.Shards {
			for _, r := range s.ReplicaStatus {
				if r.Node == nd.ID {
					out[s.Id] = r.AppliedIndex
				}
			}
		}
		return out, nil
	}
	before, err := local()
	if err != nil {
		return nil, err
	}
	var out []checker.Replica
	ts := taskstorepb.NewTaskStoreClient(conn)
	for shard, vs := range voters {
		if !slices.Contains(vs, nd.ID) {
			continue
		}
		if before[shard] != applied[shard] {
			return nil, fmt.Errorf("%s: shard %d at applied index %d, the others at %d", nd.ID, shard, before[shard], applied[shard])
		}
		digest, err := listingDigest(ctx, ts, shard)
		if err != nil {
			return nil, fmt.Errorf("%s: shard %d: %w", nd.ID, shard, err)
		}
		out = append(out, checker.Replica{Shard: shard, Node: nd.ID, Applied: before[shard], Digest: digest})
	}
	after, err := local()
	if err != nil {
		return nil, err
	}
	if !maps64Equal(before, after) {
		return nil, fmt.Errorf("%s: applied while being read", nd.ID)
	}
	return out, nil
}

// listingDigest hashes one replica's whole task state, read stale (from
// this replica, no leader check): queues in order with their counts, each
// queue's tasks in listing order, each marshalled deterministically.
func listingDigest(ctx context.Context, ts taskstorepb.TaskStoreClient, shard uint32) ([32]byte, error) {
	h := sha256.New()
	qs, err := ts.Queues(ctx, &taskstorepb.QueuesRequest{Shard: shard, Stale: true})
	if err != nil {
		return [32]byte{}, fmt.Errorf("stale queues: %w", err)
	}
	var n [8]byte
	write := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	for _, q := range qs.Queues {
		write([]byte(fmt.Sprintf("queue %s total=%d available=%d claimed=%d delayed=%d", q.Name, q.Total, q.Available, q.Claimed, q.Delayed)))
		token := ""
		for {
			resp, err := ts.Tasks(ctx, &taskstorepb.TasksRequest{Queue: q.Name, Shard: shard, Stale: true, Limit: 1000, PageToken: token})
			if err != nil {
				return [32]byte{}, fmt.Errorf("stale list %s: %w", q.Name, err)
			}
			for _, task := range resp.Tasks {
				b, err := proto.MarshalOptions{Deterministic: true}.Marshal(task)
				if err != nil {
					return [32]byte{}, err
				}
				write(b)
			}
			if token = resp.NextPageToken; token == "" {
				break
			}
		}
	}
	var d [32]byte
	copy(d[:], h.Sum(nil))
	return d, nil
}
