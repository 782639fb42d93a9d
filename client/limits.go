package client

import (
	"google.golang.org/grpc"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// limitDialOptions make a connection agree with the servers' message size
// limits (limits.Server): a request over taskstorepb.MaxMessageBytes fails here
// with ResourceExhausted (ErrTooLarge) without being sent, and answers up to
// taskstorepb.MaxResponseBytes are accepted (gRPC's default is 4 MiB).
func limitDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithDefaultCallOptions(
		grpc.MaxCallSendMsgSize(taskstorepb.MaxMessageBytes),
		grpc.MaxCallRecvMsgSize(taskstorepb.MaxResponseBytes),
	)}
}
