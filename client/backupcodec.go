package client

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// chunkCodec decodes a Backup stream's chunks into one buffer of the
// call's, each chunk's data aliasing it: the generated code copies every
// chunk's data (a MiB) into a new slice, which was the largest share of
// taskctl's CPU per MB of backup (page faults of fresh memory, and the
// garbage). A chunk's Data is therefore valid only until the stream's next
// Recv: copyBackup writes it to its io.Writer (which must not retain it)
// before. Anything else is the proto codec's.
type chunkCodec struct {
	buf []byte
}

// backupCallOptions are the options of one Backup call: a codec of its
// own, except in a proxy, whose relay hands each chunk's data on to a
// gRPC Send (which may use the message after it returns).
func (c *Client) backupCallOptions() []grpc.CallOption {
	if c.opts.proxyOnly {
		return nil
	}
	return []grpc.CallOption{grpc.ForceCodecV2(&chunkCodec{})}
}

func protoCodec() encoding.CodecV2 { return encoding.GetCodecV2("proto") }

func (*chunkCodec) Name() string { return "proto" }

func (*chunkCodec) Marshal(v any) (mem.BufferSlice, error) { return protoCodec().Marshal(v) }

func (c *chunkCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*taskstorepb.BackupChunk)
	if !ok {
		return protoCodec().Unmarshal(data, v)
	}
	n := data.Len()
	if cap(c.buf) < n {
		c.buf = make([]byte, n)
	}
	b := c.buf[:n]
	data.CopyTo(b)
	return unmarshalChunk(b, m)
}

// unmarshalChunk is proto.Unmarshal of a BackupChunk whose data aliases b.
func unmarshalChunk(b []byte, m *taskstorepb.BackupChunk) error {
	m.Reset()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("backup chunk: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.BytesType || num < 1 || num > 3 {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("backup chunk: %w", protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return fmt.Errorf("backup chunk: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var err error
		switch num {
		case 1:
			if m.Info == nil {
				m.Info = &taskstorepb.BackupInfo{}
			}
			err = proto.UnmarshalOptions{Merge: true}.Unmarshal(v, m.Info)
		case 2:
			m.Data = v
		case 3:
			if m.Redirect == nil {
				m.Redirect = &taskstorepb.BackupRedirect{}
			}
			err = proto.UnmarshalOptions{Merge: true}.Unmarshal(v, m.Redirect)
		}
		if err != nil {
			return fmt.Errorf("backup chunk: %w", err)
		}
	}
	return nil
}
