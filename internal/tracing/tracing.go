package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// Name is the instrumentation scope of Taskstore's own spans.
const Name = "github.com/e1158ecb/taskstore"

// provider is the process's tracer provider once Setup or Install turned
// tracing on; nil while off.
var provider atomic.Pointer[trace.TracerProvider]

// propagator carries the W3C trace context (traceparent, tracestate) and
// baggage: across gRPC metadata, HTTP headers and task headers.
var propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Requested reports whether the environment asks for traces (see the
// package comment).
func Requested() bool {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	switch exp := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); {
	case exp == "none":
		return false
	case exp != "":
		return true
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup turns tracing on when the environment asks for it: an SDK tracer
// provider exporting through autoexport (batched), installed as the global
// one with the W3C propagator. service is the default service.name. The
// returned shutdown flushes the spans still buffered; it is a no-op when
// tracing stayed off.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	if !Requested() {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: exporter from OTEL_TRACES_EXPORTER: %w", err)
	}
	if autoexport.IsNoneSpanExporter(exp) {
		return func(context.Context) error { return nil }, nil
	}
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource from OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	// No WithSampler: the SDK takes OTEL_TRACES_SAMPLER(_ARG), parent-based
	// always-on by default.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	Install(tp)
	return tp.Shutdown, nil
}

// Install turns tracing on with tp (Setup's, or a test's), installing it as
// the global tracer provider and the W3C propagator as the global one.
// Clients, servers and proxies made after it are instrumented.
func Install(tp trace.TracerProvider) {
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagator)
	provider.Store(&tp)
}

// Enabled reports whether tracing is on in this process.
func Enabled() bool { return provider.Load() != nil }

// TracerProvider returns the process's tracer provider: nil while off.
func TracerProvider() trace.TracerProvider {
	if p := provider.Load(); p != nil {
		return *p
	}
	return nil
}

// Propagator returns the W3C trace-context (and baggage) propagator.
func Propagator() propagation.TextMapPropagator { return propagator }

// traced keeps the nodes' internal Peer service (gossip, replica
// maintenance) and health checks out of traces: only the public API.
// Nor the Produce stream: its items get spans of their own (stream.go).
func traced(info *stats.RPCTagInfo) bool {
	return strings.HasPrefix(info.FullMethodName, "/taskstore.v1.") && info.FullMethodName != produceMethod
}

const produceMethod = "/taskstore.v1.TaskStore/Produce"

func handlerOptions(tp trace.TracerProvider) []otelgrpc.Option {
	return []otelgrpc.Option{otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagator),
		// Metrics are Prometheus' (rpc/metrics.go): none recorded twice.
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()), otelgrpc.WithFilter(traced)}
}

// ServerOptions returns the gRPC server options that trace the API's calls
// (a server span each, a child of the caller's span from traceparent): none
// while tracing is off.
func ServerOptions() []grpc.ServerOption {
	tp := TracerProvider()
	if tp == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(handlerOptions(tp)...))}
}

// DialOptions returns the gRPC dial options that trace calls made with tp
// (a client span per attempt, its context sent as traceparent): none for a
// nil tp.
func DialOptions(tp trace.TracerProvider) []grpc.DialOption {
	if tp == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler(handlerOptions(tp)...))}
}

// HTTP wraps an HTTP API handler so that each request is a server span, a
// child of the caller's traceparent header, whose context the handler's
// gRPC calls carry on: h itself while tracing is off.
func HTTP(h http.Handler) http.Handler {
	tp := TracerProvider()
	if tp == nil {
		return h
	}
	return otelhttp.NewHandler(h, "taskstore.http", otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagator),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method + " " + r.URL.Path }))
}

// Flush runs a Setup's shutdown with a bound of 5 s, so that the spans
// still buffered are exported before the process exits; an error is
// logged.
func Flush(log *slog.Logger, shutdown func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		log.Warn("tracing: flush spans", "err", err)
	}
}
