package client

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/e1158ecb/taskstore/internal/tracing"
)

// WithTracerProvider traces the Client's calls with tp (OpenTelemetry): a
// span per call, around its attempts, each attempt a gRPC client span whose
// context travels to the node as W3C traceparent; inserts carry the context
// of their span in the task's headers, and a Worker starts each handler's
// span linked to it. Without this option a Client traces only in a process
// whose tracing was turned on from the OTEL_* environment (taskbench,
// taskproxy: docs/tracing.md), with that provider; otherwise it traces
// nothing and pays nothing for it.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracer = tp }
}

// noSpan is what startCall returns while the Client does not trace.
var noSpan = trace.SpanFromContext(context.Background())

// startCall starts the span of one call of the Client (the parent of its
// attempts' gRPC spans), or returns ctx and a non-recording span when the
// Client does not trace.
func (c *Client) startCall(ctx context.Context, op string) (context.Context, trace.Span) {
	if c.opts.tracer == nil {
		return ctx, noSpan
	}
	return c.opts.tracer.Tracer(tracing.Name).Start(ctx, "taskstore.client/"+op)
}

// endCall ends a call's span with its error.
func endCall(span trace.Span, err error) {
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// startHandle starts the span of a Worker's handling of t (the handler and
// the commit of its result), or returns ctx and a non-recording span when
// the Client does not trace.
func (w *Worker) startHandle(ctx context.Context, t *Task) (context.Context, trace.Span) {
	tp := w.c.opts.tracer
	if tp == nil {
		return ctx, noSpan
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("taskstore.task.id", t.Id), attribute.String("taskstore.queue", t.Queue),
			attribute.Int64("taskstore.task.attempt", int64(t.Attempt)))}
	return tp.Tracer(tracing.Name).Start(ctx, "taskstore.worker/handle", opts...)
}
