package client

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
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
func startCall(ctx context.Context, tp trace.TracerProvider, op string) (context.Context, trace.Span) {
	if tp == nil {
		return ctx, noSpan
	}
	return tp.Tracer(tracing.Name).Start(ctx, "taskstore.client/"+op)
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
	// A new trace, linked to the producer's: the task may wait long, and
	// its handling is not part of the insert's request.
	return tp.Tracer(tracing.Name).Start(ctx, "taskstore.worker/handle", append(opts, producerLink(t)...)...)
}

// traceInserts returns inserts with the W3C trace context of ctx's span
// (traceparent, tracestate) in each task's headers, so that whoever handles
// the task can link its span to the producer's (a Worker does). Headers the
// caller set are kept, a traceparent among them too. inserts itself while
// the Client does not trace or ctx carries no span: the caller's messages
// are never changed.
func traceInserts(ctx context.Context, tp trace.TracerProvider, inserts []*taskstorepb.TaskInsert) []*taskstorepb.TaskInsert {
	if tp == nil || len(inserts) == 0 || !trace.SpanContextFromContext(ctx).IsValid() {
		return inserts
	}
	carrier := propagation.MapCarrier{}
	tracing.Propagator().Inject(ctx, carrier)
	out := make([]*taskstorepb.TaskInsert, len(inserts))
	for i, in := range inserts {
		if _, ok := in.GetHeaders()["traceparent"]; ok {
			out[i] = in
			continue
		}
		in = proto.Clone(in).(*taskstorepb.TaskInsert)
		if in.Headers == nil {
			in.Headers = make(map[string]string, len(carrier))
		}
		for k, v := range carrier {
			if _, set := in.Headers[k]; !set {
				in.Headers[k] = v
			}
		}
		out[i] = in
	}
	return out
}

// producerLink is the link to the span that inserted t, from the trace
// context in its headers (traceInserts); none when they carry none.
func producerLink(t *Task) []trace.SpanStartOption {
	if len(t.GetHeaders()) == 0 {
		return nil
	}
	sc := trace.SpanContextFromContext(tracing.Propagator().Extract(context.Background(), propagation.MapCarrier(t.Headers)))
	if !sc.IsValid() {
		return nil
	}
	return []trace.SpanStartOption{trace.WithLinks(trace.Link{SpanContext: sc})}
}
