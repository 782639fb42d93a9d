package client

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// TestMemoryBudgetRefusalIsErrFull: a refusal at the memory budget matches
// ErrFull only (a producer retries it later), other ResourceExhausted
// answers ErrTooLarge only, and neither is retried by the client.
func TestMemoryBudgetRefusalIsErrFull(t *testing.T) {
	full := &Error{Op: "Modify", Status: taskstorepb.MemoryFullStatus("the shard is full, in any words")}
	// A node released before the detail said so in the message alone.
	old := &Error{Op: "Modify", Status: status.New(codes.ResourceExhausted,
		"memory budget reached: the shard's tasks take 53.2 MiB of the 53.3 MiB this shard may hold in memory")}
	for _, full := range []*Error{full, old} {
		if !errors.Is(full, ErrFull) || errors.Is(full, ErrTooLarge) {
			t.Errorf("%v: Is(ErrFull) %v, Is(ErrTooLarge) %v; want true, false", full, errors.Is(full, ErrFull), errors.Is(full, ErrTooLarge))
		}
	}
	// A node with details decides by them, not by the message.
	st, _ := status.New(codes.ResourceExhausted, "memory budget reached, says the message").WithDetails(&errdetails.ErrorInfo{Reason: "OTHER", Domain: taskstorepb.ErrorDomain})
	if other := (&Error{Op: "Modify", Status: st}); errors.Is(other, ErrFull) {
		t.Errorf("%v with reason OTHER is ErrFull", other)
	}
	big := &Error{Op: "Modify", Status: status.New(codes.ResourceExhausted, "inserts[0].value: 2000000 bytes, over the limit of 1048576")}
	if errors.Is(big, ErrFull) || !errors.Is(big, ErrTooLarge) {
		t.Errorf("%v: Is(ErrFull) %v, Is(ErrTooLarge) %v; want false, true", big, errors.Is(big, ErrFull), errors.Is(big, ErrTooLarge))
	}
	for _, err := range []error{full, big} {
		if retryable(context.Background(), err) {
			t.Errorf("%v is retried", err)
		}
	}
}
