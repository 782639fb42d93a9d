package client

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestAnswerOverReceiveLimitIsUnknownOutcome: gRPC's ResourceExhausted for
// an answer over the receive limit comes after the request was sent, so it
// must not read as "over a limit, not applied", and it is not retried (the
// same request id gets the same answer). A request over the send limit
// stays ErrTooLarge.
func TestAnswerOverReceiveLimitIsUnknownOutcome(t *testing.T) {
	ctx := context.Background()
	recv := decode("Claim", "n1:1", status.Error(codes.ResourceExhausted, "grpc: received message larger than max (5243520 vs. 4194304)"))
	var big *AnswerTooLargeError
	if !errors.As(recv, &big) || !errors.Is(recv, ErrUnavailable) || errors.Is(recv, ErrTooLarge) {
		t.Fatalf("receive limit: %v (%T)", recv, recv)
	}
	if retryable(ctx, recv) {
		t.Error("receive limit: retried")
	}
	if status.Code(recv) != codes.Unavailable {
		t.Errorf("receive limit: a proxy would pass on %v", status.Code(recv))
	}
	send := decode("Modify", "n1:1", status.Error(codes.ResourceExhausted, "grpc: trying to send message larger than max (9000000 vs. 8388608)"))
	if !errors.Is(send, ErrTooLarge) || errors.Is(send, ErrUnavailable) {
		t.Fatalf("send limit: %v", send)
	}
}
