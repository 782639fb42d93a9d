package limits

import (
	"container/list"
	"context"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// DefaultMaxConcurrentStreams is the default bound on concurrent calls over
// one connection. A proxy forwards all of its callers' calls (waiting claims
// among them, up to MaxWait each) over one connection per node, so the bound
// is generous; a client over it waits for a slot, it does not fail.
const DefaultMaxConcurrentStreams = 4096

// maxRateClients bounds the per-client token buckets a server keeps.
const maxRateClients = 10000

// Server bounds what a caller can make a server (a node or a proxy) do.
// Zero fields take DefaultServer's values; RatePerClient zero means no rate
// limit.
type Server struct {
	// MaxMessageBytes is the largest request read (taskstorepb.MaxMessageBytes).
	MaxMessageBytes int
	// MaxResponseBytes is the largest answer sent
	// (taskstorepb.MaxResponseBytes); clients accept up to the same.
	MaxResponseBytes int
	// MaxConcurrentStreams bounds concurrent calls per connection.
	MaxConcurrentStreams uint32
	// RatePerClient, when positive, is the sustained calls per second
	// allowed to each client (as Key names it); calls over it answer
	// ResourceExhausted with a RetryInfo detail. Health checks are exempt.
	RatePerClient float64
	// Burst is how many calls a client may make at once after being idle;
	// default one second's worth of RatePerClient (at least 1).
	Burst int
	// Key names the client a call comes from; default ClientKey.
	Key func(ctx context.Context) string
	// Commands bound what one request may carry (operations per
	// transaction, claim limit, name and value sizes); zero fields take
	// DefaultCommands'. A node checks them before proposing.
	Commands Commands
}

// DefaultServer is the limits of a node or proxy: the shared message
// sizes, DefaultMaxConcurrentStreams, and no rate limit.
func DefaultServer() Server {
	return Server{
		MaxMessageBytes:      taskstorepb.MaxMessageBytes,
		MaxResponseBytes:     taskstorepb.MaxResponseBytes,
		MaxConcurrentStreams: DefaultMaxConcurrentStreams,
	}
}

// WithDefaults returns l with each zero field set to DefaultServer's (and
// Burst, Key derived as their comments say).
func (l Server) WithDefaults() Server {
	d := DefaultServer()
	if l.MaxMessageBytes <= 0 {
		l.MaxMessageBytes = d.MaxMessageBytes
	}
	if l.MaxResponseBytes <= 0 {
		l.MaxResponseBytes = d.MaxResponseBytes
	}
	if l.MaxConcurrentStreams == 0 {
		l.MaxConcurrentStreams = d.MaxConcurrentStreams
	}
	if l.RatePerClient > 0 && l.Burst <= 0 {
		l.Burst = max(int(math.Ceil(l.RatePerClient)), 1)
	}
	if l.Key == nil {
		l.Key = ClientKey
	}
	return l
}

// ServerOptions returns the gRPC server options that enforce l: message
// sizes, concurrent streams and, with RatePerClient, unary and stream
// interceptors that rate-limit each client. Keepalive enforcement is set by
// the node's and the proxy's assembly separately (internal/serving.Keepalive).
func (l Server) ServerOptions() []grpc.ServerOption {
	l = l.WithDefaults()
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(l.MaxMessageBytes),
		grpc.MaxSendMsgSize(l.MaxResponseBytes),
		grpc.MaxConcurrentStreams(l.MaxConcurrentStreams),
	}
	if l.RatePerClient > 0 {
		rl := newRateLimiter(l.RatePerClient, l.Burst, maxRateClients, time.Now)
		rl.key = l.Key
		opts = append(opts, grpc.ChainUnaryInterceptor(rl.unary), grpc.ChainStreamInterceptor(rl.stream))
	}
	return opts
}

// ClientKey names the client of a call for rate limiting: the common name
// of its TLS client certificate when it presented one ("cn:NAME"), else the
// host of its address ("ip:HOST"), else "".
func ClientKey(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	var state *credentials.TLSInfo
	switch ai := p.AuthInfo.(type) {
	case credentials.TLSInfo:
		state = &ai
	case *credentials.TLSInfo:
		state = ai
	}
	if state != nil && len(state.State.PeerCertificates) > 0 {
		if cn := state.State.PeerCertificates[0].Subject.CommonName; cn != "" {
			return "cn:" + cn
		}
	}
	if p.Addr == nil {
		return ""
	}
	addr := p.Addr.String()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return "ip:" + host
	}
	return "ip:" + addr
}

// exemptFromRate: health checks come from load balancers and orchestrators
// that must see the truth even from a busy client address.
func exemptFromRate(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/")
}

// rateLimiter is a token bucket per client, at most max of them. A bucket
// left alone for burst/rate is full again, no different from a new one, so
// such buckets are dropped first; when every bucket is busier than that, the
// least recently used one goes. It is safe for concurrent use.
type rateLimiter struct {
	rate  float64 // tokens per second
	burst float64
	max   int
	now   func() time.Time
	key   func(ctx context.Context) string

	mu    sync.Mutex // guards lru and byKey
	lru   *list.List // of *bucket, most recently used first
	byKey map[string]*list.Element
}

type bucket struct {
	key    string
	tokens float64
	last   time.Time
}

func newRateLimiter(rate float64, burst, maxClients int, now func() time.Time) *rateLimiter {
	return &rateLimiter{rate: rate, burst: float64(max(burst, 1)), max: max(maxClients, 1), now: now, key: ClientKey,
		lru: list.New(), byKey: make(map[string]*list.Element)}
}

// allow takes a token from key's bucket. When there is none it returns
// false and how long until there is one.
func (r *rateLimiter) allow(key string) (bool, time.Duration) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byKey[key]
	if !ok {
		r.evictLocked(now)
		e = r.lru.PushFront(&bucket{key: key, tokens: r.burst, last: now})
		r.byKey[key] = e
	}
	r.lru.MoveToFront(e)
	b := e.Value.(*bucket)
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(r.burst, b.tokens+elapsed.Seconds()*r.rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false, time.Duration((1 - b.tokens) / r.rate * float64(time.Second))
	}
	b.tokens--
	return true, 0
}

// evictLocked makes room for one more bucket.
func (r *rateLimiter) evictLocked(now time.Time) {
	refill := time.Duration(r.burst / r.rate * float64(time.Second))
	for back := r.lru.Back(); back != nil; back = r.lru.Back() {
		b := back.Value.(*bucket)
		if r.lru.Len() < r.max && now.Sub(b.last) < refill {
			return
		}
		r.lru.Remove(back)
		delete(r.byKey, b.key)
	}
}

// size is the number of buckets kept (tests).
func (r *rateLimiter) size() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lru.Len()
}

func (r *rateLimiter) check(ctx context.Context, fullMethod string) error {
	if exemptFromRate(fullMethod) {
		return nil
	}
	ok, wait := r.allow(r.key(ctx))
	if ok {
		return nil
	}
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("rate limit: %g requests/s per client (burst %d); retry in %v",
		r.rate, int(r.burst), wait.Round(time.Millisecond)))
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); err == nil {
		st = d
	}
	return st.Err()
}

func (r *rateLimiter) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := r.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (r *rateLimiter) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod == taskstorepb.TaskStore_Produce_FullMethodName {
		// A Produce stream carries many requests: each item is charged
		// as the unary call it stands for, and refused alone, not the
		// stream's opening.
		ctx := ss.Context()
		gate := func() error { return r.check(ctx, info.FullMethod) }
		return handler(srv, &gatedStream{ServerStream: ss, ctx: taskstorepb.WithItemGate(ctx, gate)})
	}
	if err := r.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// gatedStream is a server stream whose context carries an item gate.
type gatedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *gatedStream) Context() context.Context { return s.ctx }
