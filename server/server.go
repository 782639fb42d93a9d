// Package server assembles a node: the cluster node (cluster.Start), its
// gRPC API (rpc), and its HTTP endpoints (/metrics, /healthz, /readyz, the
// status page, /debug/pprof). taskstored and the test harness use it;
// clients and proxies never link it (cmd/deps_test.go checks).
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/e1158ecb/taskstore/api/limits"
	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/auth"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/internal/serving"
	"github.com/e1158ecb/taskstore/internal/tracing"
	"github.com/e1158ecb/taskstore/rpc"
	"github.com/e1158ecb/taskstore/rpc/pprofhttp"
	"github.com/e1158ecb/taskstore/rpc/statuspage"
)

// Node is a running node: the cluster node, its gRPC server and its
// HTTP endpoints (/metrics, /healthz, /readyz, /debug/pprof).
type Node struct {
	Node *cluster.Node
	RPC  *rpc.Server
	GRPC *grpc.Server
	HTTP *http.Server
	// Registry holds the node's metrics, served on /metrics.
	Registry *prometheus.Registry
	// HTTPAddr is the bound HTTP address (empty without one).
	HTTPAddr string
	log      *slog.Logger
}

// Options are the serving options of a node beyond its cluster.Config.
type Options struct {
	// Policy authenticates and authorizes every call; nil or a disabled
	// policy lets every caller do everything (TLS, if on, only encrypts).
	Policy *auth.Policy
	// Limits bound message sizes, concurrent streams and, optionally, each
	// client's call rate; zero fields take DefaultLimits'.
	Limits limits.Server
	// GRPC options are added to the server's.
	GRPC []grpc.ServerOption
	// Pprof serves /debug/pprof on the HTTP address. Off by default: a
	// profile shows memory contents and /debug/pprof/cmdline the flags.
	Pprof bool
}

// Start starts a node and serves it. cfg.HTTPAddr, when set, is
// listened on for the HTTP endpoints. With cfg.TLS the gRPC server speaks
// TLS (terminated by the node's listener, shared with Raft).
func Start(cfg cluster.Config, no Options) (*Node, error) {
	opts := append(no.Limits.ServerOptions(), no.GRPC...)
	opts = append(opts, taskstorepb.ServerCodec()) // with RegisterTaskStore: undecodable requests are InvalidArgument
	opts = append(opts, serving.ReusedWorkers())
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	var httpL net.Listener
	if cfg.HTTPAddr != "" {
		var err error
		if httpL, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			return nil, fmt.Errorf("listen on --http %s: %w", cfg.HTTPAddr, err)
		}
		cfg.HTTPAddr = httpL.Addr().String()
		if cfg.TLS != nil {
			// The status page needs a credential when the policy is on,
			// and credentials do not cross the network in the clear.
			httpL = tls.NewListener(httpL, serving.HTTPTLS(cfg.TLS))
		}
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	cfg.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	grpcMetrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	cfg.Registry.MustRegister(grpcMetrics)
	opts = append(opts, grpc.ChainUnaryInterceptor(grpcMetrics.UnaryServerInterceptor()), grpc.ChainStreamInterceptor(grpcMetrics.StreamServerInterceptor()))
	if no.Policy.Enabled() {
		// After the metrics interceptor, so refusals are counted by code.
		opts = append(opts, grpc.ChainUnaryInterceptor(no.Policy.UnaryServerInterceptor()), grpc.ChainStreamInterceptor(no.Policy.StreamServerInterceptor()))
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(auth.AcceptedTLS()))
	}
	opts = append(opts, serving.Keepalive())
	opts = append(opts, tracing.ServerOptions()...) // none unless the process turned tracing on
	node, err := cluster.Start(cfg)
	if err != nil {
		if httpL != nil {
			httpL.Close()
		}
		return nil, err
	}
	ns := &Node{Node: node, RPC: rpc.NewServer(node, cfg.Registry, log.With("node", cfg.ID)), GRPC: grpc.NewServer(opts...), Registry: cfg.Registry,
		log: log.With("component", "server", "node", cfg.ID)}
	ns.RPC.SetLimits(no.Limits)
	ns.RPC.Register(ns.GRPC)
	grpcMetrics.InitializeMetrics(ns.GRPC)
	ns.RPC.SetServing(true)
	go func() {
		if err := ns.GRPC.Serve(node.GRPCListener()); err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, net.ErrClosed) {
			ns.log.Warn("grpc server stopped", "err", err)
		}
	}()
	if httpL != nil {
		ns.HTTPAddr = httpL.Addr().String()
		ns.HTTP = &http.Server{Handler: ns.httpHandler(no), ReadHeaderTimeout: 10 * time.Second}
		go ns.HTTP.Serve(httpL)
	}
	return ns, nil
}

// httpHandler serves /metrics, /healthz and /readyz to anyone (Prometheus
// and load balancers probe them), /debug/pprof only with no.Pprof (to admins
// when the policy is on), and the
// status page (task values included) to admins when the policy is on; its
// actions are offered to authenticated admins only, so a node without a
// policy serves it read-only.
func (ns *Node) httpHandler(no Options) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(ns.Registry, promhttp.HandlerOpts{Registry: ns.Registry}))
	serving.HealthHandlers(mux, ns.Ready)
	if no.Pprof {
		pprofhttp.Register(mux, no.Policy)
	}
	mux.Handle("/", no.Policy.RequireAdminHTTP(statuspage.New(ns.Node, ns.RPC, statuspage.Options{Logger: ns.log, Actions: rpc.PageActions(ns.RPC)})))
	return mux
}

// Ready reports whether the node is a member of a cluster whose map it knows,
// caught up with the meta group since the node started, and every shard it
// hosts has a leader.
func (ns *Node) Ready() error {
	cm := ns.Node.Map()
	if cm.ClusterId == "" {
		return errors.New("cluster map not known yet")
	}
	if err := ns.Node.MetaCaughtUp(); err != nil {
		return err
	}
	for _, s := range ns.Node.LocalShards() {
		if addr, _ := s.Raft().LeaderWithID(); addr == "" {
			return fmt.Errorf("shard %d has no leader", s.ID())
		}
	}
	return nil
}

// Shutdown stops gracefully: health goes NOT_SERVING, leaderships are handed
// off, in-flight requests finish (bounded by ctx), then the node stops.
func (ns *Node) Shutdown(ctx context.Context) error {
	ns.log.Info("shutting down")
	ns.RPC.SetServing(false)
	handOff := ns.Node.HandsOff()
	ns.Node.BeginStop(handOff)
	if handOff {
		ns.Node.HandOff(ctx)
	}
	stopped := make(chan struct{})
	go func() {
		ns.GRPC.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		ns.GRPC.Stop()
	}
	if ns.HTTP != nil {
		ns.HTTP.Shutdown(ctx)
	}
	return ns.Node.Close(ctx)
}

// ShutdownCluster stops nodes that make up a whole cluster (the dev
// cluster, a test's) together: no node hands its leaderships to another
// that is stopping too, and none logs the others' going as a fault.
func ShutdownCluster(ctx context.Context, nodes ...*Node) error {
	for _, ns := range nodes {
		ns.Node.BeginStop(false)
	}
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, ns := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = ns.Shutdown(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Kill stops the node at once, without hand-off (tests).
func (ns *Node) Kill() {
	ns.GRPC.Stop()
	if ns.HTTP != nil {
		ns.HTTP.Close()
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ns.Node.Close(ctx)
}
