package taskstorepb

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/e1158ecb/taskstore/internal/tracing"
)

// AnswerError returns the error of a Produce answer: nil for a success, else
// the status a unary Modify would have failed with, details included (a
// NotLeader hint, a ModifyError), so that the callers' error handling is
// the same for both.
func AnswerError(a *ProduceAnswer) error {
	if codes.Code(a.GetCode()) == codes.OK {
		return nil
	}
	st := &status.Status{Code: a.Code, Message: a.Message}
	for _, d := range a.Details {
		st.Details = append(st.Details, &anypb.Any{TypeUrl: d.TypeUrl, Value: d.Value})
	}
	return grpcstatus.FromProto(st).Err()
}

// FailedAnswer is the answer to item id that failed with err (a gRPC status
// error; anything else reads as Unknown).
func FailedAnswer(id uint64, err error) *ProduceAnswer {
	st := grpcstatus.Convert(err).Proto()
	a := &ProduceAnswer{Id: id, Code: st.Code, Message: st.Message}
	if st.Code == int32(codes.OK) {
		a.Code = int32(codes.Unknown) // an error without a status is still an error
	}
	for _, d := range st.Details {
		a.Details = append(a.Details, &ErrorDetail{TypeUrl: d.TypeUrl, Value: d.Value})
	}
	return a
}

// Undecoded reports why m, a message read with ServerCodec's codec from a
// stream, did not decode (nil when it did). Streams read their messages
// themselves: the handler asks, and must, so that the note is dropped.
func Undecoded(m any) error {
	if why, ok := undecoded.LoadAndDelete(m); ok {
		return grpcstatus.Errorf(codes.InvalidArgument, "malformed request: %v", why)
	}
	return nil
}

type itemGateKey struct{}

// WithItemGate returns ctx, a Produce stream's context, carrying gate:
// ServeProduce calls it before it handles each item, and an error refuses
// that item alone, answered with the error. A server's per-client rate
// limit charges each item through it, as the unary call the item stands
// for, so a stream is no way around the limit.
func WithItemGate(ctx context.Context, gate func() error) context.Context {
	return context.WithValue(ctx, itemGateKey{}, gate)
}

// ServeProduce serves a Produce stream (a node's, a proxy's): each item is
// handled in its own goroutine under its own context (the stream's, with
// the item's timeout, canceled by the caller's cancel ids), so that items
// of one message are handled together, and answered alone as it finishes.
// Answers that finish while a message is being sent go out together in the
// next one, up to limit bytes per message. An item id already in flight is
// refused. The stream ends when the caller closes its side and every item
// it sent is answered.
func ServeProduce(stream TaskStore_ProduceServer, limit int, handle func(ctx context.Context, it *ProduceItem) *ProduceAnswer) error {
	return ServeProduceBounded(stream, limit, nil, handle)
}

// Inflight bounds the items a server's Produce streams have in flight: per
// stream and across all of them (nil: no bound).
type Inflight struct {
	perStream int
	shared    chan struct{}
}

// NewInflight bounds items in flight to perStream on one stream and total
// across the streams served with it (<= 0: that bound is off).
func NewInflight(perStream, total int) *Inflight {
	in := &Inflight{perStream: perStream}
	if total > 0 {
		in.shared = make(chan struct{}, total)
	}
	return in
}

// ServeProduceBounded is ServeProduce with the items in flight bounded by
// in: at a bound, the stream stops reading until an item is answered, so
// the caller is held back by the stream's flow control and its items wait
// in its own buffers, not in the server's memory.
func ServeProduceBounded(stream TaskStore_ProduceServer, limit int, in *Inflight, handle func(ctx context.Context, it *ProduceItem) *ProduceAnswer) error {
	var own, shared chan struct{}
	if in != nil {
		if in.perStream > 0 {
			own = make(chan struct{}, in.perStream)
		}
		shared = in.shared
	}
	acquire := func(ctx context.Context) error {
		for _, ch := range []chan struct{}{own, shared} {
			if ch == nil {
				continue
			}
			select {
			case ch <- struct{}{}:
			case <-ctx.Done():
				if ch == shared && own != nil {
					<-own
				}
				return ctx.Err()
			}
		}
		return nil
	}
	releaseSlot := func() {
		if shared != nil {
			<-shared
		}
		if own != nil {
			<-own
		}
	}
	gate, _ := stream.Context().Value(itemGateKey{}).(func() error)
	ctx, cancelAll := context.WithCancel(stream.Context())
	defer cancelAll()
	out := newAnswerSender(stream, limit)
	go out.run()
	var (
		mu       sync.Mutex
		inflight = map[uint64]context.CancelFunc{}
		wg       sync.WaitGroup
	)
	finish := func(recvErr error) error {
		if recvErr != nil {
			cancelAll() // the caller is gone: nobody reads the answers
		}
		wg.Wait()
		if err := out.close(); recvErr == nil {
			return err
		}
		return recvErr
	}
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return finish(nil)
		}
		if err != nil {
			return finish(err)
		}
		if err := Undecoded(req); err != nil {
			return finish(err)
		}
		mu.Lock()
		for _, id := range req.Cancel {
			if cancel, ok := inflight[id]; ok {
				cancel()
			}
		}
		mu.Unlock()
		for _, it := range req.Items {
			if err := acquire(ctx); err != nil {
				return finish(grpcstatus.FromContextError(err).Err())
			}
			mu.Lock()
			if _, dup := inflight[it.Id]; dup {
				// Two items in flight under one id could not be told
				// apart by their answers.
				mu.Unlock()
				releaseSlot()
				out.add(FailedAnswer(it.Id, grpcstatus.Errorf(codes.InvalidArgument, "item id %d is already in flight on this stream", it.Id)))
				continue
			}
			if gate != nil {
				if err := gate(); err != nil {
					mu.Unlock()
					releaseSlot()
					out.add(FailedAnswer(it.Id, err))
					continue
				}
			}
			var (
				ictx   context.Context
				cancel context.CancelFunc
			)
			if t := it.Timeout; t != nil && t.IsValid() {
				ictx, cancel = context.WithTimeout(ctx, t.AsDuration())
			} else {
				ictx, cancel = context.WithCancel(ctx)
			}
			inflight[it.Id] = cancel
			wg.Add(1)
			runItem(func() {
				defer wg.Done()
				// Each item is traced as the unary Modify it stands for
				// (internal/tracing/stream.go).
				ictx, span := tracing.ServeStreamedCall(ictx, it.Trace, TaskStore_Modify_FullMethodName)
				a := handle(ictx, it)
				if span != nil {
					tracing.EndStreamedCall(span, AnswerError(a))
				}
				cancel()
				mu.Lock()
				delete(inflight, it.Id)
				mu.Unlock()
				releaseSlot()
				out.add(a)
			})
			mu.Unlock()
		}
	}
}

// Items run on goroutines that outlive one item (itemWorker): a goroutine
// per item started on a small stack and grew it, copying, for every item
// (runtime.newstack and copystack were 3% of the nodes' CPU under single
// inserts via a proxy). A worker waits workerIdle for its next item, then
// exits; it retires after workerItems items, so that a stack one deep call
// grew does not stay for good (as grpc's server workers do).
const (
	workerIdle  = time.Second
	workerItems = 1 << 16
)

// itemWork hands an item to a worker that is waiting for one.
var itemWork = make(chan func())

// runItem runs f on a waiting worker, or on a new one when none waits: an
// item never queues behind another.
func runItem(f func()) {
	select {
	case itemWork <- f:
	default:
		go itemWorker(f)
	}
}

// workersStarted counts the workers started (for tests).
var workersStarted atomic.Int64

func itemWorker(f func()) {
	workersStarted.Add(1)
	f()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for range workerItems {
		select {
		case f := <-itemWork:
			f()
			idle.Reset(workerIdle)
		case <-idle.C:
			return
		}
	}
}

// answerSender sends a Produce stream's answers from one goroutine (a
// stream's Send is not safe for concurrent use): whatever was answered
// while the last message was being sent goes out in the next, up to the
// send limit per message.
type answerSender struct {
	stream TaskStore_ProduceServer
	limit  int

	mu      sync.Mutex
	pending []*ProduceAnswer
	closed  bool
	wake    chan struct{}
	done    chan struct{}
	err     error // the first failed Send; later answers are dropped
}

func newAnswerSender(stream TaskStore_ProduceServer, limit int) *answerSender {
	return &answerSender{stream: stream, limit: limit, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

func (s *answerSender) add(a *ProduceAnswer) {
	s.mu.Lock()
	s.pending = append(s.pending, a)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// close sends what is pending, stops the sender and returns its error.
func (s *answerSender) close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	<-s.done
	return s.err
}

func (s *answerSender) run() {
	defer close(s.done)
	for range s.wake {
		s.mu.Lock()
		batch, closed := s.pending, s.closed
		s.pending = nil
		s.mu.Unlock()
		if s.err == nil {
			s.err = s.send(batch)
		}
		if closed {
			s.mu.Lock()
			rest := len(s.pending)
			s.mu.Unlock()
			if rest == 0 {
				return
			}
			// Added between the take and the close: one more round.
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
	}
}

// send sends batch in as few messages as the limit allows; an answer
// larger than the limit goes alone.
func (s *answerSender) send(batch []*ProduceAnswer) error {
	for len(batch) > 0 {
		n, size := 0, 0
		for n < len(batch) {
			sz := proto.Size(batch[n]) + 8
			if n > 0 && size+sz > s.limit {
				break
			}
			size += sz
			n++
		}
		if err := s.stream.Send(&ProduceResponse{Answers: batch[:n]}); err != nil {
			return err
		}
		batch = batch[n:]
	}
	return nil
}
