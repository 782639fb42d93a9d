package taskstorepb

import (
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo details a node
// puts on the errors whose code alone does not say what happened.
const ErrorDomain = "taskstore.v1"

// ReasonMemoryFull is the ErrorInfo reason of a ResourceExhausted refusal
// at a shard's memory budget (retry later), as against one over a size
// limit (never retried).
const ReasonMemoryFull = "MEMORY_FULL"

// MemoryFullStatus is the status of a refusal at a shard's memory budget.
func MemoryFullStatus(msg string) *status.Status {
	st := status.New(codes.ResourceExhausted, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonMemoryFull, Domain: ErrorDomain}); err == nil {
		st = d
	}
	return st
}

// IsMemoryFull reports a refusal at a shard's memory budget, by its
// ErrorInfo detail.
func IsMemoryFull(st *status.Status) bool {
	if st.Code() != codes.ResourceExhausted {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == ErrorDomain && info.Reason == ReasonMemoryFull {
			return true
		}
	}
	return legacyMemoryFull(st)
}

// legacyMemoryFull reads a refusal from a node that put no detail on it
// (released before the detail): those said so only in the message, whose
// start is frozen here. The one place a client reads a message.
func legacyMemoryFull(st *status.Status) bool {
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.ErrorInfo); ok {
			return false // a node with details: it said what it was
		}
	}
	return strings.HasPrefix(st.Message(), "memory budget reached")
}
