package proxy

import (
	"context"
	"runtime"
	"strings"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// metrics are one proxy's Prometheus series, in a registry of its own so
// that several proxies (tests, `taskstored dev`) can share a process.
type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inflight prometheus.Gauge
	// Standard go-grpc-middleware series: grpc_server_* for what callers
	// asked, grpc_client_* for what the proxy sent to nodes.
	grpcServer *grpcprom.ServerMetrics
	grpcClient *grpcprom.ClientMetrics
}

func newMetrics(version string) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "taskstore_proxy_requests_total",
			Help: "Requests the proxy answered, by method and gRPC code (HTTP/JSON requests included).",
		}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "taskstore_proxy_request_duration_seconds",
			Help:    "Time to answer a request, retries and claim waits included, by method.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18), // 0.5ms .. ~65s
		}, []string{"method"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "taskstore_proxy_requests_in_flight",
			Help: "Requests being forwarded now.",
		}),
	}
	m.grpcServer = grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	m.grpcClient = grpcprom.NewClientMetrics(grpcprom.WithClientHandlingTimeHistogram())
	if version == "" {
		version = "dev"
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "taskstore_build_info",
		Help:        "Build of the running binary; always 1.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	build.Set(1)
	m.reg.MustRegister(m.requests, m.duration, m.inflight, m.grpcServer, m.grpcClient, build,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// unary counts every call of the proxy's services (gRPC and, through the
// gateway's in-process connection, HTTP/JSON alike): in flight, by method
// and code, and its duration. As an interceptor, it cannot be forgotten by
// a handler (each of the 12 used to call it itself).
func (m *metrics) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !strings.HasPrefix(info.FullMethod, "/taskstore.v1.") {
			return handler(ctx, req) // health checks, reflection
		}
		method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
		start := time.Now()
		m.inflight.Inc()
		resp, err := handler(ctx, req)
		m.inflight.Dec()
		m.requests.WithLabelValues(method, status.Code(err).String()).Inc()
		m.duration.WithLabelValues(method).Observe(time.Since(start).Seconds())
		return resp, err
	}
}

// registerStreams exports how many Produce streams the proxy holds open to
// nodes (closed when idle for --stream-idle).
func (m *metrics) registerStreams(open func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "taskstore_proxy_produce_streams",
		Help: "Produce streams open now from this proxy to nodes; one with nothing in flight for --stream-idle is closed.",
	}, func() float64 { return float64(open()) }))
}

// registerAnswers exports the answer budget: the bytes held now and the
// answers refused for want of it.
func (m *metrics) registerAnswers(b *answerBudget) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "taskstore_proxy_answer_bytes_held",
			Help: "Bytes of answers held now, from receipt until written to the caller (bounded by --answer-memory).",
		}, func() float64 { return float64(b.held.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "taskstore_proxy_answer_memory_bytes",
			Help: "The answer budget (--answer-memory).",
		}, func() float64 { return float64(b.limit) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "taskstore_proxy_answers_refused_total",
			Help: "Answers refused with ResourceExhausted because they did not fit in the answer budget.",
		}, func() float64 { return float64(b.refused.Load()) }),
	)
}
