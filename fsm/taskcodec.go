package fsm

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/e1158ecb/taskstore/fsm/ondisk"
)

// Snapshots hold a million task records; encoding them through the
// generated code costs seconds. These functions write and read the Task
// message of fsm.proto by hand. TestTaskCodecMatchesProto checks that they
// agree with the generated code byte for byte.

// Field numbers of SnapshotRecord.task and of Task in fsm.proto.
const (
	recordTaskField protowire.Number = 2

	taskID       protowire.Number = 1
	taskVersion  protowire.Number = 2
	taskQueue    protowire.Number = 3
	taskAt       protowire.Number = 4
	taskClaimant protowire.Number = 5
	taskPriority protowire.Number = 6
	taskKey      protowire.Number = 7
	taskValue    protowire.Number = 8
	taskCreated  protowire.Number = 9
	taskModified protowire.Number = 10
	taskClaims   protowire.Number = 11
	taskAttempt  protowire.Number = 12
	taskErr      protowire.Number = 13
	taskDedup    protowire.Number = 14
	taskHeaders  protowire.Number = 15
)

// appendTask appends t as a Task message, fields in number order, zero
// values omitted (the canonical proto3 encoding).
func appendTask(b []byte, t *task) []byte {
	b = appendString(b, taskID, t.id)
	b = appendVarint(b, taskVersion, t.version)
	b = appendString(b, taskQueue, t.q.name)
	b = appendVarint(b, taskAt, uint64(t.at))
	b = appendString(b, taskClaimant, t.claimant)
	b = appendVarint(b, taskPriority, uint64(int64(t.priority)))
	b = appendString(b, taskKey, t.key)
	if len(t.value) > 0 {
		b = protowire.AppendTag(b, taskValue, protowire.BytesType)
		b = protowire.AppendBytes(b, t.value)
	}
	b = appendVarint(b, taskCreated, uint64(t.created))
	b = appendVarint(b, taskModified, uint64(t.modified))
	b = appendVarint(b, taskClaims, uint64(t.claims))
	b = appendVarint(b, taskAttempt, uint64(t.attempt))
	b = appendString(b, taskErr, t.err)
	b = appendVarint(b, taskDedup, uint64(t.dedupWindow()))
	return ondisk.AppendStringMap(b, taskHeaders, t.headers())
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// decodeTask parses a Task message. The queue name is returned as bytes
// (aliasing data) so that the caller can find the queue without
// allocating. Unknown fields are skipped, as the generated code would.
func decodeTask(data []byte) (*task, []byte, error) {
	t := &task{}
	var queue []byte
	var dedup int64
	var headers map[string]string
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return nil, nil, protowire.ParseError(n)
		}
		data = data[n:]
		switch num {
		case taskID, taskQueue, taskClaimant, taskKey, taskValue, taskErr, taskHeaders:
			if typ != protowire.BytesType {
				return nil, nil, fmt.Errorf("task field %d has wire type %d", num, typ)
			}
			v, n := protowire.ConsumeBytes(data)
			if n < 0 {
				return nil, nil, protowire.ParseError(n)
			}
			data = data[n:]
			switch num {
			case taskID:
				t.id = string(v)
			case taskQueue:
				queue = v
			case taskClaimant:
				t.claimant = string(v)
			case taskKey:
				t.key = string(v)
			case taskValue:
				t.value = append([]byte(nil), v...)
			case taskErr:
				t.err = string(v)
			case taskHeaders:
				var err error
				if headers, err = ondisk.ConsumeStringMapEntry(headers, v); err != nil {
					return nil, nil, err
				}
			}
		case taskVersion, taskAt, taskPriority, taskCreated, taskModified, taskClaims, taskAttempt, taskDedup:
			if typ != protowire.VarintType {
				return nil, nil, fmt.Errorf("task field %d has wire type %d", num, typ)
			}
			v, n := protowire.ConsumeVarint(data)
			if n < 0 {
				return nil, nil, protowire.ParseError(n)
			}
			data = data[n:]
			switch num {
			case taskVersion:
				t.version = v
			case taskAt:
				t.at = int64(v)
			case taskPriority:
				t.priority = int32(v)
			case taskCreated:
				t.created = int64(v)
			case taskModified:
				t.modified = int64(v)
			case taskClaims:
				t.claims = uint32(v)
			case taskAttempt:
				t.attempt = uint32(v)
			case taskDedup:
				dedup = int64(v)
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, data)
			if n < 0 {
				return nil, nil, protowire.ParseError(n)
			}
			data = data[n:]
		}
	}
	t.ext = newTaskExt(dedup, headers)
	return t, queue, nil
}

// Field numbers of the on-disk store's task record (ondisk.AppendTask),
// which appendTaskRecord renumbers into a Task message.
// TestAppendTaskRecord checks them against decoding and re-encoding.
const (
	diskQueue    protowire.Number = 1
	diskVersion  protowire.Number = 2
	diskAt       protowire.Number = 3
	diskClaimant protowire.Number = 4
	diskPriority protowire.Number = 5
	diskKey      protowire.Number = 6
	diskValue    protowire.Number = 7
	diskCreated  protowire.Number = 8
	diskModified protowire.Number = 9
	diskClaims   protowire.Number = 10
	diskAttempt  protowire.Number = 11
	diskErr      protowire.Number = 12
	diskDedup    protowire.Number = 13
)

// recordQueue is the queue number of a stored task record: its first
// field (0 when it has none).
func recordQueue(rec []byte) uint32 {
	num, typ, n := protowire.ConsumeTag(rec)
	if n < 0 || num != diskQueue || typ != protowire.VarintType {
		return 0
	}
	v, m := protowire.ConsumeVarint(rec[n:])
	if m < 0 || v > 1<<32-1 {
		return 0
	}
	return uint32(v)
}

// appendTaskRecord appends to b the Task message of the task id of queue
// stored as rec (ondisk.AppendTask's record): the bytes appendTask writes
// for the task that rec decodes to, made from rec's fields as they are
// (renumbered, the zigzag ones re-encoded, the strings and value copied)
// instead of a decode into a task and an encode of it. ok is false, and b
// as it was, for a record it does not take (headers, a field it does not
// know, fields out of order, a damaged encoding): decode that one.
func appendTaskRecord(b, id []byte, queue string, rec []byte) (_ []byte, ok bool) {
	start := len(b)
	b = appendBytesField(b, taskID, id)
	var last protowire.Number
	queued := false
	for len(rec) > 0 {
		num, typ, n := protowire.ConsumeTag(rec)
		if n < 0 || num <= last {
			return b[:start], false
		}
		last, rec = num, rec[n:]
		if num > diskVersion && !queued {
			b, queued = appendString(b, taskQueue, queue), true
		}
		switch num {
		case diskQueue, diskVersion, diskAt, diskPriority, diskCreated, diskModified, diskClaims, diskAttempt, diskDedup:
			if typ != protowire.VarintType {
				return b[:start], false
			}
			v, n := protowire.ConsumeVarint(rec)
			if n < 0 {
				return b[:start], false
			}
			rec = rec[n:]
			switch num {
			case diskVersion:
				b = appendVarint(b, taskVersion, v)
			case diskAt, diskCreated, diskModified, diskDedup:
				b = appendVarint(b, num+1, uint64(protowire.DecodeZigZag(v)))
			case diskPriority:
				p := protowire.DecodeZigZag(v)
				if p != int64(int32(p)) {
					return b[:start], false
				}
				b = appendVarint(b, taskPriority, uint64(p))
			case diskClaims, diskAttempt:
				b = appendVarint(b, num+1, uint64(uint32(v)))
			}
		case diskClaimant, diskKey, diskValue, diskErr:
			if typ != protowire.BytesType {
				return b[:start], false
			}
			v, n := protowire.ConsumeBytes(rec)
			if n < 0 {
				return b[:start], false
			}
			rec = rec[n:]
			b = appendBytesField(b, num+1, v)
		default:
			return b[:start], false
		}
	}
	if !queued {
		b = appendString(b, taskQueue, queue)
	}
	return b, true
}

// appendBytesField is appendString of bytes.
func appendBytesField(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}
