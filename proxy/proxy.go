package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/auth"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/internal/serving"
	"github.com/e1158ecb/taskstore/internal/tracing"
)

// DefaultRetryBudget is how long the proxy keeps retrying a request whose
// caller set no deadline.
const DefaultRetryBudget = 30 * time.Second

// Config says what a proxy serves and where it forwards.
type Config struct {
	// Cluster lists node addresses, comma-separated. Any one that answers
	// is enough: the rest are learnt from the routing table. Required.
	Cluster string
	// ListenAddr is the gRPC address ("127.0.0.1:0" picks a port), used
	// unless Listener is set.
	ListenAddr string
	Listener   net.Listener
	// HTTPAddr, when set, serves /metrics, /healthz, /readyz and the
	// HTTP/JSON API (/v1/...).
	HTTPAddr string
	// RetryBudget bounds the retries of a request whose caller set no
	// deadline (a waiting claim gets its wait on top). Default
	// DefaultRetryBudget. A caller's own deadline is always obeyed.
	RetryBudget time.Duration
	// ClientOptions are added to the options of the client the proxy
	// forwards with (e.g. client.WithBackoff, client.WithDialOptions).
	ClientOptions []client.Option
	// Version labels taskstore_build_info.
	Version string
	// GRPCOptions are passed to grpc.NewServer.
	GRPCOptions []grpc.ServerOption
	// TLS, when set, makes the gRPC listener TLS. The connection to the
	// nodes is configured through ClientOptions (client.WithTLS, with a
	// certificate of role proxy when the nodes check callers).
	TLS *tls.Config
	// Policy authenticates and authorizes callers as a node would, over
	// gRPC and HTTP/JSON alike; the caller's principal travels to the nodes
	// in auth.PrincipalHeader.
	Policy *auth.Policy
	// Pprof serves /debug/pprof on HTTPAddr. Off by default: a profile
	// shows memory contents and /debug/pprof/cmdline the flags.
	Pprof bool
	// AnswerMemory bounds the bytes of the answers the proxy holds at once
	// across all of its callers (from receipt until written to the
	// caller); an answer beyond it is refused with ResourceExhausted.
	// Default DefaultAnswerMemory.
	AnswerMemory int64
	// ProduceInflight bounds the Produce items the proxy forwards at once,
	// per caller's stream (ProduceInflightPerStream) and across all of
	// them (ProduceInflight): at a bound a stream is read no further until
	// an item is answered, so a fast producer is held back by the stream's
	// flow control instead of filling the proxy's memory. Defaults
	// DefaultProduceInflightPerStream and DefaultProduceInflight.
	ProduceInflightPerStream, ProduceInflight int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Server is a running proxy: the TaskStore and Admin services on a gRPC
// listener, optionally the HTTP endpoints, and the client that forwards.
// Its methods are safe for concurrent use.
type Server struct {
	taskstorepb.UnimplementedTaskStoreServer
	taskstorepb.UnimplementedAdminServer

	c       *client.Client
	produce *taskstorepb.Inflight // Config.ProduceInflight
	budget  time.Duration
	log     *slog.Logger
	metrics *metrics
	answers *answerBudget

	grpc     *grpc.Server
	health   *health.Server
	lis      net.Listener
	http     *http.Server // nil without an HTTP address
	httpAddr string

	ready    atomic.Bool // the routing table was read once
	stopWait context.CancelFunc
	waitDone chan struct{} // closed when the readiness loop ends

	// self is the HTTP gateway's connection to this proxy's own gRPC
	// server (selfConn); closeSelf closes it and its listener.
	self      *grpc.ClientConn
	closeSelf func()
	policy    *auth.Policy

	shutdownOnce sync.Once
	pprof        bool // serve /debug/pprof
}

func serverOptions(cfg Config, m *metrics, b *answerBudget) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		serving.Keepalive(),
		// The sizes clients and nodes agree on (taskstorepb/limits.go), so a
		// request a client may send is one the proxy reads and forwards.
		// cmd/taskproxy adds limits.Server (streams, rate) through GRPCOptions.
		grpc.MaxRecvMsgSize(taskstorepb.MaxMessageBytes),
		grpc.MaxSendMsgSize(taskstorepb.MaxResponseBytes),
		grpc.ChainUnaryInterceptor(m.grpcServer.UnaryServerInterceptor(), m.unary(), b.unary()),
		grpc.StatsHandler(b),
		grpc.ChainStreamInterceptor(m.grpcServer.StreamServerInterceptor()),
		serving.ReusedWorkers(),
		// With taskstorepb.RegisterTaskStore: a request that does not
		// decode is InvalidArgument, not Internal. Answers are encoded into
		// buffers that return their bytes to the answer budget once sent.
		grpc.ForceServerCodecV2(codec{taskstorepb.ServerCodecV2(), b}),
	}
	if cfg.Policy.Enabled() {
		opts = append(opts, grpc.ChainUnaryInterceptor(cfg.Policy.UnaryServerInterceptor()),
			grpc.ChainStreamInterceptor(cfg.Policy.StreamServerInterceptor()))
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	return opts
}

var (
	_ taskstorepb.TaskStoreServer = (*Server)(nil)
	_ taskstorepb.AdminServer     = (*Server)(nil)
)

// Start listens, connects to the cluster and serves until Shutdown. It does
// not wait for the cluster: requests that arrive before the routing table is
// known wait for it (within their budget), and /readyz and gRPC health say
// NOT_SERVING until it is. ctx bounds only the start.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Cluster == "" {
		return nil, errors.New("proxy: no cluster address given")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "proxy")
	budget := cfg.RetryBudget
	if budget <= 0 {
		budget = DefaultRetryBudget
	}
	lis := cfg.Listener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
			return nil, fmt.Errorf("proxy: listen on %s: %w", cfg.ListenAddr, err)
		}
	}
	var httpL net.Listener
	if cfg.HTTPAddr != "" {
		var err error
		if httpL, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			lis.Close()
			return nil, fmt.Errorf("proxy: listen on http %s: %w", cfg.HTTPAddr, err)
		}
	}
	m := newMetrics(cfg.Version)
	if cfg.ProduceInflightPerStream <= 0 {
		cfg.ProduceInflightPerStream = DefaultProduceInflightPerStream
	}
	if cfg.ProduceInflight <= 0 {
		cfg.ProduceInflight = DefaultProduceInflight
	}
	if cfg.AnswerMemory <= 0 {
		cfg.AnswerMemory = DefaultAnswerMemory
	}
	answers := newAnswerBudget(cfg.AnswerMemory)
	m.registerAnswers(answers)
	copts := append([]client.Option{client.WithLogger(log),
		client.WithDialOptions(grpc.WithChainUnaryInterceptor(m.grpcClient.UnaryClientInterceptor()),
			grpc.WithChainStreamInterceptor(m.grpcClient.StreamClientInterceptor()))}, cfg.ClientOptions...)
	c, err := client.DialPassthrough(ctx, cfg.Cluster, copts...)
	if err != nil {
		lis.Close()
		if httpL != nil {
			httpL.Close()
		}
		return nil, fmt.Errorf("proxy: %w", err)
	}
	m.registerStreams(c.OpenStreams)
	s := &Server{
		produce:  taskstorepb.NewInflight(cfg.ProduceInflightPerStream, cfg.ProduceInflight),
		c:        c,
		budget:   budget,
		log:      log,
		metrics:  m,
		grpc:     grpc.NewServer(append(append(serverOptions(cfg, m, answers), tracing.ServerOptions()...), cfg.GRPCOptions...)...),
		answers:  answers,
		policy:   cfg.Policy,
		pprof:    cfg.Pprof,
		health:   health.NewServer(),
		lis:      lis,
		waitDone: make(chan struct{}),
	}
	s.setServing(false)
	taskstorepb.RegisterTaskStore(s.grpc, s)
	taskstorepb.RegisterAdmin(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	m.grpcServer.InitializeMetrics(s.grpc)
	go func() {
		if err := s.grpc.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Warn("grpc server stopped", "err", err)
		}
	}()
	wctx, cancel := context.WithCancel(context.Background())
	s.stopWait = cancel
	go s.waitForRouting(wctx)
	if httpL != nil {
		s.httpAddr = httpL.Addr().String()
		if s.self, s.closeSelf, err = selfConn(s.grpc, cfg.TLS); err != nil {
			s.Close()
			httpL.Close()
			return nil, err
		}
		h, err := s.httpHandler()
		if err != nil {
			s.Close()
			httpL.Close()
			return nil, err
		}
		if cfg.TLS != nil {
			// Tokens and certificates do not cross the network in the
			// clear: --http is HTTPS whenever the gRPC port is TLS. A
			// certificate is optional here (tokens, /metrics, probes).
			httpL = tls.NewListener(httpL, serving.HTTPTLS(cfg.TLS))
		}
		s.http = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := s.http.Serve(httpL); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Warn("http server stopped", "err", err)
			}
		}()
	}
	s.log.Info("proxy started", "grpc", s.Addr(), "http", s.httpAddr, "cluster", cfg.Cluster, "answer_memory_mib", cfg.AnswerMemory>>20)
	return s, nil
}

// Addr is the gRPC address the proxy listens on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// HTTPAddr is the HTTP address, empty without one.
func (s *Server) HTTPAddr() string { return s.httpAddr }

// Client is the client the proxy forwards with.
func (s *Server) Client() *client.Client { return s.c }

// Ready reports whether the proxy has read the cluster's routing table.
func (s *Server) Ready() error {
	if !s.ready.Load() {
		return errors.New("routing table not known yet")
	}
	return nil
}

// waitForRouting reads the routing table until it succeeds once, then marks
// the proxy ready. Later changes are picked up by the client on demand (a
// leader hint or a failure makes it read the table again), not by polling.
func (s *Server) waitForRouting(ctx context.Context) {
	defer close(s.waitDone)
	pause := 100 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := s.c.Routing(actx)
		cancel()
		if err == nil {
			s.ready.Store(true)
			s.setServing(true)
			s.log.Info("routing table known: ready")
			return
		}
		s.log.Debug("routing table not known yet", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(pause*2, 2*time.Second)
	}
}

func (s *Server) setServing(ok bool) { serving.SetServing(s.health, ok) }

// Shutdown stops gracefully: health goes NOT_SERVING, new connections are
// refused, requests in flight finish (until ctx ends, when they are cut
// off), then the connections to the cluster close. A proxy keeps no state,
// so nothing is lost either way: callers retry elsewhere.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.shutdownOnce.Do(func() {
		s.log.Info("shutting down")
		s.setServing(false)
		s.health.Shutdown()
		s.stopWait()
		stopped := make(chan struct{})
		go func() {
			s.grpc.GracefulStop()
			close(stopped)
		}()
		if s.http != nil {
			if herr := s.http.Shutdown(ctx); herr != nil {
				s.http.Close()
			}
		}
		if s.closeSelf != nil {
			s.closeSelf() // after the HTTP server: its calls use it
		}
		select {
		case <-stopped:
		case <-ctx.Done():
			s.grpc.Stop()
			<-stopped
		}
		<-s.waitDone
		err = s.c.Close()
	})
	return err
}

// Close stops at once, cutting off requests in flight (tests).
func (s *Server) Close() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Shutdown(ctx)
}
