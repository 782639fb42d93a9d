package rpc

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// invalidError is bad input found at the API edge: InvalidArgument.
type invalidError struct{ field, why string }

func (e *invalidError) Error() string { return e.field + ": " + e.why }

func invalid(field, format string, args ...any) error {
	return &invalidError{field: field, why: fmt.Sprintf(format, args...)}
}

// refusedError is a transaction or request the state machine refused:
// FailedPrecondition, with every offending reference as a ModifyError detail.
type refusedError struct {
	failure *fsmpb.Failure
	// deleted: the ids of INSERT_DUPLICATE_KEY holders that were deleted
	// within their key's dedup window (RefError.existing_deleted).
	deleted map[string]bool
}

// upgradingError refuses what a shard's state format does not take yet
// (needFormat). It maps to Unavailable, which clients retry: a new cluster
// raises its shards' format within a second or two of electing leaders, and
// a cluster mid-upgrade once its last node runs the new version.
type upgradingError struct {
	what       string
	shard      uint32
	have, need uint32
}

func (e *upgradingError) Error() string {
	return fmt.Sprintf("%s needs shard %d at state format %d, and it is at %d: not every replica's node runs a version that has it yet "+
		"(a new cluster gets there within seconds; a cluster being upgraded, once its last node is)", e.what, e.shard, e.need, e.have)
}

// movedError: a read of a group whose slot the shard does not serve now
// (being imported, or moved away). Unavailable: the client retries where
// its refreshed routing table says.
type movedError struct{ msg string }

func (e *movedError) Error() string { return e.msg }

func (e *refusedError) Error() string {
	if e.failure.Message != "" {
		return e.failure.Message
	}
	return fmt.Sprintf("transaction refused: %d offending reference(s)", len(e.failure.Errors))
}

// toStatus maps every error the node returns to a gRPC status. It is the
// only place where codes are chosen.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var (
		notLeader *cluster.NotLeaderError
		inv       *invalidError
		refused   *refusedError
		notFound  *cluster.NotFoundError
		upgrading *upgradingError
		moved     *movedError
	)
	switch {
	case errors.As(err, &notLeader):
		st := status.New(codes.Unavailable, err.Error())
		if d, derr := st.WithDetails(&taskstorepb.NotLeader{Shard: notLeader.Shard, LeaderId: leaderID(notLeader), LeaderAddress: notLeader.LeaderAddress}); derr == nil {
			st = d
		}
		return st.Err()
	case errors.As(err, &refused):
		return refusedStatus(refused)
	case errors.As(err, &upgrading), errors.As(err, &moved):
		return status.Error(codes.Unavailable, err.Error())
	case errors.As(err, &inv):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, fsm.ErrTooLarge):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, fsm.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, cluster.ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, cluster.ErrRefused):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, cluster.ErrUnknownOutcome):
		return status.Error(codes.Unavailable, err.Error()+"; retry with the same request id")
	case errors.Is(err, cluster.ErrNotReady), errors.Is(err, cluster.ErrShutdown), errors.Is(err, cluster.ErrNotLeader):
		return status.Error(codes.Unavailable, err.Error())
	case errors.As(err, &notFound), errors.Is(err, cluster.ErrUnknownShard):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// refusedStatus maps a failure the state machine decided by its kind
// (fsm.KindOf), never by its message.
func refusedStatus(e *refusedError) error {
	switch fsm.KindOf(e.failure) {
	case fsmpb.Failure_MEMORY_FULL:
		// The shard's tasks reached its memory budget: the producer
		// backs off until consumers make room (fsm/budget.go). The
		// detail tells clients so (ErrFull), not the message.
		return taskstorepb.MemoryFullStatus(e.Error()).Err()
	case fsmpb.Failure_ANSWER_TOO_LARGE:
		// The transaction's answer would be over the node's send limit:
		// split it.
		return status.Error(codes.ResourceExhausted, e.Error())
	case fsmpb.Failure_MOVED:
		// The group's slot moved or is moving: the shard that serves it
		// applies the retry (clients refresh their routing on Unavailable).
		return status.Error(codes.Unavailable, e.Error())
	case fsmpb.Failure_OUT_OF_SCOPE:
		// The request names a task outside the caller's queue prefixes.
		return status.Error(codes.PermissionDenied, e.Error())
	}
	st := status.New(codes.FailedPrecondition, e.Error())
	if len(e.failure.Errors) > 0 {
		if d, derr := st.WithDetails(modifyErrorToAPI(e.failure, e.deleted)); derr == nil {
			st = d
		}
	}
	return st.Err()
}

func modifyErrorToAPI(f *fsmpb.Failure, deleted map[string]bool) *taskstorepb.ModifyError {
	out := &taskstorepb.ModifyError{}
	for _, e := range f.Errors {
		re := &taskstorepb.RefError{
			Category:        taskstorepb.RefError_Category(e.Category),
			Id:              e.Id,
			Version:         e.Version,
			CurrentVersion:  e.CurrentVersion,
			Queue:           e.Queue,
			Key:             e.Key,
			Claimant:        e.Claimant,
			ExistingId:      e.ExistingId,
			ExistingDeleted: e.Category == fsmpb.RefError_INSERT_DUPLICATE_KEY && deleted[e.ExistingId],
		}
		if e.LeaseUntil != 0 {
			re.LeaseUntil = nanosToTimestamp(e.LeaseUntil)
		}
		out.Errors = append(out.Errors, re)
	}
	return out
}

func nanosToTimestamp(ns int64) *timestamppb.Timestamp {
	if ns == 0 {
		return nil
	}
	return timestamppb.New(timeFromNanos(ns))
}

// leaderID is the leader a NotLeader detail names: none when the node only
// pointed at a replica of a shard it does not host.
func leaderID(e *cluster.NotLeaderError) string {
	if e.Replica {
		return ""
	}
	return e.LeaderID
}
