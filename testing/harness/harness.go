// Package harness starts Taskstore clusters for tests: real nodes with real
// Raft groups, bbolt files in temporary directories and gRPC over loopback,
// in-process. It can kill, restart and partition nodes.
//
//	c := harness.Start(t, 3)
//	c.WaitReady()
//	conn := c.Conn(0)
//
// A Cluster is safe for use by one test goroutine plus the workload's.
package harness

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/e1158ecb/taskstore/api/limits"
	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/auth"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/internal/freeport"
	"github.com/e1158ecb/taskstore/server"
)

// Options shape a test cluster.
type Options struct {
	Shards   int     // default 4
	Replicas int     // default 3
	Scale    float64 // Raft timeout scale; default 1 (raise under -race)
	// LogLevel for node logs written to the test log; default warn.
	LogLevel slog.Level
	// Secure runs the cluster with TLS between everyone, gossip encryption
	// and an authorization policy (see Security); Conn then presents the
	// admin certificate. ClientAuth also makes nodes refuse connections
	// without a client certificate.
	Secure, ClientAuth bool
	// Tune, when set, adjusts every node's Raft tuning.
	Tune func(*cluster.Tuning)
	// HTTP serves every node's HTTP endpoints on a free port
	// (Node.Server().HTTPAddr; HTTPS when Secure).
	HTTP bool
	// Limits, when set, are the nodes' limits.
	Limits limits.Server
	// Logs, when set, also receives every node's log lines (slog text). It
	// must be safe for concurrent writes.
	Logs io.Writer
	// StateStore is every node's cluster.Config.StateStore; empty means
	// on disk, not the product's default, so that every package that
	// starts a cluster in process (chaos included) runs the state on disk;
	// the process suites run the binaries' default. SetStateStore changes
	// one node's for its next start.
	StateStore string
	// MemoryLimit is every node's cluster.Config.MemoryLimit (0: none).
	MemoryLimit int64
}

// Cluster is a set of in-process nodes.
type Cluster struct {
	t     testing.TB
	opts  Options
	Nodes []*Node
	net   *Network

	// Security is the secured cluster's material (Options.Secure), else nil.
	Security *Security

	mu    sync.Mutex // guards conns
	conns map[string]*grpc.ClientConn
	ids   sync.Map // gRPC address -> node id
}

// Node is one member of a test cluster.
type Node struct {
	ID     string
	Addr   string
	Gossip string
	Dir    string
	cfg    cluster.Config
	srv    *server.Node
	// diskFree, when non-zero, is what the node measures as its data
	// disk's free space (FillDisk).
	diskFree atomic.Uint64
}

// Server is the running node, nil while stopped.
func (n *Node) Server() *server.Node { return n.srv }

// Start boots an n-node cluster and stops it when the test ends.
func Start(t testing.TB, n int, opts ...Options) *Cluster {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.Shards == 0 {
		o.Shards = 4
	}
	if o.Replicas == 0 {
		o.Replicas = 3
	}
	if o.Scale == 0 {
		o.Scale = 1
	}
	if o.LogLevel == 0 {
		o.LogLevel = slog.LevelWarn
	}
	if o.StateStore == "" {
		o.StateStore = cluster.StateOnDisk
	}
	c := &Cluster{t: t, opts: o, net: NewNetwork(), conns: map[string]*grpc.ClientConn{}}
	var peers []cluster.Peer
	listeners := make([]net.Listener, n)
	base := t.TempDir()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		listeners[i] = l
		id := fmt.Sprintf("n%d", i+1)
		node := &Node{ID: id, Addr: l.Addr().String(), Gossip: freeAddr(t), Dir: filepath.Join(base, id)}
		c.Nodes = append(c.Nodes, node)
		c.ids.Store(node.Addr, id)
		peers = append(peers, cluster.Peer{ID: id, Address: node.Addr})
	}
	if o.Secure {
		var ids []string
		for _, node := range c.Nodes {
			ids = append(ids, node.ID)
		}
		c.Security = newSecurity(t, ids)
		c.Security.Policy.Log = c.logger().With("component", "auth")
	}
	for i, node := range c.Nodes {
		node.cfg = cluster.Config{
			ID: node.ID, DataDir: node.Dir, ListenAddr: node.Addr, GossipAddr: node.Gossip,
			InitialCluster: peers, Shards: o.Shards, Replicas: o.Replicas,
			Tuning: tuned(testTuning(o.Scale), o.Tune), Logger: c.logger(),
			Dialer: c.net.Dialer(node.ID, c.idOf), StateStore: o.StateStore, MemoryLimit: o.MemoryLimit,
		}
		node.cfg.DiskFree = node.measureDisk
		c.secure(&node.cfg)
		cfg := node.cfg
		cfg.Listener = listeners[i]
		srv, err := c.startNode(cfg)
		if err != nil {
			t.Fatalf("start %s: %v", node.ID, err)
		}
		node.srv = srv
	}
	t.Cleanup(c.Close)
	return c
}

// secure adds the cluster's TLS and gossip key to a node's configuration.
func (c *Cluster) secure(cfg *cluster.Config) {
	if c.Security == nil {
		return
	}
	cfg.TLS, cfg.PeerTLS = c.Security.nodeTLS(c.t, cfg.ID, c.opts.ClientAuth)
	cfg.GossipKeys = [][]byte{c.Security.GossipKey}
}

func (c *Cluster) startNode(cfg cluster.Config) (*server.Node, error) {
	var pol *auth.Policy
	if c.Security != nil {
		pol = c.Security.Policy
	}
	if c.opts.HTTP {
		cfg.HTTPAddr = "127.0.0.1:0"
	}
	return server.Start(cfg, server.Options{Policy: pol, Limits: c.opts.Limits})
}

func tuned(t cluster.Tuning, f func(*cluster.Tuning)) cluster.Tuning {
	if f != nil {
		f(&t)
	}
	return t
}

// testTuning is fast but tolerant of a loaded 2-core machine.
func testTuning(scale float64) cluster.Tuning {
	t := cluster.DefaultTuning()
	t.HeartbeatTimeout = 500 * time.Millisecond
	t.ElectionTimeout = 500 * time.Millisecond
	// A leader steps down after a lease without hearing from a quorum; as
	// long as the heartbeat, so a stalled scheduler (-race on 2 cores) does
	// not depose healthy leaders. Reads do not rely on the lease.
	t.LeaderLeaseTimeout = 500 * time.Millisecond
	t.CommitTimeout = 10 * time.Millisecond
	t.SnapshotInterval = 500 * time.Millisecond
	// A small reserve: a test machine's disk may be fuller than a
	// server's, and FillDisk simulates the full disk.
	t.MinFreeDisk = 16 << 20
	return t.Scaled(scale)
}

// logger is a node's base logger; the node adds node=ID itself.
func (c *Cluster) logger() *slog.Logger {
	var w io.Writer = testWriter{c.t}
	if c.opts.Logs != nil {
		w = io.MultiWriter(w, c.opts.Logs)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: c.opts.LogLevel}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { recover() }() // a log line after the test ended
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

// idOf maps a gRPC address to a node id (for the network's rules). Dialers
// call it from raft's goroutines, hence the sync.Map rather than c.Nodes.
func (c *Cluster) idOf(addr string) string {
	if id, ok := c.ids.Load(addr); ok {
		return id.(string)
	}
	return addr
}

// Network is the fault layer between nodes.
func (c *Cluster) Network() *Network { return c.net }

// Close stops every running node.
func (c *Cluster) Close() {
	c.mu.Lock()
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = map[string]*grpc.ClientConn{}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		if n.srv != nil {
			wg.Add(1)
			go func(n *Node) {
				defer wg.Done()
				n.srv.Kill()
				n.srv = nil
			}(n)
		}
	}
	wg.Wait()
}

// StopAll stops every running node together, as the dev cluster's Ctrl-C
// does (server.ShutdownCluster).
func (c *Cluster) StopAll() error {
	var running []*server.Node
	for _, n := range c.Nodes {
		if n.srv != nil {
			running = append(running, n.srv)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := server.ShutdownCluster(ctx, running...)
	for _, n := range c.Nodes {
		n.srv = nil
	}
	return err
}

// Kill stops node i at once, as kill -9 would (no hand-off, no flush beyond
// what Raft already fsynced).
func (c *Cluster) Kill(i int) {
	n := c.Nodes[i]
	if n.srv != nil {
		n.srv.Kill()
		n.srv = nil
	}
}

// Stop stops node i gracefully.
func (c *Cluster) Stop(i int) {
	n := c.Nodes[i]
	if n.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.srv.Shutdown(ctx)
		n.srv = nil
	}
}

// Restart starts a stopped node again with its data directory.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	n := c.Nodes[i]
	if n.srv != nil {
		c.t.Fatalf("%s is running", n.ID)
	}
	var err error
	for try := 0; try < 50; try++ {
		if n.srv, err = c.startNode(n.cfg); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond) // the port may linger briefly
	}
	c.t.Fatalf("restart %s: %v", n.ID, err)
}

// SetStateStore sets where stopped node i keeps its shards' state from
// its next start (cluster.StateOnDisk or cluster.StateInMemory).
func (c *Cluster) SetStateStore(i int, store string) {
	c.t.Helper()
	n := c.Nodes[i]
	if n.srv != nil {
		c.t.Fatalf("%s is running", n.ID)
	}
	n.cfg.StateStore = store
}

// Conn returns a client connection to node i.
func (c *Cluster) Conn(i int) *grpc.ClientConn {
	return c.ConnTo(c.Nodes[i].Addr)
}

// ConnTo returns a pooled client connection to an address.
func (c *Cluster) ConnTo(addr string) *grpc.ClientConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	if conn := c.conns[addr]; conn != nil {
		return conn
	}
	creds := insecure.NewCredentials()
	if c.Security != nil {
		creds = credentials.NewTLS(c.Security.ClientTLS(c.t, "admin"))
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		c.t.Fatal(err)
	}
	c.conns[addr] = conn
	return conn
}

// Endpoints are the gRPC addresses of the running nodes.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, n := range c.Nodes {
		if n.srv != nil {
			out = append(out, n.Addr)
		}
	}
	return out
}

// WaitReady waits until the map is known and every shard has a ready leader
// that the running nodes agree on.
func (c *Cluster) WaitReady() {
	c.t.Helper()
	deadline := time.Now().Add(time.Duration(float64(60*time.Second) * c.opts.Scale))
	var last error
	for time.Now().Before(deadline) {
		if last = c.ready(); last == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("cluster not ready: %v", last)
}

func (c *Cluster) ready() error {
	for _, n := range c.Nodes {
		if n.srv == nil {
			continue
		}
		if err := n.srv.Ready(); err != nil {
			return fmt.Errorf("%s: %w", n.ID, err)
		}
	}
	// Settled: each shard is led by its preferred replica (the first running
	// one in the map's list), where the balancer moves leadership; a test
	// that starts earlier sees leaders move under it.
	running := map[string]int{}
	var cm *metapb.ClusterMap
	for i, n := range c.Nodes {
		if n.srv != nil {
			running[n.ID] = i
			cm = n.srv.Node.Map()
		}
	}
	if cm == nil {
		return fmt.Errorf("no node running")
	}
	for _, sh := range cm.Shards {
		leader := c.Leader(sh.Id)
		if leader < 0 {
			return fmt.Errorf("shard %d has no ready leader", sh.Id)
		}
		// The map's preferred leader (shards added on a live cluster
		// name one that is not first in their sorted replica list), else
		// the first running replica, as for shards of an older map.
		want := sh.PreferredLeader
		if _, ok := running[want]; !ok {
			want = ""
			for _, r := range sh.Replicas {
				if _, ok := running[r]; ok {
					want = r
					break
				}
			}
		}
		if i, ok := running[want]; ok && i != leader {
			return fmt.Errorf("shard %d is led by %s, not yet by its preferred replica %s", sh.Id, c.Nodes[leader].ID, want)
		}
	}
	return nil
}

// Leader returns the index of the running node that leads shard (ready for
// reads and writes), or -1.
func (c *Cluster) Leader(shard uint32) int {
	for i, n := range c.Nodes {
		if n.srv == nil {
			continue
		}
		if s := n.srv.Node.Shard(shard); s != nil && s.IsLeader() {
			return i
		}
	}
	return -1
}

// ShardOf returns the shard that owns a queue's consistency group.
func (c *Cluster) ShardOf(queue string) uint32 {
	for _, n := range c.Nodes {
		if n.srv != nil {
			cm := n.srv.Node.Map()
			if len(cm.Slots) > 0 {
				return cm.Slots[taskstorepb.SlotOf(taskstorepb.GroupOf(queue), len(cm.Slots))]
			}
		}
	}
	return 0
}

// Discard is a logger for tests that want no node output.
var Discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// TaskStore returns a TaskStore client for the current leader of the shard
// that owns queue, waiting for one to be ready.
func (c *Cluster) TaskStore(queue string) taskstorepb.TaskStoreClient {
	c.t.Helper()
	shard := c.ShardOf(queue)
	deadline := time.Now().Add(time.Duration(float64(30*time.Second) * c.opts.Scale))
	for time.Now().Before(deadline) {
		if i := c.Leader(shard); i >= 0 {
			return taskstorepb.NewTaskStoreClient(c.Conn(i))
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("shard %d (queue %s) has no leader", shard, queue)
	return nil
}

// StartJoining starts a new node that gossips into the cluster through node
// 0 and waits to be added by an operator. It returns the node's index.
func (c *Cluster) StartJoining(id string) int {
	c.t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	node := &Node{ID: id, Addr: l.Addr().String(), Gossip: freeAddr(c.t), Dir: filepath.Join(c.t.TempDir(), id)}
	node.cfg = cluster.Config{
		ID: id, DataDir: node.Dir, ListenAddr: node.Addr, GossipAddr: node.Gossip,
		Join: []string{c.Nodes[0].Gossip}, Shards: c.opts.Shards, Replicas: c.opts.Replicas,
		Tuning: testTuning(c.opts.Scale), Logger: c.logger(), Dialer: c.net.Dialer(id, c.idOf),
	}
	node.cfg.DiskFree = node.measureDisk
	c.secure(&node.cfg)
	cfg := node.cfg
	cfg.Listener = l
	c.ids.Store(node.Addr, id)
	if node.srv, err = c.startNode(cfg); err != nil {
		c.t.Fatalf("start %s: %v", id, err)
	}
	c.Nodes = append(c.Nodes, node)
	return len(c.Nodes) - 1
}

// freeAddr is a loopback address for a node to bind later (freeport).
func freeAddr(t testing.TB) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// measureDisk is the node's cluster.Config.DiskFree: the real free space,
// unless FillDisk set one.
func (n *Node) measureDisk(dir string) (uint64, error) {
	if v := n.diskFree.Load(); v != 0 {
		return v, nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// WaitFormat waits until every shard's leader has raised its state format
// to what this binary applies (cluster.Node.RaiseFormat, within about
// Tuning.FormatEvery of a leader settling): before that the API refuses
// what needs it (queue pauses and limits, held inserts) as unavailable.
func (c *Cluster) WaitFormat() {
	c.t.Helper()
	deadline := time.Now().Add(time.Duration(float64(30*time.Second) * c.opts.Scale))
	for {
		behind := ""
		for _, id := range c.Shards() {
			l := c.Leader(id)
			if l < 0 {
				behind = fmt.Sprintf("shard %d has no leader", id)
				break
			}
			if s := c.Nodes[l].srv.Node.Shard(id); s == nil || s.Machine().Format() < fsm.MaxFormat {
				behind = fmt.Sprintf("shard %d is below state format %d", id, fsm.MaxFormat)
				break
			}
		}
		if behind == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("state formats not raised: %s", behind)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
