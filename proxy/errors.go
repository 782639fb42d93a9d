package proxy

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/client"
)

// toStatus turns an error of the client into the status the caller sees. It
// is the only place where the proxy chooses codes.
//
// Whatever a node answered comes back as the node said it: same code, same
// message, same details (a refused transaction's ModifyError, a NotLeader
// hint), so that a caller cannot tell the proxy from a node. The client's
// errors keep the node's status (GRPCStatus), also when they are wrapped in
// the error of a call that ran out of time, where the last attempt's status
// is the answer. Errors that no node gave map by kind. ctx is the caller's
// context: when it ended, the caller gets its own Canceled or
// DeadlineExceeded.
func (s *Server) toStatus(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	st := statusOf(err)
	switch st.Code() {
	case codes.FailedPrecondition, codes.InvalidArgument, codes.NotFound, codes.ResourceExhausted, codes.OutOfRange:
		s.log.Debug("request refused", "op", op, "code", st.Code(), "err", err)
	default:
		s.log.Warn("request failed", "op", op, "code", st.Code(), "err", err)
	}
	return st.Err()
}

func statusOf(err error) *status.Status {
	var gs interface{ GRPCStatus() *status.Status }
	if errors.As(err, &gs) {
		if st := gs.GRPCStatus(); st != nil {
			return st
		}
	}
	code := codes.Unavailable // out of time or connections: retry
	switch {
	case errors.Is(err, client.ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, client.ErrTooLarge):
		code = codes.ResourceExhausted
	case errors.Is(err, client.ErrRefused):
		code = codes.FailedPrecondition
	case errors.Is(err, client.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, client.ErrUnsupported):
		code = codes.Unimplemented
	}
	return status.New(code, err.Error())
}
