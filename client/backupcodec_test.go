package client

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// TestChunkCodec: the Backup stream's codec decodes a chunk as the proto
// codec does, its data aliasing the call's buffer, which the next chunk
// reuses; other messages go to the proto codec.
func TestChunkCodec(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	chunks := []*taskstorepb.BackupChunk{
		{Info: &taskstorepb.BackupInfo{Shard: 3, Index: 99, Tasks: 7, Node: "n2", ClusterId: "c"}, Data: []byte("first")},
		{Data: big},
		{Redirect: &taskstorepb.BackupRedirect{MinIndex: 12, Replicas: []*taskstorepb.Replica{{Id: "n1", Address: "a:1"}}}},
		{},
	}
	c := &chunkCodec{}
	for i, want := range chunks {
		enc, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			// An unknown field is skipped, as the generated code would.
			enc = protowire.AppendVarint(protowire.AppendTag(enc, 9, protowire.VarintType), 5)
		}
		got := &taskstorepb.BackupChunk{Data: []byte("stale")}
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(enc)}, got); err != nil {
			t.Fatal(err)
		}
		got.ProtoReflect().SetUnknown(nil)
		if !proto.Equal(got, want) {
			t.Errorf("chunk %d: got %v, want %v", i, got, want)
		}
		// A slice of the buffer ends where the buffer does.
		if len(want.Data) > 0 && &got.Data[:cap(got.Data)][cap(got.Data)-1] != &c.buf[:cap(c.buf)][cap(c.buf)-1] {
			t.Errorf("chunk %d: the data is a copy, not the call's buffer", i)
		}
	}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x12, 0x05, 'x'})}, &taskstorepb.BackupChunk{}); err == nil {
		t.Error("a truncated chunk decoded")
	}
	req := &taskstorepb.BackupRequest{Shard: 2, MinIndex: 5, Follow: true}
	enc, err := c.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var back taskstorepb.BackupRequest
	if err := c.Unmarshal(enc, &back); err != nil || !proto.Equal(&back, req) {
		t.Errorf("a request through the codec: %v, %v", &back, err)
	}
}
