package rpc

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/rpc/statuspage"
)

// PageActions are the status page's actions on srv: the
// node's own TaskStore calls, forwarded to the shard's leader when this
// node does not lead it, as Admin calls are (membership.go), so that an
// admin can act from any node's page. The page authorizes (admins only);
// a forwarded call goes with this node's identity.
func PageActions(srv *Server) statuspage.Actions { return pageActions{srv} }

type pageActions struct{ srv *Server }

func (a pageActions) PauseQueue(ctx context.Context, req *taskstorepb.QueuePauseRequest) (*taskstorepb.QueuePauseResponse, error) {
	return atLeader(ctx, a.srv, req, a.srv.PauseQueue, taskstorepb.TaskStoreClient.PauseQueue)
}

func (a pageActions) ResumeQueue(ctx context.Context, req *taskstorepb.QueuePauseRequest) (*taskstorepb.QueuePauseResponse, error) {
	return atLeader(ctx, a.srv, req, a.srv.ResumeQueue, taskstorepb.TaskStoreClient.ResumeQueue)
}

func (a pageActions) Purge(ctx context.Context, req *taskstorepb.PurgeRequest) (*taskstorepb.PurgeResponse, error) {
	return atLeader(ctx, a.srv, req, a.srv.Purge, taskstorepb.TaskStoreClient.Purge)
}

// Time is this node's clock: any node's serves a move's start.
func (a pageActions) Time(ctx context.Context, req *taskstorepb.TimeRequest) (*taskstorepb.TimeResponse, error) {
	return a.srv.Time(ctx, req)
}

func (a pageActions) Modify(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error) {
	return atLeader(ctx, a.srv, req, a.srv.Modify, taskstorepb.TaskStoreClient.Modify)
}

// atLeader runs a call on this node and, while it answers NotLeader (the
// call was not applied, so another try is safe), at the leader the answer
// names, or again after a pause while the shard elects one. Any other
// answer, an unknown outcome included, is returned as it is.
func atLeader[Req, Resp any](ctx context.Context, srv *Server, req Req,
	local func(context.Context, Req) (Resp, error),
	remote func(taskstorepb.TaskStoreClient, context.Context, Req, ...grpc.CallOption) (Resp, error)) (Resp, error) {
	resp, err := local(ctx, req)
	for {
		nl := notLeaderOf(err)
		if nl == nil {
			return resp, err
		}
		if addr := nl.GetLeaderAddress(); addr != "" && addr != srv.node.Addr() {
			if conn, cerr := srv.node.PeerConn(addr); cerr == nil {
				// Not the caller's principal: this node asks, as it does
				// for forwarded Admin calls.
				fctx := metadata.NewOutgoingContext(ctx, metadata.Pairs(forwardedKey, "1"))
				resp, err = remote(taskstorepb.NewTaskStoreClient(conn), fctx, req)
				if notLeaderOf(err) == nil {
					if err == nil {
						// The page reads this node's replica next: let it
						// show what was done (best effort, briefly).
						cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
						srv.node.CatchUp(cctx, nl.GetShard(), addr)
						cancel()
					}
					return resp, err
				}
			}
		}
		select {
		case <-ctx.Done():
			return resp, err
		case <-time.After(200 * time.Millisecond):
		}
		resp, err = local(ctx, req)
	}
}

// notLeaderOf returns the NotLeader detail of a refusal, nil for any other
// answer.
func notLeaderOf(err error) *taskstorepb.NotLeader {
	if err == nil {
		return nil
	}
	s, ok := status.FromError(err)
	if !ok {
		return nil
	}
	for _, d := range s.Details() {
		if nl, ok := d.(*taskstorepb.NotLeader); ok {
			return nl
		}
	}
	return nil
}
