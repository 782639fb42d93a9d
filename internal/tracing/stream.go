package tracing

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// A Produce stream carries many calls, of many callers, for as long as its
// connection lives: one span for the stream would say nothing about any
// of them (and would never end), so the stream itself is not traced
// (traced) and each item gets the spans a unary call would have: a client
// span on the sender, whose context the item carries (ProduceItem.trace),
// and a server span on the receiver, its child. A trace through a proxy
// that relays unary calls on its streams reads as if they were unary.

// streamAttr marks the spans of calls that travelled as stream items.
var streamAttr = attribute.String("taskstore.transport", "produce-stream")

// StartStreamedCall starts the client span of a call sent as an item of a
// stream, when tp traces and ctx carries a span, and returns the trace
// context to send with the item; nil span and carrier otherwise.
// fullMethod is the gRPC method the item stands for ("/pkg.Service/Method").
func StartStreamedCall(ctx context.Context, tp trace.TracerProvider, fullMethod string) (context.Context, trace.Span, map[string]string) {
	if tp == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, nil, nil
	}
	ctx, span := tp.Tracer(Name).Start(ctx, spanName(fullMethod), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(streamAttr))
	carrier := propagation.MapCarrier{}
	propagator.Inject(ctx, carrier)
	return ctx, span, carrier
}

// ServeStreamedCall starts the server span of a stream item that carries
// its caller's trace context, as its child; nil span while this process
// does not trace or the item carries none.
func ServeStreamedCall(ctx context.Context, carrier map[string]string, fullMethod string) (context.Context, trace.Span) {
	tp := TracerProvider()
	if tp == nil || len(carrier) == 0 {
		return ctx, nil
	}
	ctx = propagator.Extract(ctx, propagation.MapCarrier(carrier))
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, nil
	}
	return tp.Tracer(Name).Start(ctx, spanName(fullMethod), trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(streamAttr))
}

// EndStreamedCall ends a span of StartStreamedCall or ServeStreamedCall
// (nil: none) with the call's outcome.
func EndStreamedCall(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// spanName names a call's span as otelgrpc does: the method without its
// leading slash.
func spanName(fullMethod string) string { return strings.TrimPrefix(fullMethod, "/") }
