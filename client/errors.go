package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// Sentinel errors. Every error a Client returns matches at most one of them
// with errors.Is; the typed errors below match them too, so callers branch on
// kinds, never on message text.
var (
	// ErrRefused: the cluster refused a transaction or claim and changed
	// nothing (gRPC FailedPrecondition). When the refusal names offending
	// references the error is a *DependencyError.
	ErrRefused = errors.New("taskstore: refused")
	// ErrInvalid: the request is malformed (gRPC InvalidArgument), for
	// example it spans consistency groups. Never retried.
	ErrInvalid = errors.New("taskstore: invalid request")
	// ErrTooLarge: the request or a value is over a limit (gRPC
	// ResourceExhausted); it was not applied. Never retried. (An answer
	// over the receive limit is not this: see AnswerTooLargeError.)
	ErrTooLarge = errors.New("taskstore: over a limit")
	// ErrFull: the shard's tasks reached its memory budget (gRPC
	// ResourceExhausted with the ErrorInfo reason MEMORY_FULL: nodes keeping
	// their tasks in memory under a --memory-limit); nothing was applied.
	// Claims, commits, deletes and purges still work. Not retried here:
	// retry later, once consumers have made room (with the same request id
	// if need be: a refusal is not remembered), or slow the producer down.
	ErrFull = errors.New("taskstore: memory budget full")
	// ErrNotFound: the task, shard or node does not exist (gRPC NotFound, or
	// Get finding no task with the id).
	ErrNotFound = errors.New("taskstore: not found")
	// ErrUnavailable: the cluster could not serve the request before the
	// context ended (no leader, no quorum, unreachable nodes). The outcome of
	// a Modify or Claim that fails with it is unknown; the returned error
	// also matches the context's error.
	ErrUnavailable = errors.New("taskstore: unavailable")
	// ErrUnsupported: the cluster does not implement the operation (gRPC
	// Unimplemented).
	ErrUnsupported = errors.New("taskstore: not supported")
	// ErrPermission: the cluster does not know the caller (gRPC
	// Unauthenticated: no or unknown certificate or token) or does not let
	// it do this (PermissionDenied: role or queue prefix). Never retried.
	ErrPermission = errors.New("taskstore: permission denied")
	// ErrAmbiguous: a task named by id alone (no queue) was found in more
	// than one consistency group; ids are unique within a group only. The
	// error is an *AmbiguousIDError listing them. Name the queue.
	ErrAmbiguous = errors.New("taskstore: ambiguous task id")
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("taskstore: client closed")
)

// AmbiguousIDError is a lookup by id alone that found tasks of several
// consistency groups with that id. Nothing was changed.
type AmbiguousIDError struct {
	ID    string
	Tasks []*taskstorepb.Task // one per group, sorted by queue
}

func (e *AmbiguousIDError) Error() string {
	var where []string
	for _, t := range e.Tasks {
		where = append(where, fmt.Sprintf("queue %s (version %d)", t.Queue, t.Version))
	}
	return fmt.Sprintf("task %q is in %d consistency groups: %s; ids are unique within a group only, so name the task's queue",
		e.ID, len(e.Tasks), strings.Join(where, ", "))
}

// Unwrap makes errors.Is(err, ErrAmbiguous) true.
func (e *AmbiguousIDError) Unwrap() error { return ErrAmbiguous }

// Error is a call the cluster answered with an error status that has no more
// specific type here. It keeps the gRPC status: status.Code(err) works, and
// errors.Is matches the sentinel of its code.
type Error struct {
	// Op is the RPC, e.g. "Modify".
	Op string
	// Addr is the address that answered, when known.
	Addr   string
	Status *status.Status
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s: %s", strings.ToLower(e.Op), e.Status.Code(), e.Status.Message())
}

// Code is the gRPC code the cluster answered with.
func (e *Error) Code() codes.Code { return e.Status.Code() }

// GRPCStatus lets status.FromError and status.Code see the original status.
func (e *Error) GRPCStatus() *status.Status { return e.Status }

// Is matches the sentinel error of the status code (ErrFull for a
// ResourceExhausted refusal at the memory budget).
func (e *Error) Is(target error) bool {
	if taskstorepb.IsMemoryFull(e.Status) {
		return target == ErrFull
	}
	return sentinelOf(e.Status.Code()) == target
}

func sentinelOf(c codes.Code) error {
	switch c {
	case codes.FailedPrecondition:
		return ErrRefused
	case codes.InvalidArgument, codes.OutOfRange:
		return ErrInvalid
	case codes.ResourceExhausted:
		return ErrTooLarge
	case codes.NotFound:
		return ErrNotFound
	case codes.Unavailable:
		return ErrUnavailable
	case codes.Unimplemented:
		return ErrUnsupported
	case codes.PermissionDenied, codes.Unauthenticated:
		return ErrPermission
	}
	return nil
}

// DependencyError is a refused transaction (FailedPrecondition with a
// ModifyError detail). It lists every offending reference; nothing changed.
// It matches ErrRefused.
//
//	var dep *client.DependencyError
//	if errors.As(err, &dep) { for _, r := range dep.Stale() { ... } }
type DependencyError struct {
	// Errors holds every offending reference, in the order the cluster gave.
	Errors  []*taskstorepb.RefError
	Message string
	status  *status.Status
}

func (e *DependencyError) Error() string {
	var b strings.Builder
	b.WriteString("transaction refused")
	for i, r := range e.Errors {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(DescribeRefError(r))
	}
	return b.String()
}

// Is matches ErrRefused.
func (e *DependencyError) Is(target error) bool { return target == ErrRefused }

// GRPCStatus returns the status the cluster answered with.
func (e *DependencyError) GRPCStatus() *status.Status {
	if e.status == nil {
		return status.New(codes.FailedPrecondition, e.Error())
	}
	return e.status
}

func (e *DependencyError) filter(cats ...taskstorepb.RefError_Category) []*taskstorepb.RefError {
	var out []*taskstorepb.RefError
	for _, r := range e.Errors {
		for _, c := range cats {
			if r.Category == c {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// Missing returns the references to tasks that do not exist (changes,
// deletes and depends).
func (e *DependencyError) Missing() []*taskstorepb.RefError {
	return e.filter(taskstorepb.RefError_CHANGE_MISSING, taskstorepb.RefError_DELETE_MISSING, taskstorepb.RefError_DEPEND_MISSING)
}

// Stale returns the references that named an old version of a task.
func (e *DependencyError) Stale() []*taskstorepb.RefError {
	return e.filter(taskstorepb.RefError_CHANGE_STALE, taskstorepb.RefError_DELETE_STALE, taskstorepb.RefError_DEPEND_STALE)
}

// Claimed returns the references to tasks another claimant holds under an
// unexpired lease.
func (e *DependencyError) Claimed() []*taskstorepb.RefError {
	return e.filter(taskstorepb.RefError_CLAIMED)
}

// Duplicates returns the inserts whose id or key already exists.
func (e *DependencyError) Duplicates() []*taskstorepb.RefError {
	return e.filter(taskstorepb.RefError_INSERT_DUPLICATE_ID, taskstorepb.RefError_INSERT_DUPLICATE_KEY)
}

// DescribeRefError renders one offending reference for people, e.g.
// "stale delete of t1 v3 (current v4)".
func DescribeRefError(r *taskstorepb.RefError) string {
	ref := r.Id
	if r.Version != 0 {
		ref += fmt.Sprintf(" v%d", r.Version)
	}
	if r.Queue != "" {
		ref += " in " + r.Queue
	}
	switch r.Category {
	case taskstorepb.RefError_CHANGE_MISSING:
		return "change of missing task " + ref
	case taskstorepb.RefError_DELETE_MISSING:
		return "delete of missing task " + ref
	case taskstorepb.RefError_DEPEND_MISSING:
		return "dependency on missing task " + ref
	case taskstorepb.RefError_CHANGE_STALE:
		return fmt.Sprintf("stale change of %s (current v%d)", ref, r.CurrentVersion)
	case taskstorepb.RefError_DELETE_STALE:
		return fmt.Sprintf("stale delete of %s (current v%d)", ref, r.CurrentVersion)
	case taskstorepb.RefError_DEPEND_STALE:
		return fmt.Sprintf("stale dependency on %s (current v%d)", ref, r.CurrentVersion)
	case taskstorepb.RefError_INSERT_DUPLICATE_ID:
		// r.Queue is the insert's queue; the task holding the id may be
		// in another queue of the group.
		return "insert of existing id " + ref + " (its consistency group already holds a task with that id)"
	case taskstorepb.RefError_INSERT_DUPLICATE_KEY:
		s := fmt.Sprintf("insert with existing key %q", r.Key)
		if r.Queue != "" {
			s += " in " + r.Queue
		}
		if r.ExistingId != "" {
			s += " (held by " + r.ExistingId + ")"
		}
		return s
	case taskstorepb.RefError_CLAIMED:
		s := ref + " is claimed by " + r.Claimant
		if r.LeaseUntil != nil {
			s += " until " + r.LeaseUntil.AsTime().Format(time.RFC3339)
		}
		return s
	}
	return fmt.Sprintf("%s: %s", r.Category, ref)
}

// NotLeaderError: the node that answered does not lead the shard that owns
// the request. The Client follows these hints itself; callers see one only
// when the context ends while the leader is still unknown, or through a
// proxy. It matches ErrUnavailable.
type NotLeaderError struct {
	Shard         uint32
	LeaderID      string
	LeaderAddress string
	// Addr is the node that answered.
	Addr   string
	status *status.Status
}

func (e *NotLeaderError) Error() string {
	if e.LeaderAddress == "" {
		return fmt.Sprintf("shard %d: %s is not the leader, leader unknown", e.Shard, e.Addr)
	}
	if e.LeaderID == "" {
		// The node pointed at a replica that knows the leader.
		return fmt.Sprintf("shard %d: %s is not the leader; ask %s, which knows the leader", e.Shard, e.Addr, e.LeaderAddress)
	}
	return fmt.Sprintf("shard %d: %s is not the leader, leader is %s at %s", e.Shard, e.Addr, e.LeaderID, e.LeaderAddress)
}

// Is matches ErrUnavailable.
func (e *NotLeaderError) Is(target error) bool { return target == ErrUnavailable }

// GRPCStatus returns the status the node answered with.
func (e *NotLeaderError) GRPCStatus() *status.Status {
	if e.status == nil {
		return status.New(codes.Unavailable, e.Error())
	}
	return e.status
}

// AnswerTooLargeError: the answer was over this connection's receive limit
// (gRPC answers ResourceExhausted "received message larger than max"). The
// request reached the cluster and may have been applied, so this is not
// ErrTooLarge ("over a limit, not applied"): it matches ErrUnavailable, the
// outcome is unknown. It is not retried, since a repeat of the request (same
// request id) gets the same answer. The Client's own connections accept
// every answer a node sends (taskstorepb.MaxResponseBytes); this happens
// when WithDialOptions lowers the limit, or a node sends more than it.
type AnswerTooLargeError struct {
	Op, Addr string
	// Message is gRPC's, with both sizes.
	Message string
}

func (e *AnswerTooLargeError) Error() string {
	return fmt.Sprintf("%s: the answer from %s is over the receive limit, the request may have been applied: %s", strings.ToLower(e.Op), e.Addr, e.Message)
}

// Is matches ErrUnavailable (outcome unknown).
func (e *AnswerTooLargeError) Is(target error) bool { return target == ErrUnavailable }

// GRPCStatus is Unavailable: a proxy passes it on as "outcome unknown".
func (e *AnswerTooLargeError) GRPCStatus() *status.Status {
	return status.New(codes.Unavailable, e.Error())
}

// tooLargeToReceive reports gRPC's own error for an answer over the
// receive limit (grpc-go: "grpc: received message larger than max (N vs.
// M)", and the variants after decompression). Only the receiving side
// produces these, after the request was sent; a request over the send limit
// is "trying to send message larger than max", which stays ErrTooLarge.
func tooLargeToReceive(st *status.Status) bool {
	if st.Code() != codes.ResourceExhausted {
		return false
	}
	m := st.Message()
	return strings.Contains(m, "received message larger than max") || strings.Contains(m, "after decompression larger than max")
}

// decode turns an error from a gRPC call into the Client's error types. It is
// the only place where codes and details are read.
func decode(op, addr string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if tooLargeToReceive(st) {
		return &AnswerTooLargeError{Op: op, Addr: addr, Message: st.Message()}
	}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *taskstorepb.NotLeader:
			if st.Code() == codes.Unavailable {
				return &NotLeaderError{Shard: d.Shard, LeaderID: d.LeaderId, LeaderAddress: d.LeaderAddress, Addr: addr, status: st}
			}
		case *taskstorepb.ModifyError:
			if st.Code() == codes.FailedPrecondition {
				return &DependencyError{Errors: d.Errors, Message: st.Message(), status: st}
			}
		}
	}
	return &Error{Op: op, Addr: addr, Status: st}
}

// tlsRefusals are what a TLS handshake says when one side will never
// accept the other's credentials: retrying until the deadline only hides
// the reason behind "did not answer in time".
var tlsRefusals = []string{
	"tls: certificate required",
	"tls: bad certificate",
	"tls: unknown certificate authority",
	"certificate signed by unknown authority",
	"x509: certificate is valid for",
	"tls: first record does not look like a TLS handshake",
}

// tlsRefused reports a connection refused at its TLS handshake for its
// credentials.
func tlsRefused(err error) bool {
	if status.Code(err) != codes.Unavailable {
		return false
	}
	msg := status.Convert(err).Message()
	for _, r := range tlsRefusals {
		if strings.Contains(msg, r) {
			return true
		}
	}
	return false
}

// retryable reports whether a decoded error may be retried: the request
// was not applied, or it carries a request id that makes a repeat harmless.
// ctx is the caller's context: a deadline of the caller is final, one of a
// single attempt is not.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var big *AnswerTooLargeError
	if errors.As(err, &big) {
		return false // a repeat gets the same answer
	}
	var nl *NotLeaderError
	if errors.As(err, &nl) {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true // the attempt's own timeout
	}
	if tlsRefused(err) {
		return false // the same credentials get the same answer
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		return true
	case codes.Canceled:
		// The caller's context is alive, so the cancellation came from an
		// attempt being cut short (connection closing): retry.
		return true
	}
	return false
}
