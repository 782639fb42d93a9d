package e2e

import (
	"context"
	"encoding/hex"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// otlpReceiver is an OTLP/gRPC trace receiver: the processes under test
// export their spans to it.
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []recvSpan
}

// recvSpan is a span as the trace tree check needs it.
type recvSpan struct {
	service, name             string
	traceID, spanID, parentID string
	links                     []string // "traceID/spanID"
}

func (r *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				rsp := recvSpan{service: service, name: s.Name, traceID: hex.EncodeToString(s.TraceId),
					spanID: hex.EncodeToString(s.SpanId), parentID: hex.EncodeToString(s.ParentSpanId)}
				for _, l := range s.Links {
					rsp.links = append(rsp.links, hex.EncodeToString(l.TraceId)+"/"+hex.EncodeToString(l.SpanId))
				}
				r.spans = append(r.spans, rsp)
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *otlpReceiver) all() []recvSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recvSpan(nil), r.spans...)
}

// fromSDK converts the test process's own spans.
func fromSDK(spans tracetest.SpanStubs) []recvSpan {
	var out []recvSpan
	for _, s := range spans {
		rs := recvSpan{service: "test", name: s.Name, traceID: s.SpanContext.TraceID().String(),
			spanID: s.SpanContext.SpanID().String()}
		if s.Parent.IsValid() {
			rs.parentID = s.Parent.SpanID().String()
		}
		for _, l := range s.Links {
			rs.links = append(rs.links, l.SpanContext.TraceID().String()+"/"+l.SpanContext.SpanID().String())
		}
		out = append(out, rs)
	}
	return out
}

// ancestry is the chain "service name" from the span with id up to its
// trace's root, as far as spans are known.
func ancestry(spans []recvSpan, id string) []string {
	byID := map[string]recvSpan{}
	for _, s := range spans {
		byID[s.spanID] = s
	}
	var out []string
	for id != "" && id != "0000000000000000" {
		s, ok := byID[id]
		if !ok {
			out = append(out, "? "+id)
			break
		}
		out = append(out, s.service+" "+s.name)
		id = s.parentID
	}
	return out
}

// TestTracingAcrossProcesses turns tracing on (OTEL_TRACES_EXPORTER=otlp,
// to a receiver in the test) for a real 3-node cluster and a proxy, and
// sends an insert through the proxy with a traced client, then has a
// traced Worker handle the task. The insert is one trace from the test's
// span down to the Raft commit on the shard's leader, every hop a child of
// the one before (client call, its gRPC attempt, the proxy's server span,
// the proxy's own client call and attempt, the node's server span, the
// proposal, the commit); the Worker's commit is a trace under its handle
// span.
func TestTracingAcrossProcesses(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	recv := &otlpReceiver{}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, recv)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+lis.Addr().String())
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")

	pc := harness.StartProcesses(t, 3, "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
	px := pc.StartProxy("proxy")
	deadline := time.Now().Add(60 * time.Second)
	for !px.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("the proxy did not become ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
	defer tp.Shutdown(context.Background())
	cl, err := client.Dial(ctx, px.Addr, client.WithProxyOnly(), client.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	rctx, root := tp.Tracer("test").Start(ctx, "test/insert")
	task, err := cl.Insert(rctx, "traced/q", []byte("v"))
	root.End()
	if err != nil {
		t.Fatal(err)
	}
	insertTrace := root.SpanContext().TraceID().String()

	handled := make(chan trace.SpanContext, 1)
	w, err := client.NewWorker(cl, []string{"traced/q"}, func(ctx context.Context, got *client.Task) (client.Result, error) {
		if got.Id == task.Id {
			select {
			case handled <- trace.SpanContextFromContext(ctx):
			default:
			}
		}
		return client.Result{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stopWorker := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	var handle trace.SpanContext
	select {
	case handle = <-handled:
	case <-ctx.Done():
		t.Fatal("the worker did not handle the task")
	}
	// The commit follows the handler: wait for it before stopping.
	for w.Stats().Committed == 0 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	stopWorker()
	<-done
	if !handle.IsValid() {
		t.Fatal("the handler's context carries no span")
	}

	// The chains each trace must show, from the commit span up to the root.
	insertChain := []string{
		"taskstored taskstore.raft/commit",
		"taskstored taskstore.shard/propose",
		"taskstored taskstore.v1.TaskStore/Modify",
		"taskproxy taskstore.v1.TaskStore/Modify",
		"taskproxy taskstore.client/Modify",
		"taskproxy taskstore.v1.TaskStore/Modify",
		"test taskstore.v1.TaskStore/Modify",
		"test taskstore.client/Modify",
		"test test/insert",
	}
	handleChain := []string{
		"taskstored taskstore.raft/commit",
		"taskstored taskstore.shard/propose",
		"taskstored taskstore.v1.TaskStore/Modify",
		"taskproxy taskstore.v1.TaskStore/Modify",
		"taskproxy taskstore.client/Modify",
		"taskproxy taskstore.v1.TaskStore/Modify",
		"test taskstore.v1.TaskStore/Modify",
		"test taskstore.client/Modify",
		"test taskstore.worker/handle",
	}
	var got map[string][]string
	for {
		spans := append(recv.all(), fromSDK(mem.GetSpans())...)
		got = map[string][]string{}
		for _, s := range spans {
			if s.name != "taskstore.raft/commit" {
				continue
			}
			switch s.traceID {
			case insertTrace:
				got["insert"] = ancestry(spans, s.spanID)
			case handle.TraceID().String():
				got["handle"] = ancestry(spans, s.spanID)
			}
		}
		linked := false
		for _, s := range spans {
			if s.spanID == handle.SpanID().String() {
				linked = slices.Contains(s.links, insertTrace+"/"+root.SpanContext().SpanID().String())
			}
		}
		if same(got["insert"], insertChain) && same(got["handle"], handleChain) && linked {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("traces as exported:\ninsert: %q\nwant    %q\nhandle: %q\nwant    %q\nhandle span linked to the insert's span (task headers): %v", got["insert"], insertChain, got["handle"], handleChain, linked)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func same(a, b []string) bool {
	return strings.Join(a, "\n") == strings.Join(b, "\n")
}
