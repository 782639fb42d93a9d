// Command taskstored runs a Taskstore node.
//
// Start-up, in order: parse flags, set up logging, start the node (open the
// data directory, the meta group and every local shard; bootstrap a new
// cluster from --initial-cluster; start gossip), serve gRPC on --listen and
// HTTP on --http, then wait for SIGINT/SIGTERM and stop gracefully: health
// NOT_SERVING, leaderships handed off, in-flight requests finished.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/cmd/internal/buildinfo"
	"github.com/e1158ecb/taskstore/cmd/internal/gcpercent"
	"github.com/e1158ecb/taskstore/cmd/internal/logging"
	"github.com/e1158ecb/taskstore/cmd/internal/secflags"
	"github.com/e1158ecb/taskstore/internal/tracing"
	"github.com/e1158ecb/taskstore/server"
)

const defaultShutdown = 15 * time.Second

// defaultListen is --listen when neither it nor this node's --initial-cluster
// entry says where to listen.
const defaultListen = "127.0.0.1:7101"

type flags struct {
	id, dataDir, listen, gossip, http string
	advertise                         string
	initialCluster                    string
	stateStore                        string
	join                              []string
	shards, replicas                  int
	timeoutScale                      float64
	maxClockOffset                    time.Duration
	minFreeDisk                       string
	memoryLimit                       string
	pprof                             bool
	memorySource                      string // where the memory limit came from (config)
	logLevel, logFormat               string
	shutdownTimeout                   time.Duration
	sec                               secflags.Server
}

func main() {
	if err := rootCmd().Execute(); err != nil {
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	var f flags
	cmd := &cobra.Command{
		Use:   "taskstored --id ID --data-dir DIR --listen ADDR --gossip ADDR --http ADDR (--initial-cluster LIST | --join ADDR)",
		Short: "Run a Taskstore node",
		Long: `taskstored runs one node of a Taskstore cluster.

A node hosts the meta group (the cluster map) and a replica of each shard
placed on it; every shard is a Raft group. Clients, admin calls and Raft
traffic between nodes share the --listen port; gossip (memberlist) uses
--gossip over TCP and UDP; --http serves /metrics, /healthz, /readyz and pprof.

A new cluster: start every initial node with the same --initial-cluster,
--shards and --replicas. Restart a node with the same --id and --data-dir to
bring it back with its data. A node started later with --join waits, visible
in 'taskctl status', until an operator adds it.`,
		Example: `  # a three-node cluster on one machine
  taskstored --id n1 --data-dir data/n1 --listen 127.0.0.1:7101 --gossip 127.0.0.1:7201 --http 127.0.0.1:7301 \
    --initial-cluster n1=127.0.0.1:7101,n2=127.0.0.1:7102,n3=127.0.0.1:7103
  # (n2 and n3 alike, with their own ports and data directories)

  # a local 3-node cluster and a proxy, for trying it out (make run)
  taskstored dev`,
		Version:       buildinfo.Version,
		SilenceUsage:  true,
		SilenceErrors: false,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := logging.New(os.Stderr, f.logLevel, f.logFormat)
			if err != nil {
				return err
			}
			cfg, err := f.config(log)
			if err != nil {
				return err
			}
			soft, fromEnv := setGoMemoryLimit(cfg.MemoryLimit)
			gcPercent, gcFromEnv := gcpercent.Set()
			log.Info("memory limit", "limit_bytes", cfg.MemoryLimit, "from", f.memorySource, "go_soft_limit_bytes", soft, "from_GOMEMLIMIT", fromEnv,
				"gc_percent", gcPercent, "from_GOGC", gcFromEnv)
			sec, err := f.sec.Load(log, true)
			if err != nil {
				return err
			}
			cfg.TLS, cfg.PeerTLS, cfg.GossipKeys, cfg.ClusterName = sec.ServerTLS, sec.PeerTLS, sec.GossipKeys, f.sec.ClusterName
			return run(log, f.shutdownTimeout, nil, server.Options{Policy: sec.Policy, Limits: f.sec.Limits(), Pprof: f.pprof}, cfg)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.id, "id", "", "node id, unique in the cluster and stable across restarts (required)")
	fl.StringVar(&f.dataDir, "data-dir", "", "directory for this node's Raft logs and snapshots (required)")
	fl.StringVar(&f.listen, "listen", "", "gRPC address for clients, admin and Raft traffic (multiplexed) (default: this node's --initial-cluster entry, else "+defaultListen+")")
	fl.StringVar(&f.advertise, "advertise", "", "gRPC address other nodes and clients reach this node at (default: its --initial-cluster entry, else --listen); needed when --listen is 0.0.0.0")
	fl.StringVar(&f.gossip, "gossip", "127.0.0.1:7201", "memberlist address, TCP and UDP (a host name is resolved to its IP)")
	fl.StringVar(&f.http, "http", "127.0.0.1:7301", "HTTP address for /metrics /healthz /readyz and the status page (HTTPS with --tls-cert; the status page then needs an admin credential); empty disables")
	fl.BoolVar(&f.pprof, "pprof", false, "serve /debug/pprof on --http (profiles show memory contents: keep --http private)")
	fl.StringVar(&f.initialCluster, "initial-cluster", "", "bootstrap only: every initial node as id=listen-address, comma-separated, the same on each node")
	fl.StringSliceVar(&f.join, "join", nil, "gossip address of a running node: join and wait for 'taskctl node add'")
	fl.IntVar(&f.shards, "shards", 0, "bootstrap only: number of shards (Raft groups); 0: one per --initial-cluster node, so each leads one (add more on a live cluster: taskctl shard add)")
	fl.IntVar(&f.replicas, "replicas", 3, "bootstrap only: replicas per shard (capped by cluster size)")
	fl.Float64Var(&f.timeoutScale, "raft-timeout-scale", 1, "multiply Raft timeouts (raise on overloaded machines to avoid spurious elections)")
	fl.DurationVar(&f.maxClockOffset, "max-clock-offset", cluster.DefaultTuning().MaxClockOffset, "how far this node's clock may be from most of its peers' before it refuses to lead (log time is the leader's clock and never goes back); 0 turns the check off")
	fl.StringVar(&f.minFreeDisk, "min-free-disk", "256MiB", "free space of the --data-dir file system below which this node refuses to lead and hands its leaderships away (it keeps following); bytes, or with KiB, MiB, GiB; 0 turns the check off")
	fl.StringVar(&f.memoryLimit, "memory-limit", "", "memory this node may use, e.g. 2GiB (0: no limit); default: its container's or cgroup's limit, else half the machine's memory. "+
		"With --state memory 40% of it holds the tasks, split between the shards hosted here: past a shard's share its inserts are refused (RESOURCE_EXHAUSTED) until claims, deletes or purges make room; "+
		"with --state disk it sizes the engine's caches. Go's garbage collector gets 90% of it as its soft limit (GOMEMLIMIT wins); it collects when the heap has grown by "+strconv.Itoa(gcpercent.Default)+"% (GOGC wins)")
	fl.StringVar(&f.stateStore, "state", cluster.DefaultStateStore, "where shards keep their tasks: disk (one engine per node under --data-dir/state; memory holds a record per queue) or memory (every task in memory, rebuilt from the latest snapshot and the log at start); a node may switch between them across a restart")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.logFormat, "log-format", "text", "text or json")
	fl.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long a graceful stop may take")
	f.sec.Register(fl, true)
	cmd.AddCommand(devCmd(), restoreCmd())
	return cmd
}

func (f *flags) config(log *slog.Logger) (cluster.Config, error) {
	if f.id == "" {
		return cluster.Config{}, fmt.Errorf("--id is required")
	}
	if f.dataDir == "" {
		return cluster.Config{}, fmt.Errorf("--data-dir is required")
	}
	peers, err := parseInitialCluster(f.initialCluster)
	if err != nil {
		return cluster.Config{}, err
	}
	if f.shards < 0 || f.shards > cluster.MaxShards {
		return cluster.Config{}, fmt.Errorf("--shards %d: must be between 1 and %d (0: one per --initial-cluster node)", f.shards, cluster.MaxShards)
	}
	if f.replicas < 1 {
		return cluster.Config{}, fmt.Errorf("--replicas %d: must be at least 1", f.replicas)
	}
	switch f.stateStore {
	case "", cluster.StateOnDisk, cluster.StateInMemory: // "": the default
	default:
		return cluster.Config{}, fmt.Errorf("--state %q: want %s or %s", f.stateStore, cluster.StateOnDisk, cluster.StateInMemory)
	}
	if f.timeoutScale <= 0 {
		return cluster.Config{}, fmt.Errorf("--raft-timeout-scale must be positive")
	}
	if f.maxClockOffset < 0 {
		return cluster.Config{}, fmt.Errorf("--max-clock-offset %v: must not be negative", f.maxClockOffset)
	}
	tuning := cluster.DefaultTuning().Scaled(f.timeoutScale)
	tuning.MaxClockOffset = f.maxClockOffset
	if f.minFreeDisk != "" {
		b, err := parseBytes(f.minFreeDisk)
		if err != nil {
			return cluster.Config{}, fmt.Errorf("--min-free-disk %q: %w", f.minFreeDisk, err)
		}
		tuning.MinFreeDisk = b
	}
	memoryLimit, source, err := resolveMemoryLimit(f.memoryLimit)
	if err != nil {
		return cluster.Config{}, err
	}
	f.memorySource = source
	cfg := cluster.Config{
		ID: f.id, DataDir: f.dataDir, ListenAddr: f.listen, AdvertiseAddr: f.advertise, GossipAddr: f.gossip, HTTPAddr: f.http,
		InitialCluster: peers, Join: f.join, Shards: f.shards, Replicas: f.replicas,
		Tuning: tuning, Logger: log, StateStore: f.stateStore, MemoryLimit: memoryLimit,
	}
	if cfg.ListenAddr == "" {
		// Where the other nodes will dial it: listening anywhere else (the
		// old fixed default) left a node unreachable at the address it
		// advertises, and several on one machine fighting for 7101.
		var ok bool
		if cfg.ListenAddr, ok = cfg.InitialAddress(); !ok {
			cfg.ListenAddr = defaultListen
		}
	}
	return cfg, nil
}

// parseInitialCluster reads "n1=addr,n2=addr".
func parseInitialCluster(s string) ([]cluster.Peer, error) {
	if s == "" {
		return nil, nil
	}
	var peers []cluster.Peer
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("--initial-cluster: %q is not id=address", part)
		}
		if seen[id] {
			return nil, fmt.Errorf("--initial-cluster: node %q named twice", id)
		}
		seen[id] = true
		peers = append(peers, cluster.Peer{ID: id, Address: addr})
	}
	return peers, nil
}

// run starts the nodes and blocks until a signal, then stops them
// gracefully. after, when set, runs once the nodes are up (dev starts its
// proxy there); the shutdown it returns runs before the nodes stop.
func run(log *slog.Logger, shutdownTimeout time.Duration, after func() (shutdown func(context.Context) error, err error), no server.Options, cfgs ...cluster.Config) error {
	shutdownTracing, err := tracing.Setup(context.Background(), "taskstored") // off unless OTEL_* asks
	if err != nil {
		return err
	}
	defer tracing.Flush(log, shutdownTracing)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// SIGUSR1: the whole cluster stops together (taskstored dev stops its
	// node processes so): no hand-offs to peers that are stopping too.
	clusterStop := make(chan os.Signal, 1)
	signal.Notify(clusterStop, syscall.SIGUSR1)
	defer signal.Stop(clusterStop)
	wholeCluster := false
	ctx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	go func() {
		select {
		case <-clusterStop:
			wholeCluster = true
			cancelRun()
		case <-ctx.Done():
		}
	}()
	var servers []*server.Node
	for _, cfg := range cfgs {
		cfg.Registry = prometheus.NewRegistry()
		cfg.Registry.MustRegister(buildinfo.Collector())
		ns, err := server.Start(cfg, no)
		if err != nil {
			for _, s := range servers {
				s.Kill()
			}
			return err
		}
		servers = append(servers, ns)
	}
	var shutdownAfter func(context.Context) error
	if after != nil {
		var err error
		if shutdownAfter, err = after(); err != nil {
			for _, s := range servers {
				s.Kill()
			}
			return err
		}
	}
	// A node removed from the cluster stops; the process exits (0) once
	// every node it runs has stopped or a signal came.
	removed := make(chan *server.Node, len(servers))
	for _, s := range servers {
		go func() {
			select {
			case <-s.Node.Removed():
				removed <- s
			case <-ctx.Done():
			}
		}()
	}
	for running := len(servers); running > 0 && ctx.Err() == nil; {
		select {
		case s := <-removed:
			sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
			if err := s.Shutdown(sctx); err != nil {
				log.Warn("shutdown", "node", s.Node.ID(), "err", err)
			}
			cancel()
			servers = slices.DeleteFunc(servers, func(x *server.Node) bool { return x == s })
			running--
			log.Info("node stopped: it was removed from the cluster", "node", s.Node.ID())
			for _, c := range cfgs {
				if c.ID == s.Node.ID() && c.DataDir != "" {
					// What `taskstored dev` reads to delete the directory.
					if err := os.WriteFile(filepath.Join(c.DataDir, removedMarker), []byte("removed from the cluster\n"), 0o644); err != nil {
						log.Warn("mark the data directory of a removed node", "node", c.ID, "err", err)
					}
				}
			}
		case <-ctx.Done():
		}
	}
	if len(servers) == 0 {
		if shutdownAfter != nil {
			sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
			defer cancel()
			shutdownAfter(sctx)
		}
		return nil
	}
	ids := make([]string, len(servers))
	for i, s := range servers {
		ids[i] = s.Node.ID()
	}
	log.Info("signal received, stopping", "node", strings.Join(ids, ","))
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if shutdownAfter != nil {
		if err := shutdownAfter(sctx); err != nil {
			log.Warn("shutdown", "err", err)
		}
	}
	if len(servers) > 1 || wholeCluster {
		// The whole cluster stops: stop the nodes together.
		if err := server.ShutdownCluster(sctx, servers...); err != nil {
			log.Warn("shutdown", "err", err)
		}
		return nil
	}
	for _, s := range servers {
		if err := s.Shutdown(sctx); err != nil {
			log.Warn("shutdown", "node", s.Node.ID(), "err", err)
		}
	}
	return nil
}

// parseBytes reads a size: a whole number of bytes, optionally followed by
// KiB, MiB or GiB (or KB, MB, GB, also powers of 1024, as df prints them).
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"B", 1}}
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range units {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("want a size such as 256MiB or 1GiB")
	}
	if v > (1<<62)/mult {
		return 0, fmt.Errorf("too large")
	}
	return v * mult, nil
}
