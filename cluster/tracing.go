package cluster

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/internal/tracing"
)

// Spans of a write on its shard's leader (docs/tracing.md), children of
// the API call's server span: taskstore.shard/propose from Propose until
// the state machine's answer (queued behind the entry being appended,
// then in an entry), and within it taskstore.raft/commit from the moment
// the write's entry goes to Raft until it was committed by a quorum and
// applied (hashicorp/raft answers once both are done). Only a call that is
// traced (its span records) gets them: with tracing off a write pays one
// atomic load.

// startPropose starts the propose span of cmd when ctx's call is traced.
func (s *Shard) startPropose(ctx context.Context, cmd *fsmpb.Command) (context.Context, trace.Span) {
	if !tracing.Enabled() {
		return ctx, nil
	}
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, nil
	}
	return parent.TracerProvider().Tracer(tracing.Name).Start(ctx, "taskstore.shard/propose",
		trace.WithAttributes(attribute.Int64("taskstore.shard", int64(s.id)), attribute.String("taskstore.op", cmd.Op.String())))
}

// startCommit starts the commit span under the propose span (nil: none),
// when the write's entry goes to Raft carrying writes writes.
func startCommit(propose trace.Span, writes int) trace.Span {
	if propose == nil {
		return nil
	}
	ctx := trace.ContextWithSpan(context.Background(), propose)
	_, span := propose.TracerProvider().Tracer(tracing.Name).Start(ctx, "taskstore.raft/commit",
		trace.WithAttributes(attribute.Int("taskstore.entry.writes", writes)))
	return span
}

// endCommit ends a commit span (nil: none).
func endCommit(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// endPropose ends a propose span (nil: none) with the state machine's
// answer: refused references, a refused request, or an error.
func endPropose(span trace.Span, res *fsmpb.Result, err error) {
	if span == nil {
		return
	}
	switch f := res.GetFailure(); {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	case f != nil:
		span.SetAttributes(attribute.Int("taskstore.refused_refs", len(f.Errors)), attribute.String("taskstore.refused", f.Message),
			attribute.Bool("taskstore.moved", f.Moved != nil))
	default:
		span.SetAttributes(attribute.Bool("taskstore.replayed", res.GetReplayed()),
			attribute.Int("taskstore.claimed", len(res.GetClaim().GetTasks())))
	}
	span.End()
}
