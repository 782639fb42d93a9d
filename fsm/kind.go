package fsm

import (
	"strings"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// KindOf is what kind of failure f is: f.kind, which this binary's state
// machine sets on every failure it decides. An answer stored before
// FormatFailureKinds (replayed to a retry) or applied by an older binary
// has none: for those alone the kind is read from what such a binary wrote,
// the fields it set and the start of its message. This is the one place
// that reads a failure's message; nothing else decides by it.
func KindOf(f *fsmpb.Failure) fsmpb.Failure_Kind {
	if f == nil {
		return fsmpb.Failure_KIND_UNSPECIFIED
	}
	if f.Kind != fsmpb.Failure_KIND_UNSPECIFIED {
		return f.Kind
	}
	return legacyKind(f)
}

// legacyKind classifies an answer recorded without a kind. The prefixes are
// frozen: they are what released binaries wrote, whatever the messages say
// now.
func legacyKind(f *fsmpb.Failure) fsmpb.Failure_Kind {
	m := f.Message
	switch {
	case f.Moved != nil:
		return fsmpb.Failure_MOVED
	case len(f.Errors) > 0:
		return fsmpb.Failure_REFERENCES
	case m == "stale request sequence":
		return fsmpb.Failure_STALE_SEQUENCE
	case strings.HasPrefix(m, "memory budget reached"):
		return fsmpb.Failure_MEMORY_FULL
	case strings.HasPrefix(m, "out of scope"):
		return fsmpb.Failure_OUT_OF_SCOPE
	case strings.HasPrefix(m, "answer too large"):
		return fsmpb.Failure_ANSWER_TOO_LARGE
	case strings.HasPrefix(m, "schedule of another queue"):
		return fsmpb.Failure_SCHEDULE_ELSEWHERE
	case strings.HasPrefix(m, "OP_SLOT needs state format"):
		return fsmpb.Failure_SLOT_NEEDS_FORMAT
	case m == "OP_SLOT without a body", strings.HasPrefix(m, "OP_SLOT: unknown action"):
		return fsmpb.Failure_INVALID
	case strings.HasPrefix(m, "OP_SLOT"):
		return fsmpb.Failure_SLOT_REFUSED
	}
	return fsmpb.Failure_INVALID
}
