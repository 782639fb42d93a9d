package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/internal/tracing"
)

// Client talks to a Taskstore cluster, directly to shard leaders or through
// proxies. It is safe for concurrent use by many goroutines; make one per
// process and Close it when done.
type Client struct {
	seeds []string
	opts  options
	log   *slog.Logger

	// clientID is random per Client; request ids are clientID.session/seq.
	clientID string

	mu       sync.Mutex // guards conns, closed, sessions, nsessions
	conns    map[string]*grpc.ClientConn
	closed   bool
	sessions []*session // free sessions
	nsession int        // sessions created

	rt router

	// streams are the shared Produce streams.
	streams streamSet
}

type options struct {
	proxyOnly      bool
	streamIdle     time.Duration // WithStreamIdle
	dialOpts       []grpc.DialOption
	claimant       string
	backoffBase    time.Duration
	backoffMax     time.Duration
	attemptTimeout time.Duration
	maxHops        int
	logger         *slog.Logger
	tracer         trace.TracerProvider // nil: calls are not traced
}

// Option configures a Client.
type Option func(*options)

// WithProxyOnly sends every request to the given addresses as they are,
// without reading the routing table: for addresses that are taskproxy
// instances (or a load balancer in front of them). Retries with backoff still
// happen, rotating through the addresses.
func WithProxyOnly() Option { return func(o *options) { o.proxyOnly = true } }

// DefaultStreamIdle is how long a Produce stream to a node stays open
// with nothing in flight before the Client closes it (WithStreamIdle).
const DefaultStreamIdle = 2 * time.Minute

// WithStreamIdle closes a shared Produce stream to a node (ModifyStreamed,
// a Producer, a proxy's streams to the leaders) once nothing was in flight
// on it for d, so that a node that stopped leading, or a caller that went
// quiet, does not keep a stream and its goroutines open; the next request
// opens a new one. Default DefaultStreamIdle; d <= 0 keeps streams open.
func WithStreamIdle(d time.Duration) Option { return func(o *options) { o.streamIdle = d } }

// WithDirect(false) is WithProxyOnly; WithDirect(true), the default, routes
// each request to its shard's leader.
func WithDirect(direct bool) Option { return func(o *options) { o.proxyOnly = !direct } }

// WithDialOptions adds gRPC dial options to every connection, e.g.
// grpc.WithTransportCredentials for TLS. Without transport credentials among
// them, connections are insecure (plaintext).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// WithClaimant sets the claimant used by Claim and Modify requests that do
// not name one. The default is "<hostname>-<pid>".
func WithClaimant(name string) Option { return func(o *options) { o.claimant = name } }

// WithBackoff sets the first and the largest pause between retries (defaults
// 25ms and 2s). Each pause is drawn at random up to the current bound, which
// doubles after every retry (full jitter).
func WithBackoff(base, max time.Duration) Option {
	return func(o *options) { o.backoffBase, o.backoffMax = base, max }
}

// WithAttemptTimeout bounds one attempt of a call (default 10s), so that a
// node that stops answering is abandoned for another while the caller's
// context still has time. A Claim's attempt is also given its wait. Zero
// disables the bound.
func WithAttemptTimeout(d time.Duration) Option { return func(o *options) { o.attemptTimeout = d } }

// WithLogger logs retries and routing changes at debug level (default:
// nothing).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// Dial returns a Client for the cluster reachable at addrs, a comma-separated
// list of node (or, with WithProxyOnly, proxy) addresses. Unless proxy-only,
// it reads the routing table from the first address that answers within
// ctx. An unreachable cluster is not an error here, as with grpc.NewClient:
// the routing table is fetched again by the first call that needs it, and
// that call reports what went wrong. Dial fails on an empty address list or
// bad options.
func Dial(ctx context.Context, addrs string, opts ...Option) (*Client, error) {
	var seeds []string
	for _, a := range strings.Split(addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			seeds = append(seeds, a)
		}
	}
	if len(seeds) == 0 {
		return nil, fmt.Errorf("taskstore: dial: no address given: %w", ErrInvalid)
	}
	o := options{streamIdle: DefaultStreamIdle,
		backoffBase:    25 * time.Millisecond,
		backoffMax:     2 * time.Second,
		attemptTimeout: 10 * time.Second,
		maxHops:        3,
	}
	for _, opt := range opts {
		opt(&o)
	}
	if o.backoffBase <= 0 || o.backoffMax < o.backoffBase {
		return nil, fmt.Errorf("taskstore: dial: bad backoff %v..%v: %w", o.backoffBase, o.backoffMax, ErrInvalid)
	}
	if o.tracer == nil {
		o.tracer = tracing.TracerProvider() // nil unless the process turned tracing on
	}
	if o.claimant == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "client"
		}
		o.claimant = host + "-" + strconv.Itoa(os.Getpid())
	}
	log := o.logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var id [8]byte
	rand.Read(id[:])
	c := &Client{
		seeds:    seeds,
		opts:     o,
		log:      log.With("component", "client"),
		clientID: hex.EncodeToString(id[:]),
		conns:    make(map[string]*grpc.ClientConn),
	}
	c.rt.init(c)
	c.streams.idle, c.streams.tracer = c.opts.streamIdle, c.opts.tracer
	if !o.proxyOnly {
		// Best effort: one pass over the addresses.
		if err := c.rt.refresh(ctx); err != nil {
			c.log.Debug("no routing table at dial", "err", err)
		}
	}
	return c, nil
}

// Close closes every connection. Calls in flight fail; later calls return
// ErrClosed.
func (c *Client) Close() error {
	c.streams.close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	c.conns = nil
	return errors.Join(errs...)
}

// Claimant is the claimant used for requests that do not name one.
func (c *Client) Claimant() string { return c.opts.claimant }

// Addresses returns the addresses the Client was given.
func (c *Client) Addresses() []string { return append([]string(nil), c.seeds...) }

// conn returns the pooled connection to addr, creating it on first use.
func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	// Keepalive notices a node that vanished without closing its
	// connections (a killed container, a cut network) within seconds,
	// instead of waiting for the attempt timeout.
	// The size limits come before the caller's options, which may
	// override them: answers up to taskstorepb.MaxResponseBytes (a committed
	// write's echo, a claim of many large values) must be received, or a
	// write that happened would be reported as failed.
	// Reconnect to a restarted node within a second: gRPC's default
	// backoff grows to two minutes, and a node killed and restarted a few
	// times would stay unreachable long after it came back (and took its
	// shards' leadership back).
	dopts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Second, Timeout: 3 * time.Second, PermitWithoutStream: true}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		})},
		limitDialOptions()...)
	dopts = append(dopts, tracing.DialOptions(c.opts.tracer)...)
	dopts = append(dopts, c.opts.dialOpts...)
	cc, err := grpc.NewClient(addr, dopts...)
	if err != nil {
		return nil, fmt.Errorf("taskstore: connect %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// session is one exactly-once stream of request ids. The cluster remembers
// the last sequence number of each client id and refuses lower ones, so
// concurrent calls must not share a client id: each call borrows a session,
// uses its next sequence number for every attempt, and gives it back.
type session struct {
	id  string
	seq uint64
}

// nextRequestID borrows a session and returns a fresh request id; release
// gives the session back once the call is over.
func (c *Client) nextRequestID() (rid *taskstorepb.RequestID, release func()) {
	c.mu.Lock()
	var s *session
	if n := len(c.sessions); n > 0 {
		s = c.sessions[n-1]
		c.sessions = c.sessions[:n-1]
	} else {
		c.nsession++
		s = &session{id: c.clientID + "." + strconv.Itoa(c.nsession)}
	}
	c.mu.Unlock()
	s.seq++
	return &taskstorepb.RequestID{ClientId: s.id, Seq: s.seq}, func() {
		c.mu.Lock()
		c.sessions = append(c.sessions, s)
		c.mu.Unlock()
	}
}
