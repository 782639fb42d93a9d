package cluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/cluster/nodelog"
	"github.com/e1158ecb/taskstore/fsm"
)

// Config describes one node.
type Config struct {
	ID      string
	DataDir string
	// ListenAddr serves gRPC (clients, admin) and Raft, multiplexed.
	ListenAddr string
	// AdvertiseAddr is the gRPC address others reach this node at. Default:
	// this node's --initial-cluster address, else the listener's address
	// (which must then not be 0.0.0.0 or ::).
	AdvertiseAddr string
	// GossipAddr is memberlist's TCP and UDP address.
	GossipAddr string
	// HTTPAddr is advertised to the others (metrics, status page).
	HTTPAddr string
	// InitialCluster bootstraps a new cluster; every initial node gets the
	// same list. Ignored once the node has state.
	InitialCluster []Peer
	// Join names gossip addresses of running nodes, for a node that waits to
	// be added by an operator.
	Join []string
	// Shards and Replicas are used at bootstrap only.
	Shards   int
	Replicas int
	Tuning   Tuning
	Logger   *slog.Logger
	// Dialer opens node-to-node connections (fault injection in tests).
	Dialer Dialer
	// Clock is the node's wall clock (offsets in tests).
	Clock func() time.Time
	// DiskFree measures the free bytes of the data directory's file system
	// (statfs when nil; tests fill a disk with it).
	DiskFree func(dir string) (uint64, error)
	// Listener, when set, is used instead of listening on ListenAddr.
	Listener net.Listener
	// DialOptions are used for node-to-node gRPC calls (with TLS, they
	// must carry this node's certificate).
	DialOptions []grpc.DialOption
	// TLS, when set, makes the shared listener TLS-only; PeerTLS then
	// secures the Raft connections this node dials. Both or neither.
	TLS, PeerTLS *tls.Config
	// GossipKeys encrypt and authenticate gossip (16, 24 or 32 bytes each);
	// the first encrypts, all are tried on receipt (key rotation). Empty:
	// gossip is plain.
	GossipKeys [][]byte
	// ClusterName labels gossip packets so that two clusters sharing a
	// network never merge. Default "taskstore".
	ClusterName string
	// Registry receives the node's metrics; nil records none.
	Registry *prometheus.Registry
	// StateStore is where data shards keep their state: StateOnDisk or
	// StateInMemory; empty means DefaultStateStore.
	StateStore string
	// MemoryLimit is how many bytes of memory the node may use (0: no
	// limit). In memory, it bounds the shards' tasks (inserts past a
	// shard's share are refused); on disk, it sizes the state engine's
	// caches (memory.go).
	MemoryLimit int64
}

// Node is one taskstored process: the meta group, the shards it replicates,
// gossip, and the shared listener. It is safe for concurrent use.
type Node struct {
	cfg  Config
	log  *slog.Logger
	mux  *Mux
	addr string

	metrics   *nodeMetrics
	meta      *metaFSM
	metaGroup *group
	// raftLog holds the entries of every data shard hosted here (nodelog).
	raftLog *nodelog.Log
	// state holds the state of every data shard hosted here (state.go);
	// set by startGroups.
	state *stateStore
	clock *clockGuard
	disk  *diskGuard
	// metaLead is whether this node leads the meta group (metaleader.go).
	metaLead metaLeadership
	// metaCaught is whether the map caught up after the start (metacatchup.go).
	metaCaught *metaCatchUp
	gossip     *gossip
	peers      *connPool
	// peerc asks the other nodes through the Peer service (peer.go).
	peerc *peerClient
	// format raises the shards' state format (format.go).
	format *formatGate

	mu     sync.RWMutex // guards shards, unplacedSince, diverged, disagree and closed
	shards map[uint32]*Shard
	// localShards is len(shards), set under mu: read without it where a
	// proposal stamps its memory budget (memory.go).
	localShards atomic.Int32
	// memory is the tasks' memory budget (memory.go).
	memory memoryBudget
	// diverged: local replicas stopped because their state differs from
	// their group's majority (diverge.go); they are not in shards.
	diverged map[uint32]*divergenceRecord
	// disagree: shards whose voters' checkpoints disagree with no majority.
	disagree map[uint32]string
	// unplacedSince: when the map stopped placing a local replica here.
	unplacedSince map[uint32]time.Time
	closed        bool
	// stopping quiets raft's and gossip's complaints about vanishing
	// peers (BeginStop); noHandOff skips the hand-off of a whole-cluster stop.
	stopping, noHandOff atomic.Bool

	stop chan struct{}
	// mover is the meta leader's slot mover (slotmove.go).
	mover *slotMover
	// ctl is the meta leader's control plane (package control), which acts
	// through controlRuntime.
	ctl *control.Controller
	// removed is closed when this node learns it was removed (removal.go).
	removed chan struct{}
	wg      sync.WaitGroup
}

// Start opens the data directory, starts the groups and gossip, and begins
// serving Raft traffic. Serve gRPC on GRPCListener.
func Start(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cluster: invalid configuration: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Tuning == (Tuning{}) {
		cfg.Tuning = DefaultTuning()
	}
	if cfg.Shards <= 0 {
		cfg.Shards = DefaultShards(len(cfg.InitialCluster))
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 3
	}
	if len(cfg.DialOptions) == 0 {
		creds := insecure.NewCredentials()
		if cfg.PeerTLS != nil {
			// Node-to-node calls (forwarded admin calls, status fan-out)
			// present this node's certificate and want a node's back.
			creds = credentials.NewTLS(cfg.PeerTLS)
		}
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(creds),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Second, Timeout: 3 * time.Second, PermitWithoutStream: true})}
	}
	if cfg.ClusterName == "" {
		cfg.ClusterName = "taskstore"
	}
	// Each part of a node logs with node=ID and its own component=.
	base := cfg.Logger.With("node", cfg.ID)
	log := base.With("component", "node")
	if _, err := os.Stat(filepath.Join(cfg.DataDir, restoringMark)); err == nil {
		return nil, fmt.Errorf("data directory %s: a restore into it did not finish (%s is there): empty the directory and run taskstored restore again", cfg.DataDir, restoringMark)
	}
	if err := claimDataDir(cfg.DataDir, cfg.ID); err != nil {
		return nil, err
	}
	l := cfg.Listener
	if l == nil {
		var err error
		if l, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
			return nil, fmt.Errorf("listen on %s: %w", cfg.ListenAddr, err)
		}
	}
	addr, err := advertiseAddr(cfg, l.Addr())
	if err != nil {
		l.Close()
		return nil, err
	}
	n := &Node{
		cfg:        cfg,
		log:        log,
		addr:       addr,
		meta:       newMetaFSM(),
		metaCaught: newMetaCatchUp(),
		shards:     make(map[uint32]*Shard),
		stop:       make(chan struct{}),
		removed:    make(chan struct{}),
		peers:      newConnPool(cfg.DialOptions),

		diverged: make(map[uint32]*divergenceRecord),
		disagree: make(map[uint32]string),
	}
	n.memory = memoryBudget{limit: cfg.MemoryLimit, onDisk: !stateInMemory(cfg), replicas: &n.localShards}
	n.ctl = control.New(controlRuntime{n}, cfg.ID, log)
	var reg prometheus.Registerer
	if cfg.Registry != nil {
		reg = cfg.Registry
	}
	n.metrics = newNodeMetrics(reg, n)
	n.peerc = &peerClient{pool: n.peers, log: log}
	n.format = &formatGate{self: cfg.ID, every: cfg.Tuning.FormatEvery, timeout: cfg.Tuning.ApplyTimeout, log: log,
		report: n.peerc.report, local: n.LocalShards}
	n.clock = &clockGuard{self: cfg.ID, now: cfg.Clock, maxOffset: cfg.Tuning.MaxClockOffset, every: cfg.Tuning.ClockCheckEvery,
		log: log, offsetGauge: n.metrics.clockOffset, members: func() []*metapb.Node { return n.meta.Map().GetNodes() },
		ask: n.peerc.clock, local: n.LocalShards}
	n.disk = newDiskGuard(cfg, log, n.metrics, n.LocalShards, func(low bool) {
		if n.gossip == nil {
			return
		}
		if err := n.gossip.setMeta(gossipMeta{Address: n.addr, HTTPAddress: cfg.HTTPAddr, DiskLow: low}); err != nil {
			log.Warn("gossip the disk state", "err", err)
		}
	})
	n.mover = newSlotMover(n)
	n.mux = NewMux(l, cfg.Dialer, log, cfg.TLS, cfg.PeerTLS)
	go n.mux.Serve()
	if err := n.startGroups(); err != nil {
		n.abort()
		return nil, err
	}
	g, err := startGossip(gossipConfig{ID: cfg.ID, BindAddr: cfg.GossipAddr, Keys: cfg.GossipKeys, Label: "taskstore/" + cfg.ClusterName},
		gossipMeta{Address: n.addr, HTTPAddress: cfg.HTTPAddr}, quiet(&n.stopping, base.With("component", "gossip")))
	if err != nil {
		n.abort()
		return nil, err
	}
	n.gossip = g
	chores := &chores{tuning: cfg.Tuning, log: log, stop: n.stop, local: n.LocalShards}
	n.loop((&gossipJoiner{cfg: cfg, log: log, stop: n.stop, gossip: g, clusterMap: n.meta.Map, peerc: n.peerc}).run)
	meta := &metaChores{cfg: cfg, log: log, stop: n.stop, lead: &n.metaLead, clusterMap: n.meta.Map, gossip: g, ctl: n.ctl}
	n.loop(meta.record)
	n.loop(n.catchUpMeta)
	n.loop(n.reconcileShards)
	n.loop((&leaderBalancer{self: cfg.ID, electionTimeout: cfg.Tuning.ElectionTimeout, log: log, stop: n.stop,
		local: n.LocalShards, clusterMap: n.meta.Map, gossip: g, peerc: n.peerc, clock: n.clock, disk: n.disk}).run)
	n.loop(meta.place)
	n.loop(n.reconcileConfigs)
	n.loop(func() { checkReplicasEvery(n.stop, n.CheckReplicas) })
	n.loop(chores.tickIdle)
	n.loop(chores.tickDue)
	n.loop(func() { n.format.loop(n.stop) })
	n.loop(n.mover.run)
	n.loop(chores.fireSchedules)
	n.loop(chores.expireRetained)
	n.loop((&removalWatcher{self: cfg.ID, log: log, stop: n.stop, clusterMap: n.meta.Map,
		metaRaft: n.metaGroup.raft, peerc: n.peerc, removed: n.removed}).run)
	n.loop(chores.boundLogs)
	n.loop(func() { n.clock.watch(n.stop) })
	n.loop(func() { n.disk.watch(n.stop) })
	log.Info("node started", "addr", n.addr, "gossip", cfg.GossipAddr, "data", cfg.DataDir)
	return n, nil
}

// InitialAddress is this node's own --initial-cluster entry (false when
// it has none, e.g. a node that joins): the address the other initial
// nodes dial, so the one it listens at and advertises unless told.
func (cfg Config) InitialAddress() (string, bool) {
	for _, p := range cfg.InitialCluster {
		if p.ID == cfg.ID {
			return p.Address, true
		}
	}
	return "", false
}

// advertiseAddr picks the address peers and clients reach this node at.
func advertiseAddr(cfg Config, bound net.Addr) (string, error) {
	if cfg.AdvertiseAddr != "" {
		return cfg.AdvertiseAddr, nil
	}
	if addr, ok := cfg.InitialAddress(); ok {
		return addr, nil
	}
	if tcp, ok := bound.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		return "", fmt.Errorf("--listen %s binds every interface: give --advertise HOST:PORT, the address other nodes and clients reach this node at", cfg.ListenAddr)
	}
	return bound.String(), nil
}

// claimDataDir records the node id in the data directory and refuses a
// directory that belongs to another node.
func claimDataDir(dir, id string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, "node.json")
	var rec struct {
		ID string `json:"id"`
	}
	if data, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if rec.ID != id {
			return fmt.Errorf("data directory %s belongs to node %q, not %q", dir, rec.ID, id)
		}
		return nil
	}
	rec.ID = id
	data, _ := json.Marshal(rec)
	return os.WriteFile(path, data, 0o644)
}

// ClusterID is derived from the bootstrap parameters, so every initial node
// computes the same one.
func ClusterID(peers []Peer, shards, rf int) string {
	h := fnv.New64a()
	for _, p := range peers {
		fmt.Fprintf(h, "%s=%s,", p.ID, p.Address)
	}
	fmt.Fprintf(h, "%d/%d", shards, rf)
	return strconv.FormatUint(h.Sum64(), 16)
}

// initialMap is the map a new cluster starts with (InitialMap), nil
// without InitialCluster.
func initialMap(cfg Config) *metapb.ClusterMap {
	if len(cfg.InitialCluster) == 0 {
		return nil
	}
	return InitialMap(ClusterID(cfg.InitialCluster, cfg.Shards, cfg.Replicas), cfg.InitialCluster, cfg.Shards, cfg.Replicas)
}

// startGroups opens the meta group and every shard this node has on disk, and
// bootstraps a new cluster from InitialCluster.
func (n *Node) startGroups() error {
	var err error
	if n.raftLog, err = nodelog.Open(filepath.Join(n.cfg.DataDir, "raftlog"), nodelog.Options{
		Logger: n.cfg.Logger.With("node", n.cfg.ID, "component", "raftlog"),
		OnSync: n.metrics.observeSync,
		// A small data disk starts with segments filled only in part.
		DiskFree: n.disk.measure,
	}); err != nil {
		return fmt.Errorf("open the node's Raft log: %w", err)
	}
	stateLog := n.cfg.Logger.With("node", n.cfg.ID, "component", "state")
	db, err := openState(n.cfg, stateLog)
	if err != nil {
		return err
	}
	n.state = &stateStore{dataDir: n.cfg.DataDir, memoryLimit: n.cfg.MemoryLimit, log: stateLog, db: db}
	if n.metaGroup, err = openGroup(MetaGroupID, n.cfg.DataDir, n.cfg.ID, n.meta, n.mux, n.cfg.Tuning, nil, nil, quiet(&n.stopping, n.log.With("group", "meta"))); err != nil {
		return err
	}
	n.metaLead.raft, n.metaLead.applyTimeout = n.metaGroup.raft, n.cfg.Tuning.ApplyTimeout
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.metaLead.watch(n.stop)
	}()
	// Bootstrap from --initial-cluster only a node that never started:
	// on a restart the map decides which replicas live here (a shard of
	// the initial map may have been removed since, or moved to other
	// nodes, and a replica bootstrapped again from the flags would be a
	// group of the old configuration). The shards go first and the meta
	// group last, so that a node whose meta group has state bootstrapped
	// all of them, even if it crashed half-way the first time.
	init := initialMap(n.cfg)
	if init != nil {
		if control.FindNode(init, n.cfg.ID) == nil {
			return fmt.Errorf("node %q is not in --initial-cluster", n.cfg.ID)
		}
	}
	if init != nil && !n.metaGroup.existing {
		for _, s := range init.Shards {
			if !slices.Contains(s.Replicas, n.cfg.ID) {
				continue
			}
			var servers []raft.Server
			for _, r := range s.Replicas {
				servers = append(servers, raft.Server{ID: raft.ServerID(r), Address: raft.ServerAddress(control.FindNode(init, r).Address)})
			}
			sh, err := n.openShard(s.Id)
			if errors.Is(err, ErrDiverged) {
				continue
			}
			if err != nil {
				return err
			}
			if err := sh.g.bootstrap(servers); err != nil {
				return fmt.Errorf("bootstrap shard %d: %w", s.Id, err)
			}
		}
		var servers []raft.Server
		for _, p := range init.Nodes {
			servers = append(servers, raft.Server{ID: raft.ServerID(p.Id), Address: raft.ServerAddress(p.Address)})
		}
		if err := n.metaGroup.bootstrap(servers); err != nil {
			return fmt.Errorf("bootstrap meta group: %w", err)
		}
	}
	// Shards on disk from an earlier run (or added later).
	entries, _ := os.ReadDir(filepath.Join(n.cfg.DataDir, "shards"))
	for _, e := range entries {
		id, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil || !e.IsDir() {
			continue
		}
		if _, err := os.Stat(retiredMark(n.cfg.DataDir, uint32(id))); err == nil {
			// Retired here once: a stop that cut the retirement short
			// left its directory (the shard may be gone from the map),
			// or the map placed it here again, and then reconcileShards
			// opens it once the meta group has the map.
			n.log.Info("not starting a replica retired here before until the map places it here", "shard", id)
			continue
		}
		if _, err := n.openShard(uint32(id)); err != nil && !errors.Is(err, ErrDiverged) {
			return err
		}
	}
	return nil
}

// openShard starts the local replica of a shard unless it runs already.
func (n *Node) openShard(id uint32) (*Shard, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, ErrShutdown
	}
	if s := n.shards[id]; s != nil {
		return s, nil
	}
	if n.diverged[id] != nil {
		return nil, fmt.Errorf("shard %d: %w", id, ErrDiverged)
	}
	// A replica that diverged before a restart stays stopped.
	if rec, err := readDivergedMarker(groupDir(n.cfg.DataDir, id), id); rec != nil {
		n.diverged[id] = rec
		n.log.Error("not starting a replica that diverged from its shard's majority: it serves nothing until rebuilt with `taskctl shard rebuild`",
			"shard", id, "index", rec.Index, "digest", rec.Digest, "majority_digest", rec.MajorityDigest,
			"majority", strings.Join(rec.Majority, ","), "detected", rec.Detected, "marker_err", err,
			"marker", filepath.Join(groupDir(n.cfg.DataDir, id), divergedMarker))
		return nil, fmt.Errorf("shard %d: %w", id, ErrDiverged)
	}
	s, err := newShard(id, n.cfg.Clock, n.cfg.Tuning, n.log, func(opts fsm.Options) (*fsm.Machine, error) {
		return n.state.newMachine(id, opts)
	})
	if err != nil {
		n.diverged[id] = &divergenceRecord{Shard: id, Damaged: err.Error(), Detected: time.Now()}
		n.log.Error("not starting a replica whose state will not open: it serves and votes nothing until rebuilt with `taskctl shard rebuild`",
			"shard", id, "err", err, "dir", stateDir(n.cfg.DataDir))
		return nil, fmt.Errorf("shard %d: %w: %w", id, ErrDiverged, err)
	}
	s.leaderHint = func(shard uint32, id raft.ServerID, addr raft.ServerAddress) *NotLeaderError {
		return leaderHint(n.cfg.ID, shard, id, addr)
	}
	s.mayNotLead = func() string { return mayNotLead(n.clock, n.disk) }
	s.beforeReady = func() { n.format.onElection(s) }
	s.budget = n.memory.forShard
	label := shardLabel(id)
	s.applySeconds = n.metrics.applySeconds.WithLabelValues(label)
	s.leaderChanges = n.metrics.leaderChanges.WithLabelValues(label)
	s.proposedRequests = n.metrics.proposedRequests.WithLabelValues(label)
	s.proposedEntries = n.metrics.proposedEntries.WithLabelValues(label)
	s.emptyClaims = n.metrics.emptyClaims.WithLabelValues(label)
	s.scheduleTicks = n.metrics.scheduleTicks
	snapshotSeconds := n.metrics.snapshotSeconds.WithLabelValues(label)
	timed := timedFSM{Machine: s.machine, observe: func(d time.Duration) { snapshotSeconds.Observe(d.Seconds()) }}
	var markers *fsm.Machine
	if n.state.db != nil {
		markers = s.machine
	}
	g, err := openGroup(id, n.cfg.DataDir, n.cfg.ID, timed, n.mux, n.cfg.Tuning, n.raftLog.Group(id), markers, quiet(&n.stopping, n.log.With("shard", id)))
	if err != nil {
		// One replica whose files will not open must not keep the node's
		// other replicas down: it stays stopped, shown like a diverged
		// one, until rebuilt from its peers.
		n.diverged[id] = &divergenceRecord{Shard: id, Damaged: err.Error(), Detected: time.Now()}
		n.log.Error("not starting a replica whose files are damaged: it serves and votes nothing until rebuilt with `taskctl shard rebuild`",
			"shard", id, "err", err, "dir", groupDir(n.cfg.DataDir, id))
		s.machine.Close()
		return nil, fmt.Errorf("shard %d: %w: %w", id, ErrDiverged, err)
	}
	s.start(g)
	n.shards[id] = s
	n.localShards.Store(int32(len(n.shards)))
	return s, nil
}

func (n *Node) abort() {
	n.mu.Lock()
	n.closed = true
	shards := n.shards
	n.mu.Unlock()
	close(n.stop)
	for _, s := range shards {
		s.close()
	}
	if n.metaGroup != nil {
		n.metaGroup.shutdown()
	}
	if n.raftLog != nil {
		n.raftLog.Close()
	}
	if n.state != nil {
		n.state.close()
	}
	if n.gossip != nil {
		n.gossip.leave(false)
	}
	n.mux.Close()
	n.wg.Wait()
	n.peers.close()
}

// loop runs f in the background until the node stops.
func (n *Node) loop(f func()) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		f()
	}()
}

// sleepUntil waits d and reports true, or false as soon as stop closes.
func sleepUntil(stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}

// ID is the node id.
func (n *Node) ID() string { return n.cfg.ID }

// Clock is the node's clock (Config.Clock).
func (n *Node) Clock() time.Time { return n.cfg.Clock() }

// Addr is the address the node serves gRPC and Raft on.
func (n *Node) Addr() string { return n.addr }

// GRPCListener is where the gRPC server must Serve.
func (n *Node) GRPCListener() net.Listener { return n.mux.GRPCListener() }

// Map returns the current cluster map.
func (n *Node) Map() *metapb.ClusterMap { return n.meta.Map() }

// Shard returns the local replica of a shard, if this node hosts one.
func (n *Node) Shard(id uint32) *Shard {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.shards[id]
}

// LocalShards returns the shards this node hosts, by id.
func (n *Node) LocalShards() []*Shard {
	n.mu.RLock()
	defer n.mu.RUnlock()
	out := make([]*Shard, 0, len(n.shards))
	for _, s := range n.shards {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *Shard) int { return int(a.id) - int(b.id) })
	return out
}

// ShardFor returns the local replica of the shard that owns a consistency
// group. When this node hosts no replica of it, the error is a
// *NotLeaderError whose address is one of the shard's replicas.
func (n *Node) ShardFor(group string) (*Shard, error) {
	id := n.meta.ShardOf(group)
	if id == 0 {
		return nil, ErrNotReady
	}
	return n.ShardByID(id)
}

// ShardByID is ShardFor by shard id.
func (n *Node) ShardByID(id uint32) (*Shard, error) {
	n.mu.RLock()
	s, diverged := n.shards[id], n.diverged[id] != nil
	n.mu.RUnlock()
	if s != nil {
		return s, nil
	}
	if diverged {
		return nil, divergedError(n.meta.Map(), n.cfg.ID, id)
	}
	cm := n.meta.Map()
	if len(cm.Shards) == 0 {
		return nil, ErrNotReady
	}
	sh := control.FindShard(cm, id)
	if sh == nil {
		return nil, fmt.Errorf("%w: %d", ErrUnknownShard, id)
	}
	// Not hosted here: point at a replica, which knows the leader (the
	// preferred one, which most likely is the leader).
	e := &NotLeaderError{Shard: id}
	for _, r := range append([]string{sh.PreferredLeader}, sh.Replicas...) {
		if node := control.FindNode(cm, r); node != nil {
			e.LeaderID, e.LeaderAddress, e.Replica = node.Id, node.Address, true
			break
		}
	}
	return nil, e
}

// leaderHint is the NotLeaderError a caller of node self gets: never one
// naming self, which raft reports as leader while a leadership transfer it
// started refuses every write (a client told to retry here would only come
// back).
func leaderHint(self string, shard uint32, id raft.ServerID, addr raft.ServerAddress) *NotLeaderError {
	if string(id) == self {
		return &NotLeaderError{Shard: shard}
	}
	return &NotLeaderError{Shard: shard, LeaderID: string(id), LeaderAddress: string(addr)}
}

// Close hands off leaderships, leaves gossip and stops every group. In-flight
// proposals end with ErrUnknownOutcome or complete.
func (n *Node) Close(ctx context.Context) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	shards := make([]*Shard, 0, len(n.shards))
	for _, s := range n.shards {
		shards = append(shards, s)
	}
	n.mu.Unlock()
	n.stopping.Store(true)
	if !n.noHandOff.Load() {
		n.HandOff(ctx)
	}
	close(n.stop)

	n.gossip.leave(ctx.Err() == nil)
	var errs []error
	for _, s := range shards {
		errs = append(errs, s.close())
	}
	errs = append(errs, n.metaGroup.shutdown())
	errs = append(errs, n.raftLog.Close())
	errs = append(errs, n.state.close())
	n.mux.Close()
	n.wg.Wait()
	n.peers.close()
	n.log.Info("node stopped")
	return errors.Join(errs...)
}

// BeginStop marks the node as stopping. From now on, what raft and gossip
// report of peers that vanish logs at DEBUG: a stop makes them, and they
// are not for an operator to act on. Without handOff, Shutdown and Close
// do not hand leaderships to other replicas either: the whole cluster is
// stopping, and hand-offs to stopping peers would only fail.
func (n *Node) BeginStop(handOff bool) {
	n.stopping.Store(true)
	if !handOff {
		n.noHandOff.Store(true)
	}
}

// HandsOff reports whether stopping hands leaderships off (BeginStop).
func (n *Node) HandsOff() bool { return !n.noHandOff.Load() }

// quiet wraps a logger for parts whose warnings a stop makes (BeginStop
// sets stopping).
func quiet(stopping *atomic.Bool, l *slog.Logger) *slog.Logger {
	return slog.New(stopQuiet{Handler: l.Handler(), stopping: stopping})
}

// HandOff transfers every leadership this node holds to another replica, so
// that a stop does not wait for an election timeout.
func (n *Node) HandOff(ctx context.Context) {
	var wg sync.WaitGroup
	transfer := func(r *raft.Raft, what string) {
		defer wg.Done()
		if r.State() != raft.Leader {
			return
		}
		if err := waitFuture(ctx, r.LeadershipTransfer()); err != nil {
			n.log.Warn("leadership hand-off failed", "group", what, "err", err)
		}
	}
	for _, s := range n.LocalShards() {
		wg.Add(1)
		go transfer(s.g.raft, strconv.Itoa(int(s.id)))
	}
	wg.Add(1)
	go transfer(n.metaGroup.raft, "meta")
	wg.Wait()
}

// waitFuture waits for a raft future or the context.
func waitFuture(ctx context.Context, f raft.Future) error {
	err, stopped := awaitFuture(ctx, nil, f)
	if stopped != nil {
		return stopped
	}
	return err
}

// awaitFuture waits for f's answer (err), or until ctx ends or stop is
// closed (stopped: ctx's error, or ErrShutdown). A raft future may never
// answer once its group shuts down (hashicorp/raft#498), so nothing here
// waits on one without a way out: a goroutine that did kept a node's Close
// waiting for good (a chaos run hung 12 minutes in CI). stop may be nil.
func awaitFuture(ctx context.Context, stop <-chan struct{}, f raft.Future) (err, stopped error) {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-stop:
		return nil, ErrShutdown
	}
}

// reconcileShards starts local replicas the map assigns to this node and
// warns when the map disagrees with this node's bootstrap flags.
func (n *Node) reconcileShards() {
	warned := false
	for {
		changed := n.meta.Changed()
		cm := n.meta.Map()
		// Only a node bootstrapped in this run built replicas from its
		// flags; on a restart they are ignored (startGroups).
		if init := initialMap(n.cfg); init != nil && !n.metaGroup.existing && cm.ClusterId != "" && cm.ClusterId != init.ClusterId && !warned {
			n.log.Error("cluster map was bootstrapped with other --initial-cluster/--shards/--replicas flags than this node's; the map wins",
				"map_cluster", cm.ClusterId, "flags_cluster", init.ClusterId)
			warned = true
		}
		for _, s := range cm.Shards {
			if !slices.Contains(s.Replicas, n.cfg.ID) {
				continue
			}
			local := n.Shard(s.Id)
			if local == nil {
				if epoch, retired := retiredEpoch(n.cfg.DataDir, s.Id); retired && cm.Epoch <= epoch {
					// A map from before this node retired the replica
					// (restored or replayed at a restart): not a
					// placement, or the removed shard would be back.
					continue
				}
				var err error
				if local, err = n.openShard(s.Id); err != nil {
					if !errors.Is(err, ErrShutdown) && !errors.Is(err, ErrDiverged) {
						n.log.Error("start shard replica", "shard", s.Id, "err", err)
					}
					continue
				}
			}
			n.bootstrapNewShard(cm, s, local)
		}
		select {
		case <-changed:
		case <-n.stop:
			return
		}
	}
}
