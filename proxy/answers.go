package proxy

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// DefaultAnswerMemory is the default budget of the answers a proxy holds
// at once: four of the largest answer a node sends
// (taskstorepb.MaxResponseBytes).
const DefaultAnswerMemory = 4 * taskstorepb.MaxResponseBytes

// minCountedAnswer is the smallest answer counted against the budget:
// smaller ones cost little, and the many small calls stay as cheap as they
// were.
const minCountedAnswer = 64 << 10

// answerBudget bounds the bytes of the answers a proxy holds at once,
// across all of its callers. Many callers each reading many large tasks
// (task get, list, claim of 1 MiB values) would otherwise grow the proxy
// without bound: a caller that reads slowly keeps its whole answer queued
// in the proxy. An answer is counted from the moment the handler has it
// (received from the nodes and decoded) until gRPC has written its last
// byte to the caller's connection (or the call was cut off): the encoded
// answer lives in a buffer whose release returns its bytes to the budget.
// An answer that does not fit is dropped at once and the call refused with
// ResourceExhausted.
type answerBudget struct {
	sem     *semaphore.Weighted
	limit   int64
	held    atomic.Int64
	refused atomic.Int64
	// pending holds the bytes reserved for an answer (by message) from
	// the interceptor to the codec that encodes it, or to the end of the
	// call when it was never encoded.
	pending sync.Map
}

func newAnswerBudget(limit int64) *answerBudget {
	return &answerBudget{sem: semaphore.NewWeighted(limit), limit: limit}
}

func (b *answerBudget) release(n int64) {
	b.held.Add(-n)
	b.sem.Release(n)
}

// call is what the stats handler knows of one call: the answer it
// reserved for, if any.
type call struct{ answer any }

type callKey struct{}

// unary reserves budget for the answer of a TaskStore or Admin call.
func (b *answerBudget) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		c, _ := ctx.Value(callKey{}).(*call)
		msg, ok := resp.(proto.Message)
		if err != nil || c == nil || !ok || !strings.HasPrefix(info.FullMethod, "/taskstore.v1.") {
			return resp, err
		}
		n := int64(proto.Size(msg))
		if n < minCountedAnswer {
			return resp, nil
		}
		if n > b.limit || !b.sem.TryAcquire(n) {
			b.refused.Add(1)
			return nil, status.Errorf(codes.ResourceExhausted,
				"answer memory full: this proxy holds at most %d MiB of answers at once (taskproxy --answer-memory) and this answer of %d bytes does not fit; retry later, or read fewer or smaller tasks per call (a lower limit, omit_values)",
				b.limit>>20, n)
		}
		if _, shared := b.pending.LoadOrStore(resp, n); shared {
			// The same message answers another call being sent now: it
			// is counted once, there.
			b.sem.Release(n)
			return resp, nil
		}
		b.held.Add(n)
		c.answer = resp
		return resp, nil
	}
}

// codec encodes answers into buffers that give their reserved bytes back
// to the budget once gRPC has written them and freed them.
type codec struct {
	encoding.CodecV2
	b *answerBudget
}

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := c.b.pending.LoadAndDelete(v)
	if !ok {
		return c.CodecV2.Marshal(v)
	}
	n := r.(int64)
	m, _ := v.(proto.Message)
	data, err := proto.Marshal(m)
	if err != nil {
		c.b.release(n)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(&data, &releaser{b: c.b, n: n})}, nil
}

// releaser is the "pool" of one answer's buffer: its Put, called when the
// last reference to the buffer is freed, returns the answer's bytes.
type releaser struct {
	b    *answerBudget
	n    int64
	once sync.Once
}

func (r *releaser) Get(int) *[]byte { panic("proxy: answer buffers are not pooled") }

func (r *releaser) Put(*[]byte) { r.once.Do(func() { r.b.release(r.n) }) }

// TagRPC gives each call a place to note the answer it reserved for.
func (b *answerBudget) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, callKey{}, &call{})
}

// HandleRPC gives back, at the end of a call, what was reserved for an
// answer that was never encoded.
func (b *answerBudget) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.End); !ok {
		return
	}
	if c, _ := ctx.Value(callKey{}).(*call); c != nil && c.answer != nil {
		if r, ok := b.pending.LoadAndDelete(c.answer); ok {
			b.release(r.(int64))
		}
	}
}

func (b *answerBudget) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (b *answerBudget) HandleConn(context.Context, stats.ConnStats) {}
