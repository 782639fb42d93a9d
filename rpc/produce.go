package rpc

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/auth"
)

// modifyMethod is the method whose rules a Produce item is authorized by:
// an item is a Modify that shares its trip with others.
const modifyMethod = "/taskstore.v1.TaskStore/Modify"

// Produce implements TaskStore.Produce. Each item runs as a unary Modify
// would, in its own goroutine, so that items of one message reach the
// shard's proposer together and share its log entries; each is answered
// alone as it finishes. Answers that finish while a message is being sent
// go out together in the next one. The stream ends when the caller closes
// its side and every item it sent is answered.
func (srv *Server) Produce(stream taskstorepb.TaskStore_ProduceServer) error {
	ctx, cancelAll := context.WithCancel(stream.Context())
	defer cancelAll()
	p, authed := auth.FromContext(ctx)
	out := newAnswerSender(stream, srv.maxResponse)
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
		if err := taskstorepb.Undecoded(req); err != nil {
			return finish(err)
		}
		mu.Lock()
		for _, id := range req.Cancel {
			if cancel, ok := inflight[id]; ok {
				cancel()
			}
		}
		for _, it := range req.Items {
			if _, dup := inflight[it.Id]; dup {
				// Two items in flight under one id could not be told
				// apart by their answers.
				out.add(taskstorepb.FailedAnswer(it.Id, status.Errorf(codes.InvalidArgument, "item id %d is already in flight on this stream", it.Id)))
				continue
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
			go func() {
				defer wg.Done()
				a := srv.produceOne(ictx, p, authed, it)
				cancel()
				mu.Lock()
				delete(inflight, it.Id)
				mu.Unlock()
				out.add(a)
			}()
		}
		mu.Unlock()
	}
}

// produceOne applies one item as Modify would and answers it.
func (srv *Server) produceOne(ctx context.Context, p auth.Principal, authed bool, it *taskstorepb.ProduceItem) *taskstorepb.ProduceAnswer {
	if it.Modify == nil {
		return taskstorepb.FailedAnswer(it.Id, status.Error(codes.InvalidArgument, "modify: required"))
	}
	if it.Timeout != nil && !it.Timeout.IsValid() {
		return taskstorepb.FailedAnswer(it.Id, status.Errorf(codes.InvalidArgument, "timeout: %v", it.Timeout.CheckValid()))
	}
	if authed {
		// The stream was admitted by method; each item by the queues it
		// names, as a unary Modify is.
		if err := auth.Authorize(p, modifyMethod, it.Modify); err != nil {
			srv.log.Debug("produce item refused", "principal", p.Name, "err", err)
			return taskstorepb.FailedAnswer(it.Id, err)
		}
	}
	resp, err := srv.modify(ctx, it.Modify)
	if err != nil {
		return taskstorepb.FailedAnswer(it.Id, toStatus(err))
	}
	return &taskstorepb.ProduceAnswer{Id: it.Id, Modify: resp}
}

// answerSender sends a Produce stream's answers from one goroutine (a
// stream's Send is not safe for concurrent use): whatever was answered
// while the last message was being sent goes out in the next, up to the
// send limit per message.
type answerSender struct {
	stream taskstorepb.TaskStore_ProduceServer
	limit  int

	mu      sync.Mutex
	pending []*taskstorepb.ProduceAnswer
	closed  bool
	wake    chan struct{}
	done    chan struct{}
	err     error // the first failed Send; later answers are dropped
}

func newAnswerSender(stream taskstorepb.TaskStore_ProduceServer, limit int) *answerSender {
	return &answerSender{stream: stream, limit: limit, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

func (s *answerSender) add(a *taskstorepb.ProduceAnswer) {
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

// send sends batch in as few messages as the limit allows. Each answer
// fits alone (Server.fits), with the headroom the answer budget keeps.
func (s *answerSender) send(batch []*taskstorepb.ProduceAnswer) error {
	for len(batch) > 0 {
		n, size := 0, 0
		for n < len(batch) {
			sz := proto.Size(batch[n]) + 8
			if n > 0 && size+sz > s.limit-answerHeadroom {
				break
			}
			size += sz
			n++
		}
		if err := s.stream.Send(&taskstorepb.ProduceResponse{Answers: batch[:n]}); err != nil {
			return err
		}
		batch = batch[n:]
	}
	return nil
}
