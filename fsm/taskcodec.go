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
