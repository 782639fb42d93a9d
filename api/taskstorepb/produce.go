package taskstorepb

import (
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
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
