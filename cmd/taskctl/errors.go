package main

import (
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/e1158ecb/taskstore/client"
)

// commandError is an error the cluster answered, said as the command's.
type commandError struct {
	msg string
	err error
}

func (e *commandError) Error() string { return e.msg }

// Unwrap keeps errors.Is (client.ErrInvalid, ...) and the gRPC status.
func (e *commandError) Unwrap() error { return e.err }

// apiError says an error the cluster answered about the request itself
// (bad input, not found, refused, over a limit) as "COMMAND: REASON"
// instead of the RPC's lowercase name and gRPC code ("putschedule:
// InvalidArgument: schedule: ..."). object is the request field the API's
// messages start with ("schedule" for "schedule: ..." and "schedule.name:
// ..."), dropped since the command names it. Other errors are returned as
// they are: an unavailable cluster's says what was tried, and printError
// adds its hints (permission, timeouts) to them either way.
func apiError(command, object string, err error) error {
	ce, ok := err.(*client.Error)
	if !ok {
		return err // not the cluster's own answer, or wrapped with more context
	}
	switch ce.Code() {
	case codes.InvalidArgument, codes.OutOfRange, codes.NotFound, codes.FailedPrecondition, codes.AlreadyExists, codes.ResourceExhausted:
	default:
		return err
	}
	msg := ce.Status.Message()
	if object != "" {
		if rest, ok := strings.CutPrefix(msg, object+": "); ok {
			msg = rest
		} else if rest, ok := strings.CutPrefix(msg, object+"."); ok {
			msg = rest
		}
	}
	return &commandError{msg: command + ": " + msg, err: err}
}
