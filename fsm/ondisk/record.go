package ondisk

import (
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
)

// Task is a task's record as stored under TaskKey. The id is the key and
// the queue is its number (QueueRecord), so neither is repeated in the
// record: at 64-byte values they would be a third of it.
type Task struct {
	Queue    uint32
	Version  uint64
	At       int64
	Claimant string
	Priority int32
	Key      string
	Value    []byte
	Created  int64
	Modified int64
	Claims   uint32
	Attempt  uint32
	Err      string
	// Dedup is the key's reservation after the task's deletion
	// (fsm's Insert.dedup_window), in nanoseconds.
	Dedup int64
	// Headers are the task's string pairs (fsm's Insert.headers), each an
	// entry of field 14 in key order, as protobuf encodes a map.
	Headers map[string]string
}

// Field numbers of the record (protobuf wire format, so that fields can
// be added the way fsm.proto adds them).
const (
	fieldQueue    protowire.Number = 1
	fieldVersion  protowire.Number = 2
	fieldAt       protowire.Number = 3
	fieldClaimant protowire.Number = 4
	fieldPriority protowire.Number = 5
	fieldKey      protowire.Number = 6
	fieldValue    protowire.Number = 7
	fieldCreated  protowire.Number = 8
	fieldModified protowire.Number = 9
	fieldClaims   protowire.Number = 10
	fieldAttempt  protowire.Number = 11
	fieldErr      protowire.Number = 12
	fieldDedup    protowire.Number = 13
	fieldHeaders  protowire.Number = 14
)

// AppendTask appends t's record to b, fields in number order, zero values
// omitted: equal tasks encode to equal bytes on every replica.
func AppendTask(b []byte, t *Task) []byte {
	b = appendVarint(b, fieldQueue, uint64(t.Queue))
	b = appendVarint(b, fieldVersion, t.Version)
	b = appendVarint(b, fieldAt, protowire.EncodeZigZag(t.At))
	b = appendBytes(b, fieldClaimant, []byte(t.Claimant))
	b = appendVarint(b, fieldPriority, protowire.EncodeZigZag(int64(t.Priority)))
	b = appendBytes(b, fieldKey, []byte(t.Key))
	b = appendBytes(b, fieldValue, t.Value)
	b = appendVarint(b, fieldCreated, protowire.EncodeZigZag(t.Created))
	b = appendVarint(b, fieldModified, protowire.EncodeZigZag(t.Modified))
	b = appendVarint(b, fieldClaims, uint64(t.Claims))
	b = appendVarint(b, fieldAttempt, uint64(t.Attempt))
	b = appendBytes(b, fieldErr, []byte(t.Err))
	b = appendVarint(b, fieldDedup, protowire.EncodeZigZag(t.Dedup))
	return AppendStringMap(b, fieldHeaders, t.Headers)
}

// AppendStringMap appends m as the map<string, string> field num, entries
// in key order (protobuf's deterministic encoding: equal maps encode to
// equal bytes).
func AppendStringMap(b []byte, num protowire.Number, m map[string]string) []byte {
	if len(m) == 0 {
		return b
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := m[k]
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(1+protowire.SizeBytes(len(k))+1+protowire.SizeBytes(len(v))))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, k)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, v)
	}
	return b
}

// ConsumeStringMapEntry parses one map<string, string> entry into m
// (allocated when nil) and returns m.
func ConsumeStringMapEntry(m map[string]string, entry []byte) (map[string]string, error) {
	var k, v string
	for len(entry) > 0 {
		num, typ, n := protowire.ConsumeTag(entry)
		if n < 0 {
			return m, protowire.ParseError(n)
		}
		entry = entry[n:]
		if (num == 1 || num == 2) && typ == protowire.BytesType {
			s, n := protowire.ConsumeBytes(entry)
			if n < 0 {
				return m, protowire.ParseError(n)
			}
			entry = entry[n:]
			if num == 1 {
				k = string(s)
			} else {
				v = string(s)
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, entry)
		if n < 0 {
			return m, protowire.ParseError(n)
		}
		entry = entry[n:]
	}
	if m == nil {
		m = make(map[string]string)
	}
	m[k] = v
	return m, nil
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// DecodeTask parses a record. The value is copied: the engine's buffer is
// only valid until its next call. Unknown fields are skipped.
func DecodeTask(data []byte) (*Task, error) {
	t := &Task{}
	if err := decodeTaskInto(t, data, false); err != nil {
		return nil, err
	}
	return t, nil
}

// decodeTaskInto is DecodeTask into t; with alias, t.Value is data's bytes,
// not a copy (valid while data is).
func decodeTaskInto(t *Task, data []byte, alias bool) error {
	*t = Task{}
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		switch {
		case typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(data)
			if n < 0 {
				return protowire.ParseError(n)
			}
			data = data[n:]
			if err := t.setVarint(num, v); err != nil {
				return err
			}
		case typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(data)
			if n < 0 {
				return protowire.ParseError(n)
			}
			data = data[n:]
			if alias && num == fieldValue {
				t.Value = v
			} else if err := t.setBytes(num, v); err != nil {
				return err
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, data)
			if n < 0 {
				return protowire.ParseError(n)
			}
			data = data[n:]
		}
	}
	return nil
}

var errWireType = errors.New("ondisk: task record field has the wrong wire type")

func (t *Task) setVarint(num protowire.Number, v uint64) error {
	switch num {
	case fieldQueue:
		if v > 1<<32-1 {
			return fmt.Errorf("ondisk: queue number %d out of range", v)
		}
		t.Queue = uint32(v)
	case fieldVersion:
		t.Version = v
	case fieldAt:
		t.At = protowire.DecodeZigZag(v)
	case fieldPriority:
		p := protowire.DecodeZigZag(v)
		if p != int64(int32(p)) {
			return fmt.Errorf("ondisk: priority %d out of range", p)
		}
		t.Priority = int32(p)
	case fieldCreated:
		t.Created = protowire.DecodeZigZag(v)
	case fieldModified:
		t.Modified = protowire.DecodeZigZag(v)
	case fieldClaims:
		t.Claims = uint32(v)
	case fieldAttempt:
		t.Attempt = uint32(v)
	case fieldDedup:
		t.Dedup = protowire.DecodeZigZag(v)
	case fieldClaimant, fieldKey, fieldValue, fieldErr, fieldHeaders:
		return errWireType
	}
	return nil
}

func (t *Task) setBytes(num protowire.Number, v []byte) error {
	switch num {
	case fieldClaimant:
		t.Claimant = string(v)
	case fieldKey:
		t.Key = string(v)
	case fieldValue:
		t.Value = append([]byte(nil), v...)
	case fieldErr:
		t.Err = string(v)
	case fieldHeaders:
		m, err := ConsumeStringMapEntry(t.Headers, v)
		if err != nil {
			return err
		}
		t.Headers = m
	case fieldQueue, fieldVersion, fieldAt, fieldPriority, fieldCreated, fieldModified, fieldClaims, fieldAttempt, fieldDedup:
		return errWireType
	}
	return nil
}
