package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/internal/tracing"
)

// DefaultInflight is how many requests a Producer has in flight at most
// unless WithInflight says otherwise.
const DefaultInflight = 64

// Producer puts many inserts (or other transactions) in flight from one
// goroutine. Each request is its own transaction with its own request id,
// answer and error; one refused request does not refuse its neighbours.
// Requests to the same node share the Client's Produce stream to it, many
// per message, and requests to the same shard that arrive together share
// its log entries, so a producer pays one round trip and one entry for
// many tasks instead of one each. Retries (a leader change, a broken
// stream) resend a request with its request id, so none is applied twice.
//
// Only what one request holds is atomic: two Inserts are two
// transactions, applied or refused independently, in no promised order.
// For all-or-nothing, put the operations in one Modify.
//
// A Producer is safe for concurrent use; Wait waits for everything sent.
type Producer struct {
	c     *Client
	slots chan struct{}
	wg    sync.WaitGroup
}

// ProducerOption configures a Producer.
type ProducerOption func(*Producer)

// WithInflight bounds the requests in flight at once (default
// DefaultInflight): Insert and Modify block while that many are waiting
// for their answers.
func WithInflight(n int) ProducerOption {
	return func(p *Producer) { p.slots = make(chan struct{}, max(n, 1)) }
}

// NewProducer returns a Producer that sends through c.
func (c *Client) NewProducer(opts ...ProducerOption) *Producer {
	p := &Producer{c: c, slots: make(chan struct{}, DefaultInflight)}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Pending is the outcome of one request of a Producer, known once Done is
// closed.
type Pending struct {
	done chan struct{}
	resp *taskstorepb.ModifyResponse
	err  error
}

// Done is closed when the request is answered (or failed for good).
func (f *Pending) Done() <-chan struct{} { return f.done }

// Result waits for the answer: the request's ModifyResponse, or its error
// as Modify would return it (a *DependencyError for a refused transaction,
// an error matching ErrUnavailable or context.DeadlineExceeded when it
// could not be applied in time: then it may or may not have been).
func (f *Pending) Result() (*taskstorepb.ModifyResponse, error) {
	<-f.done
	return f.resp, f.err
}

// Task waits for the answer of an Insert and returns the inserted task.
func (f *Pending) Task() (*Task, error) {
	resp, err := f.Result()
	if err != nil {
		return nil, err
	}
	if len(resp.GetInserted()) == 0 {
		return nil, fmt.Errorf("produce: the answer holds no inserted task: %w", ErrInvalid)
	}
	return resp.Inserted[0], nil
}

// Insert sends one insert and returns at once with its Pending, unless the
// producer has its maximum in flight: then it waits for a slot (or ctx).
// ctx bounds the request, retries included.
func (p *Producer) Insert(ctx context.Context, in *taskstorepb.TaskInsert) *Pending {
	return p.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{in}})
}

// Modify sends one transaction as Client.Modify would, and returns at once
// with its Pending (see Insert). req must not be changed until it is done.
func (p *Producer) Modify(ctx context.Context, req *taskstorepb.ModifyRequest) *Pending {
	f := &Pending{done: make(chan struct{})}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		f.err = fmt.Errorf("produce: waiting for a slot: %w", ctx.Err())
		close(f.done)
		return f
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f.resp, f.err = p.c.ModifyStreamed(ctx, req)
		<-p.slots
		close(f.done)
	}()
	return f
}

// Wait waits until every request sent so far is answered.
func (p *Producer) Wait() { p.wg.Wait() }

// ModifyStreamed is Modify sent over the Client's Produce stream to the
// node (one per node, shared by every caller), so that requests made
// together travel together. Routing, leader hints, retries and request
// ids are Modify's. A node that does not have the stream (an older
// version) gets a unary Modify instead.
func (c *Client) ModifyStreamed(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error) {
	return c.modify(ctx, req, true)
}

// maxItemBytes bounds one streamed request: a message of the stream holds
// at least one, and the node reads messages up to MaxMessageBytes.
const maxItemBytes = taskstorepb.MaxMessageBytes - 64<<10

// streamKey names a shared stream: the connection, and the metadata the
// stream was opened with (a proxy speaks for each of its callers on
// streams of their own).
type streamKey struct {
	cc *grpc.ClientConn
	md string
}

// streamSlot holds the current stream of a key.
type streamSlot struct {
	mu          sync.Mutex
	ps          *produceStream
	unsupported bool // the node answered Unimplemented: use unary calls
}

func mdKey(md metadata.MD) string {
	if len(md) == 0 {
		return ""
	}
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		for _, v := range md[k] {
			b.WriteString(k)
			b.WriteByte('=')
			b.WriteString(v)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// streamSet is a Client's shared Produce streams, one a connection and
// caller metadata (streamKey -> *streamSlot).
type streamSet struct {
	m      sync.Map
	idle   time.Duration        // a stream with nothing in flight this long closes (WithStreamIdle)
	tracer trace.TracerProvider // nil: no spans
}

// produce sends req over the shared stream to cc and waits for its answer.
// errUnary says the node has no Produce stream.
func (s *streamSet) produce(ctx context.Context, cc *grpc.ClientConn, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	key := streamKey{cc: cc, md: mdKey(md)}
	v, _ := s.m.LoadOrStore(key, &streamSlot{})
	slot := v.(*streamSlot)
	slot.mu.Lock()
	if slot.unsupported {
		slot.mu.Unlock()
		return nil, errUnary
	}
	ps := slot.ps
	if ps == nil || ps.isBroken() {
		sctx, cancel := context.WithCancel(metadata.NewOutgoingContext(context.Background(), md))
		st, err := taskstorepb.NewTaskStoreClient(cc).Produce(sctx)
		if err != nil {
			cancel()
			if status.Code(err) == codes.Unimplemented {
				slot.unsupported = true
				err = errUnary
			}
			slot.mu.Unlock()
			return nil, err
		}
		ps = newProduceStream(st, cancel, s.idle)
		slot.ps = ps
	}
	slot.mu.Unlock()
	// The item is traced as the unary call it stands for
	// (internal/tracing/stream.go).
	ctx, span, carrier := tracing.StartStreamedCall(ctx, s.tracer, taskstorepb.TaskStore_Modify_FullMethodName)
	resp, err := ps.do(ctx, req, carrier)
	tracing.EndStreamedCall(span, err)
	if status.Code(err) == codes.Unimplemented && ps.isBroken() {
		slot.mu.Lock()
		slot.unsupported = true
		slot.mu.Unlock()
		return nil, errUnary
	}
	return resp, err
}

// errUnary: send this request as a unary call instead.
var errUnary = errors.New("the node has no Produce stream")

// close ends the streams (Client.Close).
func (s *streamSet) close() {
	s.m.Range(func(k, v any) bool {
		slot := v.(*streamSlot)
		slot.mu.Lock()
		if slot.ps != nil {
			slot.ps.fail(ErrClosed)
		}
		slot.mu.Unlock()
		s.m.Delete(k)
		return true
	})
}

// produceStream is one open Produce stream: a sender goroutine that puts
// whatever was queued since its last message into the next, and a receiver
// that hands each answer to the request waiting for it.
type produceStream struct {
	st     taskstorepb.TaskStore_ProduceClient
	cancel context.CancelFunc
	wake   chan struct{}

	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan *taskstorepb.ProduceAnswer
	queue   []*taskstorepb.ProduceItem
	cancels []uint64
	broken  error
	active  time.Time // the last request joined or answered
}

func newProduceStream(st taskstorepb.TaskStore_ProduceClient, cancel context.CancelFunc, idle time.Duration) *produceStream {
	ps := &produceStream{st: st, cancel: cancel, wake: make(chan struct{}, 1), waiting: map[uint64]chan *taskstorepb.ProduceAnswer{}, active: time.Now()}
	go ps.sendLoop()
	go ps.recvLoop()
	if idle > 0 {
		go ps.closeIdle(idle)
	}
	return ps
}

// errIdle ends a stream that was idle: nothing was waiting on it.
var errIdle = status.Error(codes.Unavailable, "produce stream closed: idle")

// closeIdle ends the stream once nothing was in flight on it for idle.
// It is marked broken under the lock that every request checks before it
// joins, so no request is lost to the close: the next opens a new stream.
func (ps *produceStream) closeIdle(idle time.Duration) {
	t := time.NewTimer(idle)
	defer t.Stop()
	for range t.C {
		ps.mu.Lock()
		if ps.broken != nil {
			ps.mu.Unlock()
			return
		}
		quiet := time.Since(ps.active)
		if len(ps.waiting) == 0 && len(ps.queue) == 0 && quiet >= idle {
			ps.broken = errIdle
			ps.mu.Unlock()
			ps.cancel()
			ps.signal()
			return
		}
		ps.mu.Unlock()
		t.Reset(max(idle-quiet, idle/10))
	}
}

func (ps *produceStream) isBroken() bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.broken != nil
}

func (ps *produceStream) signal() {
	select {
	case ps.wake <- struct{}{}:
	default:
	}
}

func (ps *produceStream) do(ctx context.Context, req *taskstorepb.ModifyRequest, trace map[string]string) (*taskstorepb.ModifyResponse, error) {
	if n := proto.Size(req); n > maxItemBytes {
		return nil, status.Errorf(codes.ResourceExhausted, "the request is %d bytes, over the limit of %d", n, maxItemBytes)
	}
	it := &taskstorepb.ProduceItem{Modify: req, Trace: trace}
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if left <= 0 {
			return nil, status.FromContextError(context.DeadlineExceeded).Err()
		}
		it.Timeout = durationpb.New(left)
	}
	ch := make(chan *taskstorepb.ProduceAnswer, 1)
	ps.mu.Lock()
	if ps.broken != nil {
		err := ps.broken
		ps.mu.Unlock()
		return nil, err
	}
	ps.next++
	ps.active = time.Now()
	it.Id = ps.next
	ps.waiting[it.Id] = ch
	ps.queue = append(ps.queue, it)
	ps.mu.Unlock()
	ps.signal()
	select {
	case a := <-ch:
		if err := taskstorepb.AnswerError(a); err != nil {
			return nil, err
		}
		return a.Modify, nil
	case <-ctx.Done():
		ps.mu.Lock()
		if _, ok := ps.waiting[it.Id]; ok {
			delete(ps.waiting, it.Id)
			ps.cancels = append(ps.cancels, it.Id)
		}
		ps.mu.Unlock()
		ps.signal()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// fail breaks the stream: every waiting request gets err (a broken
// stream's outcome is unknown; the caller's retry loop resends with the
// same request id).
func (ps *produceStream) fail(err error) {
	if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
		err = status.Errorf(codes.Unavailable, "produce stream ended: %v", err)
	} else if _, ok := status.FromError(err); !ok {
		err = status.Error(codes.Unavailable, err.Error())
	}
	ps.mu.Lock()
	if ps.broken == nil {
		ps.broken = err
	}
	waiting := ps.waiting
	ps.waiting = map[uint64]chan *taskstorepb.ProduceAnswer{}
	ps.mu.Unlock()
	for id, ch := range waiting {
		ch <- taskstorepb.FailedAnswer(id, err)
	}
	ps.cancel()
	ps.signal()
}

func (ps *produceStream) sendLoop() {
	for range ps.wake {
		ps.mu.Lock()
		items, cancels, broken := ps.queue, ps.cancels, ps.broken
		ps.queue, ps.cancels = nil, nil
		ps.mu.Unlock()
		if broken != nil {
			return
		}
		for len(items) > 0 || len(cancels) > 0 {
			msg := &taskstorepb.ProduceRequest{Cancel: cancels}
			cancels = nil
			size := 0
			for len(items) > 0 {
				n := proto.Size(items[0]) + 16
				if len(msg.Items) > 0 && size+n > maxItemBytes {
					break
				}
				size += n
				msg.Items = append(msg.Items, items[0])
				items = items[1:]
			}
			if err := ps.st.Send(msg); err != nil {
				// Send reports io.EOF for a stream the node ended: its
				// status comes from Recv, which fails the stream with it.
				if !errors.Is(err, io.EOF) {
					ps.fail(err)
				}
				return
			}
		}
	}
}

func (ps *produceStream) recvLoop() {
	for {
		res, err := ps.st.Recv()
		if err != nil {
			ps.fail(err)
			return
		}
		for _, a := range res.Answers {
			ps.mu.Lock()
			ch := ps.waiting[a.Id]
			delete(ps.waiting, a.Id)
			ps.active = time.Now()
			ps.mu.Unlock()
			if ch != nil {
				ch <- a
			}
		}
	}
}

// modify is Modify, over the Produce stream when streamed.
func (c *Client) modify(ctx context.Context, req *taskstorepb.ModifyRequest, streamed bool) (*taskstorepb.ModifyResponse, error) {
	group, err := modifyGroup(req)
	if err != nil {
		return nil, fmt.Errorf("modify: %w: %w", err, ErrInvalid)
	}
	if group == "" && !c.opts.proxyOnly {
		return nil, fmt.Errorf("modify: no queue named: give the queue of at least one task so the request can be routed: %w", ErrInvalid)
	}
	r := &taskstorepb.ModifyRequest{Claimant: cmp.Or(req.Claimant, c.opts.claimant), Inserts: req.Inserts,
		Changes: req.Changes, Deletes: req.Deletes, Depends: req.Depends, Request: req.Request, Claim: req.Claim}
	r.Inserts = traceInserts(ctx, c.opts.tracer, r.Inserts) // the trace context in the tasks' headers (tracing.go)
	if r.Request == nil {
		var release func()
		r.Request, release = c.nextRequestID()
		defer release()
	}
	var resp *taskstorepb.ModifyResponse
	err = c.call(ctx, "Modify", target{group: group}, 0, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		if streamed {
			resp, err = c.streams.produce(ctx, cc, r)
			if !errors.Is(err, errUnary) {
				return err
			}
		}
		resp, err = taskstorepb.NewTaskStoreClient(cc).Modify(ctx, r)
		return err
	})
	// The node sends a task that several inserts coalesced into once; every
	// entry of Inserted gets its value back (the same bytes).
	taskstorepb.ExpandInserted(resp)
	return resp, err
}

// OpenStreams is how many of the Client's shared Produce streams to nodes
// are open now (ModifyStreamed, Producers, a proxy's streams to leaders);
// an idle one closes after WithStreamIdle.
func (c *Client) OpenStreams() int {
	n := 0
	c.streams.m.Range(func(_, v any) bool {
		slot := v.(*streamSlot)
		slot.mu.Lock()
		if slot.ps != nil && !slot.ps.isBroken() {
			n++
		}
		slot.mu.Unlock()
		return true
	})
	return n
}
