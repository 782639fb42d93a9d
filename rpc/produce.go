package rpc

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/auth"
)

// modifyMethod is the method whose rules a Produce item is authorized by:
// an item is a Modify that shares its trip with others.
const modifyMethod = "/taskstore.v1.TaskStore/Modify"

// Produce implements TaskStore.Produce: each item runs as a unary Modify
// would (taskstorepb.ServeProduce), so that items of one message reach the
// shard's proposer together and share its log entries. The items in flight
// are bounded (SetProduceInflight): at the bound the stream is read no
// further until one is answered.
func (srv *Server) Produce(stream taskstorepb.TaskStore_ProduceServer) error {
	p, authed := auth.FromContext(stream.Context())
	return taskstorepb.ServeProduceBounded(stream, srv.maxResponse-answerHeadroom, srv.produce, func(ctx context.Context, it *taskstorepb.ProduceItem) *taskstorepb.ProduceAnswer {
		return srv.produceOne(ctx, p, authed, it)
	})
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
